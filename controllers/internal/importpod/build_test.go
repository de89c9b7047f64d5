package importpod

import (
	"maps"
	"testing"

	"github.com/diskpipe/diskpipe/internal/contract"
)

// TestNoSidecars: every transfer pod (an importer, a clone source, an exporter) tells the
// service meshes not to inject a sidecar, which would keep it from ending, and gets neither a
// service account token nor the namespace's Services in its environment.
func TestNoSidecars(t *testing.T) {
	for name, s := range map[string]Spec{
		"importer":     {Name: "i", Namespace: "ns", PVC: "disk"},
		"clone source": {Name: "c", Namespace: "ns", SourcePVC: "golden", ServePort: ServePort},
		"exporter":     {Name: "e", Namespace: "ns", SourcePVC: "disk", Command: "/exporter", Export: &contract.Export{}},
	} {
		pod := Build(Config{}, s)
		if !maps.Equal(pod.Annotations, NoSidecars) {
			t.Errorf("%s: annotations %v, want %v", name, pod.Annotations, NoSidecars)
		}
		if l, a := pod.Spec.EnableServiceLinks, pod.Spec.AutomountServiceAccountToken; l == nil || *l || a == nil || *a {
			t.Errorf("%s: enableServiceLinks %v, automountServiceAccountToken %v, want both false", name, l, a)
		}
	}
}
