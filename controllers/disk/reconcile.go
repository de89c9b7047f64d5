package disk

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/hostcopy"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
	"github.com/diskpipe/diskpipe/internal/contract"
)

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
	var nr *goldenimage.NotReadyError
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
		Preallocate: preallocate, Labels: map[string]string{LabelDisk: string(d.obj.GetUID()), goldenimage.LabelRole: "importer"}}
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
			var nr *goldenimage.NotReadyError
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
		copyFrom = &hostcopy.Source{Namespace: from.Namespace, Name: from.Name, Block: goldenimage.IsBlock(from), Remote: p.remote != "" || from != p.golden.PVC}
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

// volumeOf is the PersistentVolume pvc is bound to, nil when none is.
func (r *Reconciler) volumeOf(ctx context.Context, pvc *corev1.PersistentVolumeClaim) (*corev1.PersistentVolume, error) {
	return storage.VolumeOf(ctx, r.Client, pvc)
}

func (r *Reconciler) ensurePVC(ctx context.Context, d *vmDisk, name string, p *plan) (*corev1.PersistentVolumeClaim, error) {
	modes := d.pvc.AccessModes
	if len(modes) == 0 {
		modes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	}
	labels := map[string]string{LabelDisk: string(d.obj.GetUID())}
	if p.golden != nil {
		labels[goldenimage.LabelCloneOf] = string(p.golden.Obj.GetUID())
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
	if node := d.obj.GetAnnotations()[storage.AnnotationSelectedNode]; node != "" {
		pvc.Annotations = map[string]string{storage.AnnotationSelectedNode: node}
	}
	if err := r.createClaim(ctx, d, pvc); err != nil {
		return nil, err
	}
	return pvc, nil
}

// createClaim makes pvc, one of the disk's PVCs, unless it exists (owned.Create); the disk's
// own claim goes under its claimController, where it has one.
func (r *Reconciler) createClaim(ctx context.Context, d *vmDisk, pvc *corev1.PersistentVolumeClaim) error {
	if above := d.claimController(); above != nil && pvc.Name == d.obj.GetName() {
		err := owned.CreateUnder(ctx, r.Client, d.obj, *above, pvc)
		if errors.As(err, new(*owned.ErrNotOwned)) {
			return notOwnedClaim(d, pvc)
		}
		return err
	}
	return owned.Create(ctx, r.Client, d.obj, pvc)
}

// notOwnedClaim is the refusal of pvc, which holds the name of the disk's own claim and is not
// the disk's. A claim under the disk's controller that an earlier disk of its name made (a
// DataVolume's DiskVolume deleted on its own, which the DataVolume made again) is the
// controller's to settle: it keeps the claim as its disk if it is whole, or deletes it
// (controllers/cdi); the disk waits for that.
func notOwnedClaim(d *vmDisk, pvc *corev1.PersistentVolumeClaim) error {
	above, ctl := d.claimController(), metav1.GetControllerOf(pvc)
	if above == nil || ctl == nil || ctl.UID != above.UID {
		return &owned.ErrNotOwned{Kind: "PersistentVolumeClaim", Name: pvc.Name}
	}
	switch earlier := ClaimMadeFor(pvc); earlier {
	case "":
		return &owned.ErrNotOwned{Kind: "PersistentVolumeClaim", Name: pvc.Name, Why: fmt.Sprintf("the PVC %s is %s %s's own disk (kept from an "+
			"earlier DiskVolume of this name, deleted on its own): this DiskVolume is not needed; delete it, not the PVC", pvc.Name, above.Kind, above.Name)}
	case d.obj.GetUID():
		return &owned.ErrNotOwned{Kind: "PersistentVolumeClaim", Name: pvc.Name}
	default:
		return &owned.ErrTerminating{Kind: "PersistentVolumeClaim", Name: pvc.Name, Why: fmt.Sprintf("the PVC %s was made by an earlier DiskVolume of this "+
			"name, deleted on its own: %s %s keeps it as its disk if it is whole, or deletes it and this disk is made", pvc.Name, above.Kind, above.Name)}
	}
}

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
	if _, ok := pvc.Labels[goldenimage.LabelCloneOf]; !ok {
		return nil
	}
	patch := client.MergeFrom(pvc.DeepCopy())
	delete(pvc.Labels, goldenimage.LabelCloneOf)
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
