// Package storage answers what the controllers ask of the cluster's storage: a PVC's storage
// class (or the default one) and the VolumeSnapshotClass its volumes are snapshotted with.
package storage

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	// AnnotationDefaultClass marks the cluster's default StorageClass.
	AnnotationDefaultClass         = "storageclass.kubernetes.io/is-default-class"
	annotationDefaultSnapshotClass = "snapshot.storage.kubernetes.io/is-default-class"
)

// Class returns the named class, or the cluster's default for ""; nil when there is
// none.
func Class(ctx context.Context, c client.Reader, name string) (*storagev1.StorageClass, error) {
	if name != "" {
		sc := &storagev1.StorageClass{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, sc); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, nil
			}
			return nil, err
		}
		return sc, nil
	}
	list := &storagev1.StorageClassList{}
	if err := c.List(ctx, list); err != nil {
		return nil, err
	}
	for i := range list.Items {
		if list.Items[i].Annotations[AnnotationDefaultClass] == "true" {
			return &list.Items[i], nil
		}
	}
	return nil, nil
}

// ClassName is the name of the StorageClass a PVC asking for name gets: name, or the
// cluster's default for nil (empty when there is none).
func ClassName(ctx context.Context, c client.Reader, name *string) (string, error) {
	if name != nil {
		return *name, nil
	}
	sc, err := Class(ctx, c, "")
	if err != nil || sc == nil {
		return "", err
	}
	return sc.Name, nil
}

// ClaimSize is a PVC's size: its bound capacity, else its request.
func ClaimSize(pvc *corev1.PersistentVolumeClaim) resource.Quantity {
	if q, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok {
		return q
	}
	return pvc.Spec.Resources.Requests[corev1.ResourceStorage]
}

// WaitsForConsumer says whether sc binds a claim only once its first consumer, a pod, is
// scheduled (volumeBindingMode WaitForFirstConsumer).
func WaitsForConsumer(sc *storagev1.StorageClass) bool {
	return sc != nil && sc.VolumeBindingMode != nil && *sc.VolumeBindingMode == storagev1.VolumeBindingWaitForFirstConsumer
}

// ErrNotBound is GiveVolume's refusal: the volume is not bound to the claim it would be taken
// from. A tenant can name any volume in a claim's spec.volumeName (it may set it once), so the
// volume's own claimRef, which only Kubernetes and the manager write, is what says whose it is.
type ErrNotBound struct{ Volume, From, BoundTo string }

func (e *ErrNotBound) Error() string {
	return fmt.Sprintf("refusing to hand volume %s over from the PVC %s: the volume is bound to %s, not to it", e.Volume, e.From, e.BoundTo)
}

// GiveVolume turns the claimRef of from's volume to claim, so that Kubernetes' PV controller
// binds claim to it (a volume filled through another claim is handed over so); it says whether
// it changed anything. It hands over only a volume whose claimRef names from, by UID, in
// claim's namespace, and from only when it is Bound: else an *ErrNotBound.
func GiveVolume(ctx context.Context, c client.Client, from, claim *corev1.PersistentVolumeClaim) (bool, error) {
	pv := from.Spec.VolumeName
	vol := &corev1.PersistentVolume{}
	if err := c.Get(ctx, client.ObjectKey{Name: pv}, vol); err != nil {
		return false, err
	}
	ref := vol.Spec.ClaimRef
	if ref != nil && ref.UID == claim.UID && ref.Namespace == claim.Namespace && ref.Name == claim.Name {
		return false, nil
	}
	if ref == nil || ref.UID != from.UID || ref.Namespace != from.Namespace || ref.Name != from.Name ||
		from.Namespace != claim.Namespace || from.Status.Phase != corev1.ClaimBound {
		boundTo := "no claim"
		if ref != nil {
			boundTo = fmt.Sprintf("the claim %s/%s (uid %s)", ref.Namespace, ref.Name, ref.UID)
		}
		return false, &ErrNotBound{Volume: pv, From: from.Namespace + "/" + from.Name, BoundTo: boundTo}
	}
	patch := client.MergeFromWithOptions(vol.DeepCopy(), client.MergeFromWithOptimisticLock{})
	vol.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
		Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID}
	if err := c.Patch(ctx, vol, patch); err != nil {
		return false, fmt.Errorf("giving volume %s to the claim %s: %w", pv, claim.Name, err)
	}
	return true, nil
}
