package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

func (r *Reconciler) reconcile(ctx context.Context, g *goldenImage) (ctrl.Result, error) {
	st := g.status
	if st.Phase == common.PhaseReady || st.Phase == common.PhaseFailed {
		return ctrl.Result{}, nil // an import's outcome is final; the source cannot change
	}
	st.SourceType = g.source.kind
	if g.source.unsupported != "" {
		setFailed(st, reasonUnsupportedSource, g.source.unsupported)
		return ctrl.Result{}, nil
	}
	if wait := retryWait(st, time.Now()); wait > 0 {
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	pvcName := childName(g.prefix, g.obj.GetName())
	capacity := int64(0)
	if s := g.volume.Resources.Requests.Storage; s != nil {
		capacity = s.Value()
	} else {
		if c := meta.FindStatusCondition(st.Conditions, common.ConditionReady); c != nil && c.Reason == reasonSizeRequired {
			return ctrl.Result{}, nil // until the spec gives a size
		}
		if st.VirtualSize == nil {
			return r.probe(ctx, g, pvcName)
		}
		capacity = volumeSizeFor(st.VirtualSize.Value())
	}
	if err := r.ensurePVC(ctx, g, pvcName, capacity); err != nil {
		return ctrl.Result{}, err
	}
	args := append([]string{}, g.source.args...)
	if g.checksum != "" {
		args = append(args, "--checksum", string(g.checksum))
	}
	pod, err := r.ensurePod(ctx, g, importpod.Spec{
		Name: fmt.Sprintf("%s-import-%d", pvcName, st.Retries), Args: args, PVC: pvcName, Capacity: capacity,
		Block: g.volume.VolumeMode != nil && *g.volume.VolumeMode == corev1.PersistentVolumeBlock,
	})
	if err != nil {
		return ctrl.Result{}, err
	}
	st.PVCName = pvcName
	return r.observe(ctx, g, pod, func(res *transfer.Result) {
		setImported(st, res, pvcName)
		r.Events.Eventf(g.obj, nil, corev1.EventTypeNormal, reasonImported, "Import",
			"Imported %s (%s, %d bytes) into %s", g.source.kind, res.Format, res.VirtualSize, pvcName)
	})
}

// probe runs the importer in probe mode to learn the source's virtual size.
func (r *Reconciler) probe(ctx context.Context, g *goldenImage, pvcName string) (ctrl.Result, error) {
	pod, err := r.ensurePod(ctx, g, importpod.Spec{
		Name: fmt.Sprintf("%s-probe-%d", pvcName, g.status.Retries), Args: append(append([]string{}, g.source.args...), "--probe"),
	})
	if err != nil {
		return ctrl.Result{}, err
	}
	st := g.status
	return r.observe(ctx, g, pod, func(res *transfer.Result) {
		if res.VirtualSize < 0 {
			setReady(st, metav1.ConditionFalse, reasonSizeRequired,
				"the source's size cannot be known without importing it (a compressed raw image): set spec.resources.requests.storage")
			st.Phase = common.PhasePending
			return
		}
		st.Format, st.VirtualSize = res.Format, resource.NewQuantity(res.VirtualSize, resource.BinarySI)
	})
}

// observe turns the pod's state into status; done is called with a successful result.
func (r *Reconciler) observe(ctx context.Context, g *goldenImage, pod *corev1.Pod, done func(*transfer.Result)) (ctrl.Result, error) {
	st := g.status
	switch pod.Status.Phase {
	case corev1.PodRunning:
		st.Phase = common.PhaseImporting
		setReady(st, metav1.ConditionFalse, reasonImporting, "the importer pod "+pod.Name+" is running")
		if t, err := r.readProgress(ctx, pod); err == nil {
			st.Transfer, st.Progress = t, percent(t)
		}
		return ctrl.Result{RequeueAfter: progressInterval}, nil
	case corev1.PodSucceeded, corev1.PodFailed:
		res := importpod.Result(pod)
		if pod.Status.Phase == corev1.PodSucceeded && res.Succeeded {
			done(res)
			// Deleting the pod, an owned child, brings the next pass (after a probe, the import).
			return ctrl.Result{}, client.IgnoreNotFound(r.Delete(ctx, pod))
		}
		return r.failed(ctx, g, pod, res)
	default:
		if st.Phase == "" {
			st.Phase = common.PhasePending
		}
		setReady(st, metav1.ConditionFalse, reasonPending, "waiting for the importer pod "+pod.Name+" to start")
		return ctrl.Result{}, nil
	}
}

// failed retries a transient failure with backoff, up to the image's retry limit, and ends
// the import on any other.
func (r *Reconciler) failed(ctx context.Context, g *goldenImage, pod *corev1.Pod, res *transfer.Result) (ctrl.Result, error) {
	st := g.status
	if res.Transient && st.Retries < int32(g.retry) {
		st.Retries++
		setReady(st, metav1.ConditionFalse, reasonRetrying,
			fmt.Sprintf("attempt %d failed (%s: %s); retrying", st.Retries, res.Reason, res.Message))
		r.Events.Eventf(g.obj, nil, corev1.EventTypeWarning, reasonRetrying, "Import", "Attempt %d failed: %s", st.Retries, res.Message)
		return ctrl.Result{RequeueAfter: backoff(st.Retries)}, client.IgnoreNotFound(r.Delete(ctx, pod))
	}
	setFailed(st, string(res.Reason), res.Message)
	r.Events.Eventf(g.obj, nil, corev1.EventTypeWarning, string(res.Reason), "Import", "Import failed: %s", res.Message)
	return ctrl.Result{}, nil
}

func (r *Reconciler) ensurePVC(ctx context.Context, g *goldenImage, name string, capacity int64) error {
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: g.obj.GetNamespace(),
		Labels: map[string]string{LabelImage: string(g.obj.GetUID()), LabelGolden: "true"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(capacity, resource.BinarySI)}},
			StorageClassName: g.volume.StorageClassName, VolumeMode: g.volume.VolumeMode,
		}}
	return r.createOwned(ctx, g, pvc)
}

