package storage

import (
	"context"
	"testing"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// TestSnapshotClasses: what a class's volumes are snapshotted with. A class named for it (by
// the hook, else the StorageClass's annotation) wins when it is of the class's driver and is
// refused with the reason when not; unnamed, the driver's default class, else its first by
// name, whatever order the API lists them in.
func TestSnapshotClasses(t *testing.T) {
	vsc := func(name, driver string, isDefault bool) client.Object {
		v := &snapshotv1.VolumeSnapshotClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Driver: driver}
		if isDefault {
			v.Annotations = map[string]string{annotationDefaultSnapshotClass: "true"}
		}
		return v
	}
	class := func(driver, named string) *storagev1.StorageClass {
		sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: driver}
		if named != "" {
			sc.Annotations = map[string]string{AnnotationSnapshotClass: named}
		}
		return sc
	}
	profile := func(name *string) func(context.Context, *storagev1.StorageClass) (*string, string, error) {
		return func(context.Context, *storagev1.StorageClass) (*string, string, error) {
			return name, "the profile", nil
		}
	}
	objects := []client.Object{vsc("rbd-z", "rbd", false), vsc("rbd-b", "rbd", false), vsc("rbd-gold", "rbd", false),
		vsc("lvm-default", "lvm", true), vsc("lvm-a", "lvm", false), vsc("nfs-snap", "nfs", false),
		vsc("zfs-y", "zfs", true), vsc("zfs-x", "zfs", true), vsc("zfs-a", "zfs", false)}
	for _, tc := range []struct {
		name      string
		class     *storagev1.StorageClass
		named     func(context.Context, *storagev1.StorageClass) (*string, string, error)
		want, why string
	}{
		{"the driver's default", class("lvm", ""), nil, "lvm-default", ""},
		{"no default: the first by name", class("rbd", ""), nil, "rbd-b", ""},
		{"the annotation", class("rbd", "rbd-gold"), nil, "rbd-gold", ""},
		{"the annotation over the default", class("lvm", "lvm-a"), nil, "lvm-a", ""},
		{"the annotation names another driver's", class("rbd", "nfs-snap"), nil, "",
			`the StorageClass fast's annotation diskpipe.io/snapshot-class names the VolumeSnapshotClass "nfs-snap", of the driver "nfs", not "rbd"`},
		{"the annotation names none", class("rbd", "gone"), nil, "",
			`the StorageClass fast's annotation diskpipe.io/snapshot-class names the VolumeSnapshotClass "gone", which does not exist`},
		{"the hook over the annotation", class("rbd", "rbd-gold"), profile(ptr.To("rbd-z")), "rbd-z", ""},
		{"the hook names none: the annotation", class("rbd", "rbd-gold"), profile(nil), "rbd-gold", ""},
		{"the hook names another driver's", class("lvm", ""), profile(ptr.To("rbd-z")), "",
			`the profile names the VolumeSnapshotClass "rbd-z", of the driver "rbd", not "lvm"`},
		{"two defaults: the first by name", class("zfs", ""), nil, "zfs-x", ""},
		{"an empty name names none", class("lvm", ""), profile(ptr.To("")), "lvm-default", ""},
		{"an empty annotation names none", func() *storagev1.StorageClass {
			sc := class("rbd", "")
			sc.Annotations = map[string]string{AnnotationSnapshotClass: ""}
			return sc
		}(), nil, "rbd-b", ""},
		{"a driver without classes", class("hostpath", ""), nil, "", `no VolumeSnapshotClass for the driver "hostpath"`},
		{"no class", nil, nil, "", "the storage class does not exist"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scheme := runtime.NewScheme()
			if err := snapshotv1.AddToScheme(scheme); err != nil {
				t.Fatal(err)
			}
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objects...).Build()
			got, why, err := SnapshotClasses{Reader: c, Named: tc.named}.For(t.Context(), tc.class)
			if err != nil || got != tc.want || why != tc.why {
				t.Fatalf("got %q, %q, %v; want %q, %q", got, why, err, tc.want, tc.why)
			}
		})
	}
}
