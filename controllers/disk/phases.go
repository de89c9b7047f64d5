package disk

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/google/uuid"
	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/image"
	"github.com/diskpipe/diskpipe/controllers/internal/hostcopy"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
	"github.com/diskpipe/diskpipe/internal/contract"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// Condition types and reasons of disks, besides Ready and the importer's reasons.
const (
	ConditionCloneStrategy = "CloneStrategy"
	// ConditionCopySource: which volume a replica is copied from, and why (copySource).
	ConditionCopySource = "CopySource"

	reasonMade                  = "Made"
	reasonWaitingForConsumer    = "WaitingForFirstConsumer"
	reasonWaitingForBinding     = "WaitingForBinding"
	reasonTooSmall              = "TooSmall"
	reasonSizeRequired          = "SizeRequired"
	reasonNameTaken             = "NameTaken"
	reasonVolumeNotBound        = "VolumeNotBound"
	reasonSnapshotNotFound      = "SnapshotNotFound"
	reasonWaitingForCloneSource = "WaitingForCloneSource"
	// ReasonSourceUnreachable: the VM's pod was scheduled to a node the image's node-local
	// volume does not reach, where a CSI clone or restore of it cannot be made.
	ReasonSourceUnreachable = "SourceUnreachable"
)

// plan is how a disk is made.
type plan struct {
	strategy common.CloneStrategy
	// golden is the image's, for clones; nil for a snapshot or blank disk.
	golden *image.Golden
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

func (r *Reconciler) reconcile(ctx context.Context, d *vmDisk) (ctrl.Result, error) {
	st, tr := d.status, d.tracked()
	pvcName := d.obj.GetName()
	if st.Phase == common.PhaseReady || nodeLost(d) {
		pvc := &corev1.PersistentVolumeClaim{}
		if err := r.Get(ctx, client.ObjectKey{Namespace: d.obj.GetNamespace(), Name: pvcName}, pvc); err != nil {
			return ctrl.Result{}, client.IgnoreNotFound(err)
		}
		if err := r.checkNode(ctx, d, pvc); err != nil || st.Phase != common.PhaseReady {
			return ctrl.Result{}, err
		}
		if err := r.checkPlaced(ctx, d, pvc); err != nil {
			return ctrl.Result{}, err
		}
		if err := r.fillFailed(ctx, d, pvc); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, r.noteCapacity(ctx, d, pvc)
	}
	if st.Phase == common.PhaseFailed {
		// What served the copy goes too: a clone source left would hold the image's PVC and
		// one of its serving slots.
		return ctrl.Result{}, errors.Join(r.unmark(ctx, d.obj.GetNamespace(), pvcName), r.unmark(ctx, d.obj.GetNamespace(), PrimeName(d.obj.GetUID())),
			r.cleanup(ctx, d))
	}
	if wait := tr.RetryWait(time.Now()); wait > 0 {
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	p, err := r.plan(ctx, d)
	var nr *image.NotReadyError
	switch {
	case errors.As(err, &nr):
		st.Phase = common.PhasePending
		tr.SetReady(metav1.ConditionFalse, nr.Reason, nr.Message)
		if nr.Reason == reasonWaitingForReplica { // a copy on its way: seconds, not minutes
			return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
		}
		return ctrl.Result{RequeueAfter: 30 * time.Second}, nil
	case errors.As(err, new(*owned.ErrTerminating)), errors.As(err, new(*owned.ErrNotOwned)):
		return r.nameTaken(d, err) // the name of the image's golden snapshot, or of its replica
	case err != nil:
		return ctrl.Result{}, err
	case p == nil:
		return ctrl.Result{}, nil // failed, with the reason in status
	}
	st.CloneStrategy = p.strategy

	block := modeOf(d.pvc.VolumeMode) == corev1.PersistentVolumeBlock
	preallocate := ptr.Deref(d.pvc.Preallocation, false)
	spec := importpod.Spec{Namespace: d.obj.GetNamespace(), Block: block, Capacity: p.size.Value(),
		Preallocate: preallocate, Labels: map[string]string{LabelDisk: string(d.obj.GetUID()), image.LabelRole: "importer"}}
	if p.class != nil {
		spec.StorageClass = p.class.Name
	}
	source := "grow" // how the disk is made, for metrics
	var copyFrom *hostcopy.Source
	grows := !block && (p.size.Cmp(p.sourceSize) > 0 || preallocate || p.fillsMore(r.Pods.Config.FilesystemOverhead.For(spec.StorageClass)))
	if err := r.bindNow(ctx, d, p); err != nil {
		return ctrl.Result{}, err
	}
	if p.deferred, err = r.deferToConsumer(ctx, d, p, pvcName, p.dataSource == nil || grows); err != nil {
		return ctrl.Result{}, err
	}
	switch {
	case p.deferred:
		return r.madeByStorage(ctx, d, pvcName, p)
	case p.dataSource == nil && d.blank:
		source = "blank"
		spec.Name = fmt.Sprintf("%s-blank-%d", pvcName, st.Retries)
		spec.Import = contract.Import{Source: "blank", Grow: true}
	case p.dataSource == nil:
		source = "copy"
		spec.Name = fmt.Sprintf("%s-clone-%d", pvcName, st.Retries)
		spec.Import = contract.Import{Grow: true}
		from := p.golden.PVC
		if isReplica(d, p.golden) {
			var how string
			var nr *image.NotReadyError
			if from, how, err = r.copySource(ctx, d, p.golden); errors.As(err, &nr) {
				st.Phase = common.PhasePending
				tr.SetReady(metav1.ConditionFalse, nr.Reason, nr.Message)
				return ctrl.Result{RequeueAfter: 30 * time.Second}, nil
			} else if err != nil {
				return ctrl.Result{}, err
			}
			if how != "" {
				meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: ConditionCopySource, Status: metav1.ConditionTrue, Reason: "Nearest", Message: "copied " + how})
			}
		}
		copyFrom = &hostcopy.Source{Namespace: from.Namespace, Name: from.Name, Block: image.IsBlock(from), Remote: p.remote != "" || from != p.golden.PVC}
	case grows:
		// The storage copied the disk; a larger volume needs disk.img grown to fill it, and a
		// preallocated disk its holes allocated.
		spec.Name = fmt.Sprintf("%s-grow-%d", pvcName, st.Retries)
		spec.Import = contract.Import{GrowOnly: true}
	default:
		return r.madeByStorage(ctx, d, pvcName, p)
	}
	return r.fill(ctx, d, p, spec, source, copyFrom)
}

