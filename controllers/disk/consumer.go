package disk

import (
	"context"
	"fmt"
	"maps"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
)

// checkPlaced fails a disk the storage makes on its first consumer's node (a CSI clone or a
// restore, on a WaitForFirstConsumer class) once the scheduler put that consumer on a node the
// image's volume does not reach: a node-local volume is cloned only on its node, so its PVC
// would stay Pending for ever, and the VM with it. The disk says where the image is and what
// to do instead.
func (r *Reconciler) checkPlaced(ctx context.Context, d *vmDisk, pvc *corev1.PersistentVolumeClaim) error {
	st := d.status
	if d.image == nil || st.Capacity != nil || (st.CloneStrategy != common.CloneStrategyCSIClone && st.CloneStrategy != common.CloneStrategySnapshot) {
		return nil
	}
	node := pvc.Annotations[storage.AnnotationSelectedNode]
	if pvc.Status.Phase == corev1.ClaimBound || node == "" {
		return nil
	}
	// The volume cloned is the one the PVC names (a scheduled image's newest revision may be
	// another by now): the golden PVC, or the one its snapshot was taken of.
	src := pvc.Spec.DataSource
	if src == nil || (src.Kind != "PersistentVolumeClaim" && src.Kind != "VolumeSnapshot") {
		return nil // a disk deferred to its VM's node (deferToConsumer) is filled there
	}
	goldenName := src.Name
	if src.Kind == "VolumeSnapshot" {
		snap := &snapshotv1.VolumeSnapshot{}
		if err := r.Get(ctx, client.ObjectKey{Namespace: pvc.Namespace, Name: src.Name}, snap); err != nil {
			return client.IgnoreNotFound(err)
		}
		goldenName = ptr.Deref(snap.Spec.Source.PersistentVolumeClaimName, "")
	}
	golden := &corev1.PersistentVolumeClaim{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: pvc.Namespace, Name: goldenName}, golden); err != nil {
		return client.IgnoreNotFound(err)
	}
	pl, err := r.reach(ctx, golden, node)
	if err != nil || pl.unreachable == "" || (!pl.nodeLocal && st.CloneStrategy == common.CloneStrategySnapshot) {
		return err // a snapshot of a zone's volume is restored in any zone
	}
	msg := fmt.Sprintf("its VM's pod was scheduled to node %s, where a %s cannot be made: %s. Make the disk as a PVC whose dataSourceRef is the image (it waits for the VM's node and copies the image there), or run the VM where the image is",
		node, st.CloneStrategy, pl.unreachable)
	d.tracked().SetFailed(ReasonSourceUnreachable, msg)
	r.Pods.Events.Eventf(d.obj, nil, corev1.EventTypeWarning, ReasonSourceUnreachable, "Clone", "The disk cannot be made: %s", msg)
	return nil
}

// deferToConsumer says whether a disk on a class that binds at the first consumer is made only
// once its VM's node is known. A disk a pod fills (byPod: a blank disk, a host copy, a clone
// grown to its size) would be bound wherever that pod ran, and the VM pinned there; a disk
// the storage makes (a CSI clone or restore) of an image whose volume is node-local would work
// on the image's node only. Such a disk's PVC names the disk as its data source, and the
// populator fills it on the VM's node as the disk says (from the image there, or from its
// replica there), so that the VM runs on any node. A disk whose node is known, one asked to be
// bound at once, and a replica are made at once.
func (r *Reconciler) deferToConsumer(ctx context.Context, d *vmDisk, p *plan, pvcName string, byPod bool) (bool, error) {
	ann := d.obj.GetAnnotations()
	if !storage.WaitsForConsumer(p.class) || ann[storage.AnnotationSelectedNode] != "" || ann[AnnotationBindImmediately] == "true" || isReplica(d, p.golden) ||
		(p.golden == nil && !d.blank) {
		return false, nil
	}
	// Decided once: a disk whose claim or prime exists goes on as it began (a fill begun before
	// an upgrade, or before its bind-immediately annotation was removed, is not deferred midway).
	for _, name := range []string{pvcName, PrimeName(d.obj.GetUID())} {
		pvc := &corev1.PersistentVolumeClaim{}
		if err := r.Get(ctx, client.ObjectKey{Namespace: d.obj.GetNamespace(), Name: name}, pvc); err == nil && owned.Controls(d.obj, pvc) {
			if name == pvcName && Deferred(pvc) {
				p.deferredHow = deferredHow(d, p, byPod)
				return true, nil
			}
			return false, nil
		} else if err != nil && !apierrors.IsNotFound(err) {
			return false, err
		}
	}
	if !byPod && p.golden != nil && !p.nodeLocal {
		return false, nil
	}
	p.deferredHow = deferredHow(d, p, byPod)
	return true, nil
}

