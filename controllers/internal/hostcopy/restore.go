package hostcopy

import (
	"cmp"
	"context"
	"fmt"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
)

// SnapshotWait says why a copy of a VolumeSnapshot cannot start yet.
type SnapshotWait struct {
	Reason, Message string
}

func (e *SnapshotWait) Error() string { return e.Message }

// Restore returns the claim a copy of the VolumeSnapshot namespace/name reads: restored from it
// in its own namespace (a volume is restored only where its snapshot is), named and marked as
// owner's clone source, so that Cleanup removes it with the pod once the copy is done. It is
// made with the class, volume mode and size of the snapshot's source claim, or, when that is
// gone, a class of the snapshot's driver (the default one first), the mode its content records
// and its restore size.
// A *SnapshotWait says why it cannot be made yet.
// The restores of a snapshot are counted with live, one pass at a time, as clone sources are,
// and made only for a copy whose volume can be made: into, its storage class ("" for the
// cluster's default or none), must exist, or the restore would hold a slot for nothing.
func Restore(ctx context.Context, c client.Client, live client.Reader, owner client.Object, namespace, name, into string) (*corev1.PersistentVolumeClaim, error) {
	pvc := &corev1.PersistentVolumeClaim{}
	err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: sourceName(owner)}, pvc)
	switch {
	case err == nil && !owned.Marked("PersistentVolumeClaim", pvc, owner.GetUID()):
		return nil, &owned.ErrNotOwned{Kind: "PersistentVolumeClaim", Name: namespace + "/" + pvc.Name}
	case err == nil && !pvc.DeletionTimestamp.IsZero():
		// Removed after an earlier pass (a copy done, then its status not written): made again
		// once it is gone.
		return nil, &SnapshotWait{"SourceNotReady", fmt.Sprintf("the volume %s/%s restored for this copy is being deleted", namespace, pvc.Name)}
	case err == nil:
		return pvc, nil
	case !apierrors.IsNotFound(err):
		return nil, err
	}
	if _, missing, err := classOf(ctx, live, into); err != nil {
		return nil, err
	} else if missing != "" {
		return nil, &SnapshotWait{"WaitingForCloneSource", "the copy's volume " + missing + ": the snapshot is restored for it when the volume can be made"}
	}
	// Each copy restores a volume of its own in the snapshot's namespace, which is not the
	// copier's: at most MaxServing at once, MaxServingPerNamespace for one namespace's copies,
	// as clone-source pods.
	unlock := lockSource(Source{Namespace: namespace, Name: "snapshot/" + name})
	defer unlock()
	restores := &corev1.PersistentVolumeClaimList{}
	if err := live.List(ctx, restores, client.InNamespace(namespace), client.MatchingLabels{LabelSourceOf: restoreLabel(name)}); err != nil {
		return nil, err
	}
	theirs, n := 0, 0
	for _, r := range restores.Items {
		if !r.DeletionTimestamp.IsZero() || r.Labels[LabelCopier] == namespace {
			continue // going, or the namespace's own
		}
		n++
		if r.Labels[LabelCopier] == owner.GetNamespace() {
			theirs++
		}
	}
	switch {
	case owner.GetNamespace() == namespace:
		// The namespace's own copies are not bounded by others'.
	case theirs >= MaxServingPerNamespace:
		return nil, &SnapshotWait{"WaitingForCloneSource", fmt.Sprintf(
			"%d copies of the VolumeSnapshot %s/%s are restored for namespace %s, as many as one namespace may have at once; this one starts when one of them ends", theirs, namespace, name, owner.GetNamespace())}
	case n >= MaxServing:
		return nil, &SnapshotWait{"WaitingForCloneSource", fmt.Sprintf(
			"%d copies of the VolumeSnapshot %s/%s are restored in its namespace, as many as may be at once; this one starts when one of them ends", n, namespace, name)}
	}
	snap := &snapshotv1.VolumeSnapshot{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, snap); apierrors.IsNotFound(err) {
		return nil, &SnapshotWait{"SourceNotFound", fmt.Sprintf("the VolumeSnapshot %s/%s does not exist", namespace, name)}
	} else if err != nil {
		return nil, err
	}
	st := snap.Status
	if st == nil || !ptr.Deref(st.ReadyToUse, false) || st.BoundVolumeSnapshotContentName == nil || st.RestoreSize == nil || st.RestoreSize.IsZero() {
		msg := fmt.Sprintf("the VolumeSnapshot %s/%s is not ready to use yet", namespace, name)
		if st != nil && st.Error != nil && st.Error.Message != nil {
			msg += ": " + *st.Error.Message
		}
		return nil, &SnapshotWait{"SourceNotReady", msg}
	}
	content := &snapshotv1.VolumeSnapshotContent{}
	if err := c.Get(ctx, client.ObjectKey{Name: *st.BoundVolumeSnapshotContentName}, content); err != nil {
		return nil, fmt.Errorf("reading the content of the VolumeSnapshot %s/%s: %w", namespace, name, err)
	}
	// The claim the snapshot was taken of, read once, nil when it is gone.
	var src *corev1.PersistentVolumeClaim
	if from := snap.Spec.Source.PersistentVolumeClaimName; from != nil {
		src = &corev1.PersistentVolumeClaim{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: *from}, src); apierrors.IsNotFound(err) {
			src = nil
		} else if err != nil {
			return nil, err
		}
	}
	class, mode, err := restoreClass(ctx, c, snap, content, src)
	if err != nil {
		return nil, err
	}
	// Some drivers report the bytes a snapshot holds as its restore size, less than the volume
	// it was taken of, which held the disk and its filesystem's overhead: the restored volume
	// is as large as that volume, where it is known.
	size := *st.RestoreSize
	if src != nil {
		if q := storage.ClaimSize(src); q.Cmp(size) > 0 {
			size = q
		}
	}
	ann, err := restoreNode(ctx, c, snap, src)
	if err != nil {
		return nil, err
	}
	pvc = &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: sourceName(owner), Namespace: namespace, Annotations: ann,
			Labels: map[string]string{LabelFor: string(owner.GetUID()), LabelSourceOf: restoreLabel(name), LabelCopier: owner.GetNamespace()}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &class,
			VolumeMode:       &mode,
			DataSource:       &corev1.TypedLocalObjectReference{APIGroup: ptr.To(snapshotv1.GroupName), Kind: "VolumeSnapshot", Name: name},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
	// In another namespace it can have no owner: its mark names the object it serves.
	owned.Stamp("PersistentVolumeClaim", pvc, owner.GetUID())
	if namespace == owner.GetNamespace() {
		if err := controllerutil.SetControllerReference(owner, pvc, c.Scheme()); err != nil {
			return nil, err
		}
	}
	if err := c.Create(ctx, pvc); apierrors.IsAlreadyExists(err) {
		// Made since it was looked for: the next pass reads it, and checks whose it is.
		return nil, &SnapshotWait{"SourceNotReady", fmt.Sprintf("the volume %s/%s restored for this copy is being made", namespace, pvc.Name)}
	} else if err != nil {
		return nil, fmt.Errorf("restoring the VolumeSnapshot %s/%s: %w", namespace, name, err)
	}
	return pvc, nil
}

