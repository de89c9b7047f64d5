// Package storage answers what the controllers ask of the cluster's storage: a PVC's storage
// class (or the default one) and the VolumeSnapshotClass of a CSI driver.
package storage

import (
	"context"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
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