// deferredHow says how a disk deferred to its VM's node is made there.
func deferredHow(d *vmDisk, p *plan, byPod bool) string {
	switch {
	case d.blank:
		return "made blank on the node its VM's pod is scheduled to, which it would be pinned to were it made now"
	case byPod:
		return "made on the node its VM's pod is scheduled to (" + describe(d, p) + ", grown to its size), which it would be pinned to were it made now"
	default:
		return "made on the node its VM's pod is scheduled to, from the image's node-local volume: cloned there, or copied once to that node " +
			"as the image's replica and cloned from it"
	}
}

// fillFailed fails a disk deferred to its VM's node whose fill there failed for good: the
// populator's disk of its claim (PopulateName) is Failed, and says why. The VM's claim would
// otherwise wait for ever behind a disk that says Ready.
func (r *Reconciler) fillFailed(ctx context.Context, d *vmDisk, pvc *corev1.PersistentVolumeClaim) error {
	if !Deferred(pvc) || pvc.Status.Phase == corev1.ClaimBound || !owned.MineUnder("PersistentVolumeClaim", pvc, d.obj) {
		return nil
	}
	inner := &diskvolume.DiskVolume{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: pvc.Namespace, Name: PopulateName(pvc.UID)}, inner); err != nil {
		return client.IgnoreNotFound(err)
	}
	if inner.Status.Phase != common.PhaseFailed || !metav1.IsControlledBy(inner, pvc) {
		return nil
	}
	reason, msg := "FillFailed", "no reason given"
	if c := meta.FindStatusCondition(inner.Status.Conditions, common.ConditionReady); c != nil {
		reason, msg = c.Reason, c.Message
	}
	if reason == goldenimage.ReasonNodeLost {
		reason = "FillFailed" // this disk's claim is not bound: it has no node to lose or get back
	}
	msg = fmt.Sprintf("filling PVC %s on node %s, where its VM's pod was scheduled, failed (DiskVolume %s): %s",
		pvc.Name, pvc.Annotations[storage.AnnotationSelectedNode], inner.Name, msg)
	d.tracked().SetFailed(reason, msg)
	r.Pods.Events.Eventf(d.obj, nil, corev1.EventTypeWarning, reason, "Fill", "The disk cannot be made: %s", msg)
	return nil
}

// bindNow fixes the node of a disk that asks to be bound at once (AnnotationBindImmediately)
// on a class that binds at the first consumer, and that the storage makes from the image's
// volume: the first node (by name) that volume reaches, noted on the disk as its selected
// node, so that its PVC is provisioned there now.
func (r *Reconciler) bindNow(ctx context.Context, d *vmDisk, p *plan) error {
	ann := d.obj.GetAnnotations()
	if ann[AnnotationBindImmediately] != "true" || ann[storage.AnnotationSelectedNode] != "" || p.golden == nil || !storage.WaitsForConsumer(p.class) {
		return nil
	}
	pv, err := r.volumeOf(ctx, p.golden.PVC)
	if pv == nil || err != nil {
		return err
	}
	node, _, err := storage.NodeReaching(ctx, r.Client, pv)
	if node == "" || err != nil {
		return err // no node reaches it now: the disk waits for its consumer as any other
	}
	patch := client.MergeFrom(d.obj.DeepCopyObject().(client.Object))
	ann = maps.Clone(ann)
	ann[storage.AnnotationSelectedNode] = node
	d.obj.SetAnnotations(ann)
	return r.Patch(ctx, d.obj, patch)
}