func (r *Reconciler) ensurePod(ctx context.Context, g *goldenImage, s importpod.Spec) (*corev1.Pod, error) {
	s.Namespace = g.obj.GetNamespace()
	s.Labels = map[string]string{LabelImage: string(g.obj.GetUID()), LabelRole: "importer"}
	s.Mounts = g.source.mounts
	pod := importpod.Build(r.Pods, s)
	if err := r.createOwned(ctx, g, pod); err != nil {
		return nil, err
	}
	return pod, nil
}

// createOwned creates obj owned by the image unless it exists, and reads it back; an existing
// object that the image does not control is an error.
func (r *Reconciler) createOwned(ctx context.Context, g *goldenImage, obj client.Object) error {
	if err := controllerutil.SetControllerReference(g.obj, obj, r.Scheme()); err != nil {
		return err
	}
	err := r.Create(ctx, obj)
	if err == nil {
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating %s: %w", obj.GetName(), err)
	}
	if err := r.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		return err // the cache has not seen it yet: try again
	}
	if !metav1.IsControlledBy(obj, g.obj) {
		return fmt.Errorf("%s exists and does not belong to this image", obj.GetName())
	}
	return nil
}

// delete stops the import and removes what the image made, then lets the image go.
func (r *Reconciler) delete(ctx context.Context, g *goldenImage) error {
	ns := client.InNamespace(g.obj.GetNamespace())
	if err := r.DeleteAllOf(ctx, &corev1.Pod{}, ns, client.MatchingLabels{LabelImage: string(g.obj.GetUID())}); err != nil {
		return err
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: childName(g.prefix, g.obj.GetName()), Namespace: g.obj.GetNamespace()}}
	if err := r.Delete(ctx, pvc); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if controllerutil.RemoveFinalizer(g.obj, Finalizer) {
		return r.Update(ctx, g.obj)
	}
	return nil
}

// childName names an image's children: prefix and name, shortened with a hash when that
// would leave no room for the pods' suffixes.
func childName(prefix, name string) string {
	n := prefix + "-" + name
	if len(n) <= 200 {
		return n
	}
	sum := sha256.Sum256([]byte(n))
	return n[:180] + "-" + hex.EncodeToString(sum[:])[:10]
}

// volumeSizeFor is the PVC size for a disk of virtual size v: v plus the filesystem's 6 %,
// rounded up to a MiB.
func volumeSizeFor(v int64) int64 {
	n := int64(float64(v)/(1-0.06)) + 1
	return (n + 1<<20 - 1) &^ (1<<20 - 1)
}

// backoff is the wait before retry n: 2, 4, 8, ... seconds, at most 5 minutes.
func backoff(n int32) time.Duration {
	return min(time.Second<<min(n, 9), 5*time.Minute)
}

// retryWait is how long to wait before the next attempt, derived from when the last one
// failed.
func retryWait(st *common.ImageStatus, now time.Time) time.Duration {
	c := meta.FindStatusCondition(st.Conditions, common.ConditionReady)
	if c == nil || c.Reason != reasonRetrying {
		return 0
	}
	return c.LastTransitionTime.Add(backoff(st.Retries)).Sub(now)
}