// madeByStorage makes a disk the storage makes whole (a CSI clone, a restore; a deferred disk
// by the populator): its PVC is bound once the storage is done.
func (r *Reconciler) madeByStorage(ctx context.Context, d *vmDisk, pvcName string, p *plan) (ctrl.Result, error) {
	pvc, err := r.ensurePVC(ctx, d, pvcName, p)
	if err != nil {
		return r.nameTaken(d, err)
	}
	d.status.PVCName = pvcName
	r.cloning(d)
	return r.waitForBinding(ctx, d, pvc, p)
}

// cloning is the phase of a disk on its way.
func (r *Reconciler) cloning(d *vmDisk) {
	if st := d.status; st.Phase == "" || st.Phase == common.PhasePending {
		st.Phase = common.PhaseCloning
	}
}

// refused fails the disk when a child's name is taken by an object diskpipe did not make for
// it (owned.ErrNotOwned), or a volume it would hand over is not its prime's
// (storage.ErrNotBound), and has it wait while the object that holds the name is being
// deleted (owned.ErrTerminating); any other err is returned with res.
func (r *Reconciler) refused(d *vmDisk, res ctrl.Result, err error) (ctrl.Result, error) {
	if res, waits := d.tracked().WaitForName(err); waits {
		return res, nil
	}
	if nt := (*owned.ErrNotOwned)(nil); errors.As(err, &nt) {
		d.tracked().SetFailed(reasonNameTaken, nt.Error())
		return ctrl.Result{}, nil
	}
	if nb := (*storage.ErrNotBound)(nil); errors.As(err, &nb) {
		d.tracked().SetFailed(reasonVolumeNotBound, nb.Error())
		return ctrl.Result{}, nil
	}
	return res, err
}

// nameTaken is refused at a step that made nothing else.
func (r *Reconciler) nameTaken(d *vmDisk, err error) (ctrl.Result, error) {
	return r.refused(d, ctrl.Result{}, err)
}

