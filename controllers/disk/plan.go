package disk

import (
	"context"
	"errors"
	"fmt"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// plan is how a disk is made.
type plan struct {
	strategy common.CloneStrategy
	// golden is the image's, for clones; nil for a snapshot or blank disk.
	golden *goldenimage.Golden
	// dataSource of the PVC, for CSI clones and restores.
	dataSource *corev1.TypedLocalObjectReference
	// sourceSize is the size of what the disk is made from (0 for a blank disk).
	sourceSize resource.Quantity
	size       resource.Quantity
	// asked: the size is the user's, not the source's.
	asked bool
	class *storagev1.StorageClass
	// remote says why the node the disk is wanted on cannot mount the image's volume, which
	// a copy then reads through a clone-source pod on the image's node; "" when it can.
	remote string
	// nodeLocal: the image's volume is one node's.
	nodeLocal bool
	// deferred: the disk's PVC is filled once its VM's node is known (deferToConsumer), as
	// deferredHow says.
	deferred    bool
	deferredHow string
}

// fillsMore says whether a filesystem volume of the size the user asked holds more than the
// image's disk, which is then grown to fill it: the guest sees the size asked for, whether the
// storage copied the disk (a CSI clone of a golden PVC as large) or an importer did.
func (p *plan) fillsMore(overhead float64) bool {
	if !p.asked || p.golden == nil || p.golden.Status.VirtualSize == nil {
		return false
	}
	return p.golden.Status.VirtualSize.Value() < transfer.GrownSize(p.size.Value(), overhead)
}

// plan resolves the disk's source and chooses how to make it; nil (with the reason in
// status) when it cannot be made.
func (r *Reconciler) plan(ctx context.Context, d *vmDisk) (*plan, error) {
	tr := d.tracked()
	class, err := storage.Class(ctx, r.Client, ptr.Deref(d.pvc.StorageClassName, ""))
	if err != nil {
		return nil, err
	}
	p := &plan{class: class}
	switch {
	case d.image != nil:
		g, err := goldenimage.Lookup(ctx, r.Client, d.image.Kind, d.imageNamespace(), string(d.image.Name))
		if err != nil {
			return nil, err
		}
		if g.Deleting() && d.status.PVCName == "" {
			return nil, &goldenimage.NotReadyError{Reason: "SourceDeleting", Message: fmt.Sprintf("the image %s/%s is being deleted", g.PVC.Namespace, g.Obj.GetName())}
		}
		p.golden, p.sourceSize = g, storage.ClaimSize(g.PVC)
	case d.snapshot != "":
		snap := &snapshotv1.VolumeSnapshot{}
		if err := r.Get(ctx, client.ObjectKey{Namespace: d.obj.GetNamespace(), Name: d.snapshot}, snap); err != nil {
			if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
				return nil, &goldenimage.NotReadyError{Reason: reasonSnapshotNotFound, Message: "the VolumeSnapshot " + d.snapshot + " does not exist"}
			}
			return nil, err
		}
		if snap.Status != nil && snap.Status.RestoreSize != nil {
			p.sourceSize = *snap.Status.RestoreSize
		}
		p.dataSource = &corev1.TypedLocalObjectReference{APIGroup: ptr.To(snapshotv1.GroupName), Kind: "VolumeSnapshot", Name: d.snapshot}
	}

	switch req := d.pvc.Resources.Requests.Storage; {
	case req != nil:
		p.size, p.asked = *req, true
	case d.blank:
		tr.SetFailed(reasonSizeRequired, "a blank disk needs spec.resources.requests.storage")
		return nil, nil
	case p.golden != nil:
		// As large as the image's volume, or more: a block image's disk is its whole device,
		// which a filesystem disk holds only with the filesystem's share besides.
		o := r.Pods.Config.FilesystemOverhead
		p.size = *resource.NewQuantity(transfer.CopyCapacity(p.sourceSize.Value(), goldenimage.IsBlock(p.golden.PVC), modeOf(d.pvc.VolumeMode) == corev1.PersistentVolumeBlock,
			o.For(ptr.Deref(p.golden.PVC.Spec.StorageClassName, "")), o.For(ptr.Deref(d.pvc.StorageClassName, ""))), resource.BinarySI)
	default:
		p.size = p.sourceSize
	}
	if p.size.Cmp(p.sourceSize) < 0 {
		tr.SetFailed(reasonTooSmall, fmt.Sprintf("the disk asks for %s but its source needs %s: ask for at least that", p.size.String(), p.sourceSize.String()))
		return nil, nil
	}
	if p.golden == nil {
		return p, nil
	}

	preferred, ignored := r.Strategies.Preferred(class)
	if d.strategy != nil {
		preferred, ignored = *d.strategy, ""
	}
	goldenClass, err := storage.Class(ctx, r.Client, ptr.Deref(p.golden.PVC.Spec.StorageClassName, ""))
	if err != nil {
		return nil, err
	}
	facts := cloneFacts{sourceNamespace: p.golden.PVC.Namespace, targetNamespace: d.obj.GetNamespace(),
		sourceClass: nameOf(goldenClass), targetClass: nameOf(class),
		sourceMode: modeOf(p.golden.PVC.Spec.VolumeMode), targetMode: modeOf(d.pvc.VolumeMode),
		sourceDriver: driverOf(goldenClass), targetDriver: driverOf(class)}
	pl, err := r.reach(ctx, p.golden.PVC, d.obj.GetAnnotations()[storage.AnnotationSelectedNode])
	if err != nil {
		return nil, err
	}
	facts.unreachable, facts.nodeLocal = pl.unreachable, pl.nodeLocal
	facts.shared = pl.shared && preferred == "" && p.golden.Obj.GetLabels()[goldenimage.LabelStaging] != "true"
	p.remote, p.nodeLocal = facts.unreachable, pl.nodeLocal
	// A node the image does not reach gets a replica of it, which its disks are cloned from
	// (replica.go): where a CSI clone of the image would be possible but for its node.
	var replica *corev1.PersistentVolumeClaim
	if facts.cloneButForNode() && !isReplica(d, p.golden) && preferred != common.CloneStrategyHostAssisted {
		node := d.obj.GetAnnotations()[storage.AnnotationSelectedNode]
		replica, err = r.replicaOn(ctx, p.golden, d.image.Kind, node)
		var failed *errReplicaFailed
		switch {
		case errors.As(err, &failed):
			// Copied from the image's node, as if there were no replicas; the condition says why.
			facts.unreachable += "; " + failed.Error()
			p.remote = facts.unreachable
		case err != nil:
			return nil, err
		case replica == nil:
			return nil, &goldenimage.NotReadyError{Reason: reasonWaitingForReplica, Message: fmt.Sprintf(
				"%s: the image is copied to that node once, as its replica %s, and the disk is then cloned from it there", facts.unreachable, goldenimage.ReplicaName(p.golden, node))}
		default:
			facts.unreachable, p.remote, preferred = "", "", common.CloneStrategyCSIClone
		}
	}
	if facts.targetDriver != "" && preferred != common.CloneStrategyHostAssisted {
		// The golden snapshot is of the image's volume, so of its class's choosing.
		if facts.snapshotClass, facts.noSnapshotClass, err = r.Snapshots.For(ctx, goldenClass); err != nil {
			return nil, err
		}
	}
	if facts.shared && facts.snapshotClass != "" {
		if facts.snapshotFailed, err = r.snapshotFailed(ctx, p.golden); err != nil {
			return nil, err
		}
	}
	// Once chosen, a strategy stays: a PVC made one way is not made again another.
	strategy, reason, msg := choose(preferred, facts)
	if replica != nil && strategy == common.CloneStrategyCSIClone {
		msg = fmt.Sprintf("CSIClone of the image's replica %s on node %s, where the image's volume is not", replica.Name, d.obj.GetAnnotations()[storage.AnnotationSelectedNode])
	}
	if ignored != "" {
		msg += "; " + ignored
	}
	if d.status.CloneStrategy != "" {
		strategy = d.status.CloneStrategy
	} else {
		r.Pods.Events.Eventf(d.obj, nil, corev1.EventTypeNormal, reason, "ChooseStrategy", "Cloning with %s", msg)
		if replica != nil && strategy == common.CloneStrategyCSIClone {
			if err := goldenimage.NoteReplicaUsed(ctx, r.Client, replica); err != nil {
				return nil, err
			}
		}
	}
	meta.SetStatusCondition(&d.status.Conditions, metav1.Condition{Type: ConditionCloneStrategy, Status: metav1.ConditionTrue, Reason: reason, Message: msg})
	p.strategy = strategy
	switch {
	case strategy == common.CloneStrategyCSIClone && replica != nil:
		p.dataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: replica.Name}
	case strategy == common.CloneStrategyCSIClone:
		p.dataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: p.golden.PVC.Name}
	case strategy == common.CloneStrategySnapshot:
		snap, err := goldenimage.EnsureSnapshot(ctx, r.Client, p.golden, facts.snapshotClass)
		if err != nil {
			return nil, err
		}
		p.dataSource = &corev1.TypedLocalObjectReference{APIGroup: ptr.To(snapshotv1.GroupName), Kind: "VolumeSnapshot", Name: snap.Name}
	}
	return p, nil
}

