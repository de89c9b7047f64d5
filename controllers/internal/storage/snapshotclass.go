package storage

import (
	"context"
	"fmt"
	"slices"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// AnnotationSnapshotClass on a StorageClass names the VolumeSnapshotClass diskpipe snapshots
// its volumes with (an image's golden snapshot, the snapshot an export of a disk in use
// reads): for a driver with several classes, where its default is not the one to use.
const AnnotationSnapshotClass = "diskpipe.io/snapshot-class"

// SnapshotClasses chooses the VolumeSnapshotClass a StorageClass's volumes are snapshotted
// with: one rule for every snapshot diskpipe takes, so that a golden snapshot is of the same
// class whoever asks for it first.
type SnapshotClasses struct {
	Reader client.Reader
	// Named, when set, is asked first for the class named for a StorageClass, and where it
	// names one (non-nil) that is the choice, as if the StorageClass's annotation named it
	// (CDI's StorageProfile spec.snapshotClass, controllers/cdi); what it names and where is
	// said in why.
	Named func(ctx context.Context, class *storagev1.StorageClass) (name *string, where string, err error)
}

// For returns the VolumeSnapshotClass for class's volumes: the one named for it (by Named,
// else by the class's AnnotationSnapshotClass) when it is a class of class's driver, else
// none; with none named (an empty name names none), the driver's default class (the first by
// name of several), else the first of its classes by name.
// With none, name is "" and why says why; nil class has none. A cluster without the snapshot
// API has none.
func (s SnapshotClasses) For(ctx context.Context, class *storagev1.StorageClass) (name, why string, err error) {
	if class == nil {
		return "", "the storage class does not exist", nil
	}
	driver := class.Provisioner
	named, where := (*string)(nil), ""
	if s.Named != nil {
		if named, where, err = s.Named(ctx, class); err != nil {
			return "", "", err
		}
	}
	if v := class.Annotations[AnnotationSnapshotClass]; v != "" && ptr.Deref(named, "") == "" {
		named, where = &v, fmt.Sprintf("the StorageClass %s's annotation %s", class.Name, AnnotationSnapshotClass)
	}
	if ptr.Deref(named, "") != "" {
		vsc := &snapshotv1.VolumeSnapshotClass{}
		switch err := s.Reader.Get(ctx, client.ObjectKey{Name: *named}, vsc); {
		case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
			return "", fmt.Sprintf("%s names the VolumeSnapshotClass %q, which does not exist", where, *named), nil
		case err != nil:
			return "", "", err
		case vsc.Driver != driver:
			return "", fmt.Sprintf("%s names the VolumeSnapshotClass %q, of the driver %q, not %q", where, *named, vsc.Driver, driver), nil
		}
		return vsc.Name, "", nil
	}
	list := &snapshotv1.VolumeSnapshotClassList{}
	if err := s.Reader.List(ctx, list); err != nil {
		if meta.IsNoMatchError(err) {
			return "", "the cluster has no VolumeSnapshot API", nil
		}
		return "", "", err
	}
	var names, defaults []string
	for _, vsc := range list.Items {
		if vsc.Driver != driver {
			continue
		}
		if vsc.Annotations[annotationDefaultSnapshotClass] == "true" {
			defaults = append(defaults, vsc.Name)
		}
		names = append(names, vsc.Name)
	}
	switch {
	case len(defaults) > 0:
		return slices.Min(defaults), "", nil
	case len(names) > 0:
		return slices.Min(names), "", nil
	}
	return "", fmt.Sprintf("no VolumeSnapshotClass for the driver %q", driver), nil
}