// Annotations of the PVCs of a disk an importer pod fills.
const (
	// AnnotationPrime, on a disk's PVC, names the PVC of diskpipe's (the prime) whose volume
	// it is given once the importer has filled that.
	AnnotationPrime = "diskpipe.io/prime"
	// AnnotationFilled, on a prime PVC, says its volume holds the whole disk and how it was
	// made.
	AnnotationFilled = "diskpipe.io/filled"
)

// PrimeName names the PVC an importer pod fills for the disk of that UID.
func PrimeName(uid types.UID) string { return "prime-" + string(uid) }

// PrimeOf is the UID of the disk whose prime name is (PrimeName), false when name is none.
func PrimeOf(name string) (types.UID, bool) {
	uid, ok := strings.CutPrefix(name, "prime-")
	if _, err := uuid.Parse(uid); !ok || err != nil || len(uid) != 36 {
		return "", false
	}
	return types.UID(uid), true
}

// fill makes a disk that an importer pod writes (a host-assisted copy, a blank disk, a clone
// grown to its volume). No one may use a half-written disk, and a VM (KubeVirt's included)
// boots from any PVC that is Bound, so the pod fills a PVC of diskpipe's own, the prime; the
// disk's PVC is made pre-bound to the prime's volume, and Kubernetes binds it only once the
// whole disk is there and the volume's claimRef is turned to it. A VM made early waits for
// its PVC to be bound, as for any volume.
//
// A host-assisted copy reads copyFrom, through a clone-source pod when it is in another
// namespace.
func (r *Reconciler) fill(ctx context.Context, d *vmDisk, p *plan, spec importpod.Spec, source string, copyFrom *hostcopy.Source) (ctrl.Result, error) {
	st, tr, ns, name := d.status, d.tracked(), d.obj.GetNamespace(), d.obj.GetName()
	final := &corev1.PersistentVolumeClaim{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, final); apierrors.IsNotFound(err) {
		final = nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	if final != nil && !metav1.IsControlledBy(final, d.obj) {
		// Not this disk's, and never used: an earlier disk's of the name, still being deleted
		// (a pod still uses it), or another's.
		if final.DeletionTimestamp != nil {
			return r.nameTaken(d, &owned.ErrTerminating{Kind: "PersistentVolumeClaim", Name: name})
		}
		return r.nameTaken(d, &owned.ErrNotOwned{Kind: "PersistentVolumeClaim", Name: name})
	}
	primeName := PrimeName(d.obj.GetUID())
	switch {
	case final != nil && final.Annotations[AnnotationPrime] == "":
		// Made by a diskpipe from before primes, which fills the disk's own PVC: finish so.
		primeName = name
	case final != nil && final.Status.Phase == corev1.ClaimBound && final.Annotations[AnnotationPrime] != "":
		return ctrl.Result{}, r.handedOver(ctx, d, p, final)
	}

	prime, err := r.ensurePVC(ctx, d, primeName, p)
	if err != nil {
		return r.nameTaken(d, err)
	}
	st.PVCName = name
	r.cloning(d)
	if final == nil && prime.Spec.VolumeName != "" {
		if final, err = r.ensurePreBound(ctx, d, prime); err != nil {
			return r.nameTaken(d, err)
		}
	}
	if how := prime.Annotations[AnnotationFilled]; how != "" {
		// The pod that filled it is deleted once its result is read; a manager stopped in
		// between leaves it, and nothing else would come back to it.
		done := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: spec.Name}}
		if err := r.Delete(ctx, done); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, err
		}
		switch {
		case primeName == name: // the disk's own PVC, filled in place
			r.made(ctx, d, prime, p, st.VirtualSize, how)
			return ctrl.Result{}, nil
		case final == nil: // filled, so bound: the cache has not seen it yet
			return ctrl.Result{RequeueAfter: time.Second}, nil
		}
		return r.handOver(ctx, d, prime, final)
	}

	spec.PVC = primeName
	if copyFrom != nil {
		if ready, err := hostcopy.Prepare(ctx, r.Client, r.Fresh.API, r.Pods.Config, d.obj, *copyFrom, &spec); err != nil || !ready {
			msg, wait := "waiting for the pod that serves the image from namespace "+copyFrom.Namespace, 2*time.Second
			if busy := (*hostcopy.BusyError)(nil); errors.As(err, &busy) {
				msg, wait, err = busy.Error(), 10*time.Second, nil
			}
			tr.SetReady(metav1.ConditionFalse, reasonWaitingForCloneSource, msg)
			return ctrl.Result{RequeueAfter: wait}, err
		}
	}
	pod := importpod.Build(r.Pods.Config, spec)
	work := importpod.Work{Obj: d.obj, Status: tr, Running: common.PhaseCloning, Action: "Clone", Retry: d.retry, Source: source}
	if err := r.Pods.Start(ctx, work, pod); err != nil {
		return r.refused(d, ctrl.Result{}, err) // its name held (an earlier disk's pod, still stopping)
	}
	return r.Pods.Observe(ctx, work, pod, func(res *transfer.Result) error {
		st.VirtualSize = resource.NewQuantity(res.VirtualSize, resource.BinarySI)
		how := fmt.Sprintf("%s in %.0f s", describe(d, p), res.DurationSeconds)
		patch := client.MergeFrom(prime.DeepCopy())
		metav1.SetMetaDataAnnotation(&prime.ObjectMeta, AnnotationFilled, how)
		if err := r.Patch(ctx, prime, patch); err != nil {
			return fmt.Errorf("marking %s filled: %w", prime.Name, err)
		}
		tr.SetReady(metav1.ConditionFalse, reasonHandingOver, "the disk is complete in "+prime.Name+"; handing its volume to the PVC "+name)
		return nil
	})
}

