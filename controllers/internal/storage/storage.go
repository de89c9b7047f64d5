// Package storage answers what the controllers ask of the cluster's storage: a PVC's storage
// class (or the default one) and the VolumeSnapshotClass of a CSI driver.
package storage

import (
	"context"
	"fmt"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	annotationDefaultClass         = "storageclass.kubernetes.io/is-default-class"
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
		if list.Items[i].Annotations[annotationDefaultClass] == "true" {
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

// WaitsForConsumer says whether sc binds a claim only once its first consumer, a pod, is
// scheduled (volumeBindingMode WaitForFirstConsumer).
func WaitsForConsumer(sc *storagev1.StorageClass) bool {
	return sc != nil && sc.VolumeBindingMode != nil && *sc.VolumeBindingMode == storagev1.VolumeBindingWaitForFirstConsumer
}

// SnapshotClassFor returns the VolumeSnapshotClass for driver: the default one, else any;
// "" when there is none (or the snapshot API is not installed).
func SnapshotClassFor(ctx context.Context, c client.Reader, driver string) (string, error) {
	list := &snapshotv1.VolumeSnapshotClassList{}
	if err := c.List(ctx, list); err != nil {
		if meta.IsNoMatchError(err) {
			return "", nil
		}
		return "", err
	}
	found := ""
	for _, vsc := range list.Items {
		if vsc.Driver != driver {
			continue
		}
		if vsc.Annotations[annotationDefaultSnapshotClass] == "true" {
			return vsc.Name, nil
		}
		if found == "" {
			found = vsc.Name
		}
	}
	return found, nil
}

// GiveVolume turns the claimRef of the volume named pv to claim, so that Kubernetes' PV
// controller binds claim to it (a volume filled through another claim is handed over so); it
// says whether it changed anything.
func GiveVolume(ctx context.Context, c client.Client, pv string, claim *corev1.PersistentVolumeClaim) (bool, error) {
	vol := &corev1.PersistentVolume{}
	if err := c.Get(ctx, client.ObjectKey{Name: pv}, vol); err != nil {
		return false, err
	}
	if ref := vol.Spec.ClaimRef; ref != nil && ref.UID == claim.UID {
		return false, nil
	}
	patch := client.MergeFrom(vol.DeepCopy())
	vol.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
		Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID}
	if err := c.Patch(ctx, vol, patch); err != nil {
		return false, fmt.Errorf("giving volume %s to the claim %s: %w", pv, claim.Name, err)
	}
	return true, nil
}