// restoreNode pins the restore of a snapshot of a node-local volume (TopoLVM, local-path,
// OpenEBS LocalPV), which its driver makes only on that volume's node, to that node: the
// annotations that have it provisioned there, as the scheduler would for a consumer it put
// there, rather than on whichever node the scheduler picks for the pod that reads it. Nil for
// a volume of every node or of a zone, and when the source claim is gone (where the snapshot
// is is then not known: it is restored where its reader runs).
func restoreNode(ctx context.Context, c client.Client, snap *snapshotv1.VolumeSnapshot, src *corev1.PersistentVolumeClaim) (map[string]string, error) {
	if src == nil {
		return nil, nil
	}
	// The volume bound to the claim, not one a claim's volumeName merely names.
	pv, err := storage.VolumeOf(ctx, c, src)
	if pv == nil || err != nil || storage.Zonal(pv) || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != src.UID {
		return nil, err
	}
	node, local, err := storage.NodeReaching(ctx, c, pv)
	switch {
	case err != nil || !local:
		return nil, err
	case node == "":
		return nil, &SnapshotWait{"SourceNotReady", fmt.Sprintf("the VolumeSnapshot %s/%s is of a node-local volume, restored only on %s, and no such node takes pods now",
			snap.Namespace, snap.Name, storage.Placement(pv))}
	}
	return map[string]string{storage.AnnotationSelectedNode: node}, nil
}

// restoreLabel is LabelSourceOf's value on the claims restored from snapshot name.
func restoreLabel(name string) string { return sourceLabel(Source{Name: "VolumeSnapshot/" + name}) }

// restoreClass is the class and volume mode a snapshot is restored with, src the claim it
// was taken of (nil when gone).
func restoreClass(ctx context.Context, c client.Client, snap *snapshotv1.VolumeSnapshot, content *snapshotv1.VolumeSnapshotContent,
	src *corev1.PersistentVolumeClaim) (string, corev1.PersistentVolumeMode, error) {
	mode := ptr.Deref(content.Spec.SourceVolumeMode, corev1.PersistentVolumeFilesystem)
	if src != nil && src.Spec.StorageClassName != nil {
		class := &storagev1.StorageClass{}
		if err := c.Get(ctx, client.ObjectKey{Name: *src.Spec.StorageClassName}, class); err == nil && class.Provisioner == content.Spec.Driver {
			return class.Name, ptr.Deref(src.Spec.VolumeMode, mode), nil
		}
	}
	classes := &storagev1.StorageClassList{}
	if err := c.List(ctx, classes); err != nil {
		return "", "", err
	}
	var found string
	for _, class := range classes.Items {
		if class.Provisioner != content.Spec.Driver {
			continue
		}
		if class.Annotations[storage.AnnotationDefaultClass] == "true" {
			return class.Name, mode, nil
		}
		found = cmp.Or(found, class.Name)
	}
	if found == "" {
		return "", "", &SnapshotWait{"NoStorageClass", fmt.Sprintf("no StorageClass has the provisioner %s that the VolumeSnapshot %s/%s can be restored by",
			content.Spec.Driver, snap.Namespace, snap.Name)}
	}
	return found, mode, nil
}