// reasonHandingOver: the prime is filled and its volume is being bound to the disk's PVC.
const reasonHandingOver = "HandingOver"

// ensurePreBound makes the disk's PVC, pre-bound to the prime's volume: Pending until the
// volume's claimRef names it. It exists from early on, so that a VM made meanwhile finds it
// (and waits for it to be bound) rather than finding no PVC.
func (r *Reconciler) ensurePreBound(ctx context.Context, d *vmDisk, prime *corev1.PersistentVolumeClaim) (*corev1.PersistentVolumeClaim, error) {
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: d.obj.GetName(), Namespace: prime.Namespace,
		Labels: maps.Clone(prime.Labels), Annotations: map[string]string{AnnotationPrime: prime.Name}},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: prime.Spec.AccessModes, Resources: prime.Spec.Resources,
			StorageClassName: prime.Spec.StorageClassName, VolumeMode: prime.Spec.VolumeMode, VolumeName: prime.Spec.VolumeName}}
	if err := owned.Create(ctx, r.Client, d.obj, pvc); err != nil {
		return nil, err
	}
	return pvc, nil
}

// handOver turns the filled prime's volume to the disk's PVC; Kubernetes' PV controller then
// binds that PVC to it, and the disk is made (handedOver).
func (r *Reconciler) handOver(ctx context.Context, d *vmDisk, prime, final *corev1.PersistentVolumeClaim) (ctrl.Result, error) {
	if final.Spec.VolumeName != prime.Spec.VolumeName {
		// Pre-bound to a volume that is no longer the prime's (the prime was deleted and made
		// again): made again, with the new one.
		return ctrl.Result{RequeueAfter: time.Second}, client.IgnoreNotFound(r.Delete(ctx, final))
	}
	if _, err := storage.GiveVolume(ctx, r.Client, prime, final); err != nil {
		return r.nameTaken(d, err)
	}
	d.tracked().SetReady(metav1.ConditionFalse, reasonHandingOver, fmt.Sprintf("the disk is complete; waiting for Kubernetes to bind its volume %s to the PVC %s", prime.Spec.VolumeName, final.Name))
	return ctrl.Result{RequeueAfter: 5 * time.Second}, nil // the PVC's binding brings the disk back sooner
}

