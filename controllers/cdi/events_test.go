package cdi

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
)

// TestPhaseEvent: the events of a DataVolume's phases are CDI's, reason and words.
func TestPhaseEvent(t *testing.T) {
	meta := metav1.ObjectMeta{Name: "root", Namespace: "vms"}
	imp := &cdiv1.DataVolume{ObjectMeta: meta, Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{}}}}
	up := &cdiv1.DataVolume{ObjectMeta: meta, Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Upload: &cdiv1.DataVolumeSourceUpload{}}}}
	pvc := &cdiv1.DataVolume{ObjectMeta: meta, Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "golden", Name: "fedora"}}}}
	ref := &cdiv1.DataVolume{ObjectMeta: meta, Spec: cdiv1.DataVolumeSpec{SourceRef: &cdiv1.DataVolumeSourceRef{Kind: "DataSource", Name: "fedora", Namespace: ptr.To("os-images")}}}
	for _, c := range []struct {
		dv    *cdiv1.DataVolume
		phase cdiv1.DataVolumePhase
		want  string
	}{
		{imp, cdiv1.ImportScheduled, "Normal ImportScheduled: Import into root scheduled"},
		{imp, cdiv1.ImportInProgress, "Normal ImportInProgress: Import into root in progress"},
		{imp, cdiv1.Succeeded, "Normal ImportSucceeded: Successfully imported into PVC root"},
		{imp, cdiv1.Failed, "Warning ImportFailed: Failed to import into PVC root"},
		{imp, cdiv1.WaitForFirstConsumer, " : "},
		{up, cdiv1.UploadReady, "Normal UploadReady: Upload into root ready"},
		{up, cdiv1.Succeeded, "Normal UploadSucceeded: Successfully uploaded into root"},
		{pvc, cdiv1.CloneInProgress, "Normal CloneInProgress: Cloning from golden/fedora into vms/root in progress"},
		{pvc, cdiv1.Succeeded, "Normal CloneSucceeded: Successfully cloned from golden/fedora into vms/root"},
		{ref, cdiv1.Failed, "Warning CloneFailed: Cloning from os-images/fedora into vms/root failed"},
		{ref, cdiv1.PendingPopulation, " : "},
	} {
		typ, reason, note := phaseEvent(c.dv, c.phase)
		if got := fmt.Sprintf("%s %s: %s", typ, reason, note); got != c.want {
			t.Errorf("%s: got %q, want %q", c.phase, got, c.want)
		}
	}
}
