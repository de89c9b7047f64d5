package hostcopy

import (
	"errors"
	"fmt"
	"testing"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
)

// TestRestore: a copy of a VolumeSnapshot reads a claim restored from it in its namespace, with
// the class and mode of the snapshot's source claim, else its driver's default class and the
// mode its content records, on its source volume's node when that is node-local; it waits, saying why, for a snapshot missing, not ready, or with no
// class to restore it, while MaxServing copies of it are restored, and while the copy's own
// class does not exist; a claim of the name that
// diskpipe did not make is neither used nor deleted (one step, with a fake client).
func TestRestore(t *testing.T) {
	if !owned.HasKey() {
		owned.UseKey([]byte("hostcopy test"), time.Time{})
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, storagev1.AddToScheme, snapshotv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	ctx := t.Context()
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	owner := func(i int) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("image-%d", i), Namespace: fmt.Sprintf("team-%d", i/2), UID: types.UID(fmt.Sprintf("u%d", i))}}
	}
	waits := func(i int, reason, message string) {
		t.Helper()
		var w *SnapshotWait
		if _, err := Restore(ctx, c, c, owner(i), "golden", "fedora", ""); !errors.As(err, &w) || w.Reason != reason || w.Message != message {
			t.Fatalf("want %s %q, got %v", reason, message, err)
		}
	}
	create := func(objs ...client.Object) {
		t.Helper()
		for _, o := range objs {
			if err := c.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}

	waits(0, "SourceNotFound", "the VolumeSnapshot golden/fedora does not exist")
	snap := &snapshotv1.VolumeSnapshot{ObjectMeta: metav1.ObjectMeta{Name: "fedora", Namespace: "golden"},
		Spec:   snapshotv1.VolumeSnapshotSpec{Source: snapshotv1.VolumeSnapshotSource{PersistentVolumeClaimName: ptr.To("fedora-disk")}},
		Status: &snapshotv1.VolumeSnapshotStatus{ReadyToUse: ptr.To(false), Error: &snapshotv1.VolumeSnapshotError{Message: ptr.To("the driver is busy")}}}
	create(snap)
	waits(0, "SourceNotReady", "the VolumeSnapshot golden/fedora is not ready to use yet: the driver is busy")
	snap.Status = &snapshotv1.VolumeSnapshotStatus{ReadyToUse: ptr.To(true), BoundVolumeSnapshotContentName: ptr.To("content-1"), RestoreSize: ptr.To(resource.MustParse("3Gi"))}
	if err := c.Update(ctx, snap); err != nil {
		t.Fatal(err)
	}
	create(&snapshotv1.VolumeSnapshotContent{ObjectMeta: metav1.ObjectMeta{Name: "content-1"},
		Spec: snapshotv1.VolumeSnapshotContentSpec{Driver: "rbd.csi.ceph.com", SourceVolumeMode: ptr.To(corev1.PersistentVolumeFilesystem)}})
	waits(0, "NoStorageClass", "no StorageClass has the provisioner rbd.csi.ceph.com that the VolumeSnapshot golden/fedora can be restored by")

	// The source claim's class and mode, when the class is of the snapshot's driver.
	create(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "rbd-block"}, Provisioner: "rbd.csi.ceph.com"},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "rbd", Annotations: map[string]string{storage.AnnotationDefaultClass: "true"}}, Provisioner: "rbd.csi.ceph.com"},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "local"}, Provisioner: "topolvm.io"},
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "fedora-disk", Namespace: "golden"},
			Spec:   corev1.PersistentVolumeClaimSpec{StorageClassName: ptr.To("rbd-block"), VolumeMode: ptr.To(corev1.PersistentVolumeBlock)},
			Status: corev1.PersistentVolumeClaimStatus{Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("4Gi")}}})
	// A copy into a class that does not exist waits, and restores nothing for it.
	if _, err := Restore(ctx, c, c, owner(0), "golden", "fedora", "no-such-class"); !errors.As(err, new(*SnapshotWait)) || err.Error() !=
		"the copy's volume is of storage class no-such-class, which does not exist: the snapshot is restored for it when the volume can be made" {
		t.Fatalf("a copy into a class that does not exist: %v", err)
	}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "golden", Name: "clone-source-u0"}, &corev1.PersistentVolumeClaim{}); err == nil {
		t.Fatal("a volume was restored for a copy that cannot be made")
	}
	pvc, err := Restore(ctx, c, c, owner(0), "golden", "fedora", "local")
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprintf("%s/%s class=%s mode=%s size=%s from=%s/%s marked=%t", pvc.Namespace, pvc.Name, *pvc.Spec.StorageClassName, *pvc.Spec.VolumeMode,
		pvc.Spec.Resources.Requests.Storage(), pvc.Spec.DataSource.Kind, pvc.Spec.DataSource.Name, owned.Marked("PersistentVolumeClaim", pvc, "u0"))
	// The snapshot says it holds 3 Gi, its volume had 4 Gi: the restore is as large as that.
	if want := "golden/clone-source-u0 class=rbd-block mode=Block size=4Gi from=VolumeSnapshot/fedora marked=true"; got != want {
		t.Errorf("restored claim:\n got %s\nwant %s", got, want)
	}
	if again, err := Restore(ctx, c, c, owner(0), "golden", "fedora", ""); err != nil || again.UID != pvc.UID {
		t.Errorf("a second pass finds the same claim: %v", err)
	}

	// Its source claim gone: the driver's default class, the content's mode.
	if err := c.Delete(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "fedora-disk", Namespace: "golden"}}); err != nil {
		t.Fatal(err)
	}
	pvc, err = Restore(ctx, c, c, owner(1), "golden", "fedora", "")
	if err != nil || *pvc.Spec.StorageClassName != "rbd" || *pvc.Spec.VolumeMode != corev1.PersistentVolumeFilesystem || pvc.Spec.Resources.Requests.Storage().String() != "3Gi" {
		t.Fatalf("without its source claim: %v %v", pvc, err)
	}

	// At most MaxServingPerNamespace restores of one snapshot at once for one namespace.
	third := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "image-third", Namespace: "team-0", UID: "u-third"}}
	var w *SnapshotWait
	if _, err := Restore(ctx, c, c, third, "golden", "fedora", ""); !errors.As(err, &w) || w.Message !=
		"2 copies of the VolumeSnapshot golden/fedora are restored for namespace team-0, as many as one namespace may have at once; this one starts when one of them ends" {
		t.Fatalf("a third restore for one namespace: %v", err)
	}
	// At most MaxServing restores of one snapshot at once.
	for i := 2; i < MaxServing; i++ {
		if _, err := Restore(ctx, c, c, owner(i), "golden", "fedora", ""); err != nil {
			t.Fatal(err)
		}
	}
	waits(MaxServing, "WaitingForCloneSource", "4 copies of the VolumeSnapshot golden/fedora are restored in its namespace, as many as may be at once; this one starts when one of them ends")
	if err := Cleanup(ctx, c, owner(1), "golden"); err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(ctx, c, c, owner(MaxServing), "golden", "fedora", ""); err != nil {
		t.Errorf("a copy once one ended: %v", err)
	}

	// A snapshot of a node-local volume is restored on that volume's node, the first by name
	// that takes pods; a zone's volume, anywhere.
	if err := Cleanup(ctx, c, owner(2), "golden"); err != nil {
		t.Fatal(err)
	}
	local := func(name, key string, nodes ...string) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{ClaimRef: &corev1.ObjectReference{UID: "fedora-disk"},
			NodeAffinity: &corev1.VolumeNodeAffinity{
				Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
					{Key: key, Operator: corev1.NodeSelectorOpIn, Values: nodes}}}}}}}}
	}
	node := func(name string, unschedulable bool) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"topology.topolvm.io/node": name, "topology.kubernetes.io/zone": "z1"}},
			Spec: corev1.NodeSpec{Unschedulable: unschedulable}}
	}
	create(node("node-a", false), node("node-b", false), node("node-c", true),
		local("on-b", "topology.topolvm.io/node", "node-b"), local("on-c", "topology.topolvm.io/node", "node-c"), local("in-z1", "topology.kubernetes.io/zone", "z1"),
		func() *corev1.PersistentVolume {
			pv := local("of-another", "topology.topolvm.io/node", "node-c")
			pv.Spec.ClaimRef.UID = "another-claim"
			return pv
		}(),
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "fedora-disk", Namespace: "golden", UID: "fedora-disk"},
			Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: ptr.To("rbd"), VolumeName: "on-b"}})
	pvc, err = Restore(ctx, c, c, owner(2), "golden", "fedora", "")
	if err != nil || pvc.Annotations["volume.kubernetes.io/selected-node"] != "node-b" {
		t.Errorf("a node-local snapshot's restore is pinned to its volume's node node-b: %v %v", pvc.GetAnnotations(), err)
	}
	// Its only node taking no pods: the copy waits, saying so.
	if err := Cleanup(ctx, c, owner(2), "golden"); err != nil {
		t.Fatal(err)
	}
	fedora := &corev1.PersistentVolumeClaim{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "golden", Name: "fedora-disk"}, fedora); err != nil {
		t.Fatal(err)
	}
	fedora.Spec.VolumeName = "on-c"
	if err := c.Update(ctx, fedora); err != nil {
		t.Fatal(err)
	}
	waits(2, "SourceNotReady", "the VolumeSnapshot golden/fedora is of a node-local volume, restored only on nodes with topology.topolvm.io/node in node-c, and no such node takes pods now")
	fedora.Spec.VolumeName = "of-another"
	if err := c.Update(ctx, fedora); err != nil {
		t.Fatal(err)
	}
	if pvc, err = Restore(ctx, c, c, owner(2), "golden", "fedora", ""); err != nil || pvc.Annotations["volume.kubernetes.io/selected-node"] != "" {
		t.Errorf("a volume the claim names but is not bound to does not place the restore: %v %v", pvc.GetAnnotations(), err)
	}
	if err := Cleanup(ctx, c, owner(2), "golden"); err != nil {
		t.Fatal(err)
	}
	fedora.Spec.VolumeName = "in-z1"
	if err := c.Update(ctx, fedora); err != nil {
		t.Fatal(err)
	}
	if pvc, err = Restore(ctx, c, c, owner(2), "golden", "fedora", ""); err != nil || pvc.Annotations["volume.kubernetes.io/selected-node"] != "" {
		t.Errorf("a zone's snapshot is restored where its reader runs: %v %v", pvc.GetAnnotations(), err)
	}

	// A claim of the name made by someone else is not diskpipe's.
	create(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "clone-source-u9", Namespace: "golden"}})
	var notOwned *owned.ErrNotOwned
	if _, err := Restore(ctx, c, c, owner(9), "golden", "fedora", ""); !errors.As(err, &notOwned) {
		t.Errorf("a claim under the name not made by diskpipe: %v", err)
	}
	if err := Cleanup(ctx, c, owner(9), "golden"); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "golden", Name: "clone-source-u9"}, &corev1.PersistentVolumeClaim{}); err != nil {
		t.Errorf("Cleanup deleted a claim diskpipe did not make: %v", err)
	}
}