// handedOver makes the disk whose PVC is bound to the volume its prime filled, and deletes
// the prime (the volume stays: its claimRef is the disk's PVC).
func (r *Reconciler) handedOver(ctx context.Context, d *vmDisk, p *plan, final *corev1.PersistentVolumeClaim) error {
	prime := &corev1.PersistentVolumeClaim{}
	how := describe(d, p)
	switch err := r.Get(ctx, client.ObjectKey{Namespace: final.Namespace, Name: final.Annotations[AnnotationPrime]}, prime); {
	case err == nil:
		if prime.Annotations[AnnotationFilled] != "" {
			how = prime.Annotations[AnnotationFilled]
		}
		if err := r.Delete(ctx, prime); client.IgnoreNotFound(err) != nil {
			return err
		}
	case !apierrors.IsNotFound(err):
		return err
	}
	r.made(ctx, d, final, p, d.status.VirtualSize, how)
	return nil
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
		g, err := image.Lookup(ctx, r.Client, d.image.Kind, d.imageNamespace(), string(d.image.Name))
		if err != nil {
			return nil, err
		}
		if g.Deleting() && d.status.PVCName == "" {
			return nil, &image.NotReadyError{Reason: "SourceDeleting", Message: fmt.Sprintf("the image %s/%s is being deleted", g.PVC.Namespace, g.Obj.GetName())}
		}
		p.golden, p.sourceSize = g, storage.ClaimSize(g.PVC)
	case d.snapshot != "":
		snap := &snapshotv1.VolumeSnapshot{}
		if err := r.Get(ctx, client.ObjectKey{Namespace: d.obj.GetNamespace(), Name: d.snapshot}, snap); err != nil {
			if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
				return nil, &image.NotReadyError{Reason: reasonSnapshotNotFound, Message: "the VolumeSnapshot " + d.snapshot + " does not exist"}
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
	pl, err := r.reach(ctx, p.golden.PVC, d.obj.GetAnnotations()[AnnotationSelectedNode])
	if err != nil {
		return nil, err
	}
	facts.unreachable, facts.nodeLocal = pl.unreachable, pl.nodeLocal
	facts.shared = pl.shared && preferred == "" && p.golden.Obj.GetLabels()[image.LabelStaging] != "true"
	p.remote, p.nodeLocal = facts.unreachable, pl.nodeLocal
	// A node the image does not reach gets a replica of it, which its disks are cloned from
	// (replica.go): where a CSI clone of the image would be possible but for its node.
	var replica *corev1.PersistentVolumeClaim
	if facts.unreachable != "" && facts.nodeLocal && !isReplica(d, p.golden) && preferred != common.CloneStrategyHostAssisted && facts.sourceNamespace == facts.targetNamespace &&
		facts.sourceClass == facts.targetClass && facts.sourceMode == facts.targetMode && facts.targetDriver != "" {
		node := d.obj.GetAnnotations()[AnnotationSelectedNode]
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
			return nil, &image.NotReadyError{Reason: reasonWaitingForReplica, Message: fmt.Sprintf(
				"%s: the image is copied to that node once, as its replica %s, and the disk is then cloned from it there", facts.unreachable, image.ReplicaName(p.golden, node))}
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
		msg = fmt.Sprintf("CSIClone of the image's replica %s on node %s, where the image's volume is not", replica.Name, d.obj.GetAnnotations()[AnnotationSelectedNode])
	}
	if ignored != "" {
		msg += "; " + ignored
	}
	if d.status.CloneStrategy != "" {
		strategy = d.status.CloneStrategy
	} else {
		r.Pods.Events.Eventf(d.obj, nil, corev1.EventTypeNormal, reason, "ChooseStrategy", "Cloning with %s", msg)
		if replica != nil && strategy == common.CloneStrategyCSIClone {
			if err := r.usedReplica(ctx, replica); err != nil {
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
		snap, err := image.EnsureSnapshot(ctx, r.Client, p.golden, facts.snapshotClass)
		if err != nil {
			return nil, err
		}
		p.dataSource = &corev1.TypedLocalObjectReference{APIGroup: ptr.To(snapshotv1.GroupName), Kind: "VolumeSnapshot", Name: snap.Name}
	}
	return p, nil
}

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
	node := pvc.Annotations[AnnotationSelectedNode]
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
	if !storage.WaitsForConsumer(p.class) || ann[AnnotationSelectedNode] != "" || ann[AnnotationBindImmediately] == "true" || isReplica(d, p.golden) ||
		(p.golden == nil && !d.blank) {
		return false, nil
	}
	// Decided once: a disk whose claim or prime exists goes on as it began (a fill begun before
	// an upgrade, or before its bind-immediately annotation was removed, is not deferred midway).
	for _, name := range []string{pvcName, PrimeName(d.obj.GetUID())} {
		pvc := &corev1.PersistentVolumeClaim{}
		if err := r.Get(ctx, client.ObjectKey{Namespace: d.obj.GetNamespace(), Name: name}, pvc); err == nil && metav1.IsControlledBy(pvc, d.obj) {
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

// ReasonNodeLost is the reason of a disk whose volume is on a node gone from the cluster.
const ReasonNodeLost = image.ReasonNodeLost

// nodeLost says whether d failed because its volume's node is gone (checkNode).
func nodeLost(d *vmDisk) bool { return image.LostToNode(d.status) != nil }

// checkNode fails a Ready disk whose volume is on a node gone from the cluster (storage.Lost:
// a node lost for good is deleted), rather than leave its VM waiting for a node that will not
// come: a node-local volume's data went with the node. A disk failed so is Ready again when a
// node that reaches its volume comes (back) into the cluster. The disk's controller hears of
// nodes that come and go (controller.go).
func (r *Reconciler) checkNode(ctx context.Context, d *vmDisk, pvc *corev1.PersistentVolumeClaim) error {
	pv, err := r.volumeOf(ctx, pvc)
	if pv == nil || pv.Spec.NodeAffinity == nil || storage.Zonal(pv) || err != nil {
		return err // network storage, or a zone's: no node takes it away
	}
	nodes := &corev1.NodeList{}
	if err := r.List(ctx, nodes); err != nil {
		return err
	}
	switch lost := storage.Lost(pv, nodes.Items); {
	case lost && d.status.Phase == common.PhaseReady:
		msg := fmt.Sprintf("its volume %s is on %s, and no node of the cluster is: that node is gone, and the disk's data with it unless the node comes back",
			pv.Name, storage.Placement(pv))
		d.tracked().SetFailed(ReasonNodeLost, msg)
		r.Pods.Events.Eventf(d.obj, nil, corev1.EventTypeWarning, ReasonNodeLost, "Check", "The disk is lost: %s", msg)
	case !lost && d.status.Phase == common.PhaseFailed:
		d.status.Phase = common.PhaseReady
		d.tracked().SetReady(metav1.ConditionTrue, reasonMade, fmt.Sprintf("its volume %s is on %s, which is in the cluster again", pv.Name, storage.Placement(pv)))
		r.Pods.Events.Eventf(d.obj, nil, corev1.EventTypeNormal, reasonMade, "Check", "The disk's node is back: its volume %s is reached again", pv.Name)
	}
	return nil
}

// PopulateName is the name of the DiskVolume the populator makes to fill the claim of UID uid.
func PopulateName(uid types.UID) string { return "populate-" + string(uid) }

// fillFailed fails a disk deferred to its VM's node whose fill there failed for good: the
// populator's disk of its claim (PopulateName) is Failed, and says why. The VM's claim would
// otherwise wait for ever behind a disk that says Ready.
func (r *Reconciler) fillFailed(ctx context.Context, d *vmDisk, pvc *corev1.PersistentVolumeClaim) error {
	if !Deferred(pvc) || pvc.Status.Phase == corev1.ClaimBound || !owned.Mine("PersistentVolumeClaim", pvc, d.obj) {
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
	if reason == ReasonNodeLost {
		reason = "FillFailed" // this disk's claim is not bound: it has no node to lose or get back
	}
	msg = fmt.Sprintf("filling PVC %s on node %s, where its VM's pod was scheduled, failed (DiskVolume %s): %s",
		pvc.Name, pvc.Annotations[AnnotationSelectedNode], inner.Name, msg)
	d.tracked().SetFailed(reason, msg)
	r.Pods.Events.Eventf(d.obj, nil, corev1.EventTypeWarning, reason, "Fill", "The disk cannot be made: %s", msg)
	return nil
}

// AnnotationDeferredRevision is, on the claim of a disk deferred to its VM's node, the revision
// of the scheduled image it was planned from and sized for, which the populator copies.
const AnnotationDeferredRevision = "diskpipe.io/deferred-revision"

// Deferred says whether pvc is the claim of a disk deferred to its VM's node, which the
// populator fills there.
func Deferred(pvc *corev1.PersistentVolumeClaim) bool {
	ref := pvc.Spec.DataSourceRef
	return ref != nil && ref.APIGroup != nil && ((*ref.APIGroup == diskvolume.GroupVersion.Group && ref.Kind == "DiskVolume") ||
		(*ref.APIGroup == hypercloud.GroupVersion.Group && ref.Kind == "VirtualMachinePvc"))
}

// AnnotationBindImmediately on a disk of a class that binds at the first consumer asks for its
// volume now, not where its VM's pod is scheduled later (CDI's
// cdi.kubevirt.io/storage.bind.immediate.requested of a DataVolume).
const AnnotationBindImmediately = "diskpipe.io/bind-immediately"

// bindNow fixes the node of a disk that asks to be bound at once (AnnotationBindImmediately)
// on a class that binds at the first consumer, and that the storage makes from the image's
// volume: the first node (by name) that volume reaches, noted on the disk as its selected
// node, so that its PVC is provisioned there now.
func (r *Reconciler) bindNow(ctx context.Context, d *vmDisk, p *plan) error {
	ann := d.obj.GetAnnotations()
	if ann[AnnotationBindImmediately] != "true" || ann[AnnotationSelectedNode] != "" || p.golden == nil || !storage.WaitsForConsumer(p.class) {
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
	ann[AnnotationSelectedNode] = node
	d.obj.SetAnnotations(ann)
	return r.Patch(ctx, d.obj, patch)
}

// volumeOf is the PersistentVolume pvc is bound to, nil when none is.
func (r *Reconciler) volumeOf(ctx context.Context, pvc *corev1.PersistentVolumeClaim) (*corev1.PersistentVolume, error) {
	return storage.VolumeOf(ctx, r.Client, pvc)
}

// snapshotFailed says why the image's golden VolumeSnapshot cannot be restored from: the error
// the snapshotter reported on it, or its name held by a snapshot not the image's (an earlier
// image's of the same name, still being deleted); "" when it is fine, or there is none yet.
// Automatic then clones the image's volume instead of restoring it (an explicit Snapshot waits,
// as asked).
func (r *Reconciler) snapshotFailed(ctx context.Context, g *image.Golden) (string, error) {
	snap := &snapshotv1.VolumeSnapshot{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: g.PVC.Namespace, Name: image.SnapshotName(g)}, snap); err != nil {
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
// disk's first consumer on, AnnotationSelectedNode; "" when not known yet) sees it.
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

func (r *Reconciler) ensurePVC(ctx context.Context, d *vmDisk, name string, p *plan) (*corev1.PersistentVolumeClaim, error) {
	modes := d.pvc.AccessModes
	if len(modes) == 0 {
		modes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	}
	labels := map[string]string{LabelDisk: string(d.obj.GetUID())}
	if p.golden != nil {
		labels[image.LabelCloneOf] = string(p.golden.Obj.GetUID())
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: d.obj.GetNamespace(), Labels: labels},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      modes,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: p.size}},
			StorageClassName: d.pvc.StorageClassName, VolumeMode: d.pvc.VolumeMode, DataSource: p.dataSource,
		}}
	if p.deferred {
		// Filled by the populator (controllers/populator) on its consumer's node, as this
		// disk says; the CSI provisioner leaves a claim of a source it does not know.
		gvk, err := apiutil.GVKForObject(d.obj, r.Scheme())
		if err != nil {
			return nil, err
		}
		pvc.Spec.DataSource, pvc.Spec.DataSourceRef = nil, &corev1.TypedObjectReference{APIGroup: ptr.To(gvk.Group), Kind: gvk.Kind, Name: d.obj.GetName()}
		if p.golden == nil {
			// blank: nothing to pin
		} else if rev := p.golden.Obj.GetName(); rev != string(d.image.Name) {
			pvc.Annotations = map[string]string{AnnotationDeferredRevision: rev}
		}
	}
	// A disk made for a claim of a class that binds on first consumer is provisioned on the
	// node the scheduler chose for that claim (the populator writes it on the DiskVolume).
	if node := d.obj.GetAnnotations()[AnnotationSelectedNode]; node != "" {
		pvc.Annotations = map[string]string{AnnotationSelectedNode: node}
	}
	if err := owned.Create(ctx, r.Client, d.obj, pvc); err != nil {
		return nil, err
	}
	return pvc, nil
}

// AnnotationSelectedNode is where the scheduler writes the node of a claim's first consumer;
// on a DiskVolume, the node its PVC is provisioned on.
const AnnotationSelectedNode = storage.AnnotationSelectedNode

// waitForBinding finishes a disk the storage system makes: Ready once its PVC is bound, or
// at once on a storage class that binds at the first consumer (the VM's pod).
func (r *Reconciler) waitForBinding(ctx context.Context, d *vmDisk, pvc *corev1.PersistentVolumeClaim, p *plan) (ctrl.Result, error) {
	switch {
	case pvc.Status.Phase == corev1.ClaimBound:
		r.made(ctx, d, pvc, p, nil, describe(d, p))
	case p.deferred:
		how := p.deferredHow
		r.made(ctx, d, pvc, p, nil, how)
		meta.SetStatusCondition(&d.status.Conditions, metav1.Condition{Type: common.ConditionReady, Status: metav1.ConditionTrue,
			Reason: reasonWaitingForConsumer, Message: how + " (WaitForFirstConsumer)"})
	case storage.WaitsForConsumer(p.class):
		r.made(ctx, d, pvc, p, nil, describe(d, p)+"; the volume is provisioned when the VM's pod is scheduled")
		meta.SetStatusCondition(&d.status.Conditions, metav1.Condition{Type: common.ConditionReady, Status: metav1.ConditionTrue,
			Reason: reasonWaitingForConsumer, Message: "made by " + describe(d, p) + " when the VM's pod is scheduled (WaitForFirstConsumer)"})
	default:
		d.tracked().SetReady(metav1.ConditionFalse, reasonWaitingForBinding, "waiting for the storage to bind the PVC "+pvc.Name)
	}
	return ctrl.Result{}, nil
}

// made marks the disk Ready and lets the image go.
func (r *Reconciler) made(ctx context.Context, d *vmDisk, pvc *corev1.PersistentVolumeClaim, p *plan, vsize *resource.Quantity, how string) {
	st := d.status
	st.Phase, st.Progress = common.PhaseReady, "100%"
	st.VirtualSize = vsize
	if vsize == nil && p.sourceSize.Sign() > 0 {
		st.VirtualSize = ptr.To(p.sourceSize)
	}
	if q, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok {
		st.Capacity = &q
	}
	d.tracked().SetReady(metav1.ConditionTrue, reasonMade, how)
	r.Pods.Events.Eventf(d.obj, nil, corev1.EventTypeNormal, reasonMade, "Clone", "Made the disk %s: %s", pvc.Name, how)
	if p.golden != nil {
		if err := hostcopy.Cleanup(ctx, r.Client, d.obj, p.golden.PVC.Namespace); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Could not remove the clone source")
		}
		// A disk deferred to its VM's node is copied from the image when that node is known:
		// the image is held (its clone mark stays) until the claim is bound (noteCapacity).
		if !p.deferred {
			if err := r.unmark(ctx, pvc.Namespace, pvc.Name); err != nil {
				ctrl.LoggerFrom(ctx).Error(err, "Could not unmark the clone")
			}
		}
	}
}

// unmark removes the mark that holds the image while its disk is being made.
func (r *Reconciler) unmark(ctx context.Context, ns, name string) error {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pvc); err != nil {
		return client.IgnoreNotFound(err)
	}
	if _, ok := pvc.Labels[image.LabelCloneOf]; !ok {
		return nil
	}
	patch := client.MergeFrom(pvc.DeepCopy())
	delete(pvc.Labels, image.LabelCloneOf)
	return client.IgnoreNotFound(r.Patch(ctx, pvc, patch))
}

// noteCapacity records the bound size of a Ready disk's PVC (a WaitForFirstConsumer disk
// binds after it is Ready).
func (r *Reconciler) noteCapacity(ctx context.Context, d *vmDisk, pvc *corev1.PersistentVolumeClaim) error {
	if d.status.Capacity != nil {
		return nil
	}
	if q, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok {
		d.status.Capacity = &q
		return r.unmark(ctx, pvc.Namespace, pvc.Name) // a deferred disk's image is let go of now
	}
	return nil
}

func (r *Reconciler) cleanup(ctx context.Context, d *vmDisk) error {
	if d.image == nil {
		return nil
	}
	return hostcopy.Cleanup(ctx, r.Client, d.obj, d.imageNamespace())
}

func describe(d *vmDisk, p *plan) string {
	switch {
	case p.golden != nil:
		return fmt.Sprintf("%s of %s/%s", p.strategy, p.golden.PVC.Namespace, p.golden.Obj.GetName())
	case d.snapshot != "":
		return "restored from the VolumeSnapshot " + d.snapshot
	default:
		return "blank"
	}
}
