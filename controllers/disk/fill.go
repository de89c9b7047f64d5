package disk

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/internal/hostcopy"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

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
	if final != nil && !owned.Controls(d.obj, final) {
		// Not this disk's, and never used: an earlier disk's of the name, still being deleted
		// (a pod still uses it), or another's.
		if final.DeletionTimestamp != nil {
			return r.nameTaken(d, &owned.ErrTerminating{Kind: "PersistentVolumeClaim", Name: name})
		}
		return r.nameTaken(d, notOwnedClaim(d, final))
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
			// Its pod's changes wake this (hostcopy.Wakes); ServingPoll is in case none comes.
			msg, wait := "waiting for the pod that serves the image from namespace "+copyFrom.Namespace, hostcopy.ServingPoll
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
	if err := r.createClaim(ctx, d, pvc); err != nil {
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
