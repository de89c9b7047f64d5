package importpod

import (
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// TestExportServer: the URL of a KubeVirt export server is dialled at the export's own ready
// pod; a URL of another form, a Service or pod that the export does not control, an export of
// another UID and a pod of the node's network are not vouched for; an export whose server is
// not ready yet waits (one step, with a fake client).
func TestExportServer(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	gvk := schema.GroupVersionKind{Group: "export.kubevirt.io", Version: "v1beta1", Kind: "VirtualMachineExport"}
	scheme.AddKnownTypeWithName(gvk, &metav1.PartialObjectMetadata{})
	export := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "fedora", Namespace: "golden", UID: "e1"}}
	export.SetGroupVersionKind(gvk)
	ref := func(uid types.UID) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: "export.kubevirt.io/v1beta1", Kind: "VirtualMachineExport", Name: "fedora", UID: uid, Controller: ptr.To(true)}}
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "virt-export-fedora", Namespace: "golden", OwnerReferences: ref("e1")},
		Spec: corev1.ServiceSpec{Selector: map[string]string{exportServiceLabel: "fedora"}, Ports: []corev1.ServicePort{{Port: 443, TargetPort: intstr.FromInt32(8443)}}}}
	pod := func(name, ip string, uid types.UID, ready, hostNetwork bool) *corev1.Pod {
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "golden", Labels: map[string]string{exportServiceLabel: "fedora"}, OwnerReferences: ref(uid)},
			Spec:   corev1.PodSpec{HostNetwork: hostNetwork},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}}}
	}
	const url = "https://virt-export-fedora.golden.svc/volumes/fedora-disk/disk.img.gz"
	check := func(what string, c client.Reader, u, want string, wait bool) {
		t.Helper()
		got, err := ExportServer(t.Context(), c, u)
		var w *ExportWait
		if got != want || errors.As(err, &w) != wait || (!wait && err != nil) {
			t.Errorf("%s: got %q %v, want %q (waits: %t)", what, got, err, want, wait)
		}
	}
	build := func(objs ...client.Object) client.Reader {
		return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	}

	served := build(export, svc, pod("forged", "10.244.1.9", "other", true, false), pod("host", "192.168.1.10", "e1", true, true),
		pod("virt-export-fedora", "10.244.1.7", "e1", true, false))
	check("the export's ready pod", served, url, "virt-export-fedora.golden.svc:443=10.244.1.7:8443", false)
	check("with the cluster's domain", served, "https://virt-export-fedora.golden.svc.cluster.local:443/volumes/x/disk.img",
		"virt-export-fedora.golden.svc.cluster.local:443=10.244.1.7:8443", false)
	for _, u := range []string{"http://virt-export-fedora.golden.svc/x", "https://virt-export-fedora.golden.svc:8443/x", "https://fedora.golden.svc/x",
		"https://virt-export-fedora.golden.example.com/x", "https://virt-export-fedora.golden.svc.evil.example/x"} {
		check(u, served, u, "", false)
	}
	check("no export server pod ready", build(export, svc, pod("virt-export-fedora", "10.244.1.7", "e1", false, false)), url, "", true)
	check("only a pod of the node's network", build(export, svc, pod("virt-export-fedora", "192.168.1.10", "e1", true, true)), url, "", true)
	check("no such Service", build(export), url, "", false)
	mine := svc.DeepCopy()
	mine.OwnerReferences = nil
	check("a Service no export controls", build(export, mine, pod("virt-export-fedora", "10.244.1.7", "e1", true, false)), url, "", false)
	stale := svc.DeepCopy()
	stale.OwnerReferences = ref("e0")
	check("a Service of an earlier export of the name", build(export, stale, pod("virt-export-fedora", "10.244.1.7", "e0", true, false)), url, "", false)
	check("the export gone", build(svc, pod("virt-export-fedora", "10.244.1.7", "e1", true, false)), url, "", false)
	elsewhere := svc.DeepCopy()
	elsewhere.Spec.Ports[0].TargetPort = intstr.FromInt32(10250)
	check("a Service leading elsewhere than the server's port", build(export, elsewhere, pod("virt-export-fedora", "10.244.1.7", "e1", true, false)), url, "", false)
	other := export.DeepCopy()
	other.Name = "other"
	renamed := svc.DeepCopy()
	renamed.OwnerReferences[0].Name = "other"
	check("a Service of another export's name", build(other, renamed, pod("virt-export-fedora", "10.244.1.7", "e1", true, false)), url, "", false)
	check("only a pod of the export of another name", build(export, svc, pod("virt-export-forged", "10.244.1.8", "e1", true, false)), url, "", true)
}