// snapshotFailed says why the image's golden VolumeSnapshot cannot be restored from: the error
// the snapshotter reported on it, or its name held by a snapshot not the image's (an earlier
// image's of the same name, still being deleted); "" when it is fine, or there is none yet.
// Automatic then clones the image's volume instead of restoring it (an explicit Snapshot waits,
// as asked).
func (r *Reconciler) snapshotFailed(ctx context.Context, g *goldenimage.Golden) (string, error) {
	snap := &snapshotv1.VolumeSnapshot{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: g.PVC.Namespace, Name: goldenimage.SnapshotName(g)}, snap); err != nil {
		return "", client.IgnoreNotFound(err)
	}
	switch {
	case !owned.Mine("VolumeSnapshot", snap, g.Obj):
		// An earlier image's of this name, still being deleted; or another's.
		return fmt.Sprintf("the VolumeSnapshot %s, the name of the image's golden snapshot, is not the image's", snap.Name), nil
	case snap.Status == nil || snap.Status.Error == nil:
		return "", nil
	}
	return fmt.Sprintf("the image's golden VolumeSnapshot %s failed: %s", snap.Name, ptr.Deref(snap.Status.Error.Message, "no message")), nil
}

// placement is where an image's volume is, as a disk wanted on a node sees it.
type placement struct {
	// shared: the volume is bound and not node-local (automatic).
	shared bool
	// nodeLocal: the volume's affinity admits one node (TopoLVM, local-path), rather than a
	// zone (EBS, Persistent Disk), whose snapshots are restored anywhere.
	nodeLocal bool
	// unreachable says why the node cannot use the volume, which a CSI clone or restore then
	// cannot copy from; "" when it can, or either is not known.
	unreachable string
}

// reach is where the golden PVC's volume is, as node name (the node the scheduler put a
// disk's first consumer on, storage.AnnotationSelectedNode; "" when not known yet) sees it.
func (r *Reconciler) reach(ctx context.Context, golden *corev1.PersistentVolumeClaim, name string) (placement, error) {
	pv, err := r.volumeOf(ctx, golden)
	if pv == nil || err != nil {
		return placement{}, err
	}
	nodes := &corev1.NodeList{}
	if err := r.List(ctx, nodes); err != nil {
		return placement{}, err
	}
	local := storage.NodeLocal(pv, nodes.Items)
	pl := placement{shared: !local, nodeLocal: local}
	for i := range nodes.Items {
		if n := &nodes.Items[i]; n.Name == name && !storage.Reaches(pv, n) {
			pl.unreachable = fmt.Sprintf("the image's volume is on %s, and the disk is wanted on node %s", storage.Placement(pv), name)
		}
	}
	return pl, nil
}
