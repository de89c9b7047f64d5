package goldenimage

import (
	"context"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/controllers/internal/owned"
)

// SnapshotName is the name of an image's golden VolumeSnapshot.
func SnapshotName(g *Golden) string { return g.PVC.Name + "-golden" }

// EnsureSnapshot returns the image's golden VolumeSnapshot of its golden PVC, made with
// class the first time a disk needs it. It belongs to the image: disks restored from it
// share it, and it goes with the image.
func EnsureSnapshot(ctx context.Context, c client.Client, g *Golden, class string) (*snapshotv1.VolumeSnapshot, error) {
	snap := &snapshotv1.VolumeSnapshot{
		ObjectMeta: metav1.ObjectMeta{Name: SnapshotName(g), Namespace: g.PVC.Namespace,
			Labels: map[string]string{LabelImage: string(g.Obj.GetUID()), LabelGolden: "true"}},
		Spec: snapshotv1.VolumeSnapshotSpec{
			Source:                  snapshotv1.VolumeSnapshotSource{PersistentVolumeClaimName: &g.PVC.Name},
			VolumeSnapshotClassName: &class,
		},
	}
	if err := owned.Create(ctx, c, g.Obj, snap); err != nil {
		return nil, err
	}
	return snap, nil
}
