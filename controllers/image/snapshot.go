package image

import (
	"context"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
)

// noteSnapshot records the golden snapshot in the image's status once it exists.
func (r *Reconciler) noteSnapshot(ctx context.Context, g *goldenImage) error {
	if g.status.Phase != common.PhaseReady || g.status.SnapshotName != "" {
		return nil
	}
	name := childName(g.prefix, g.obj.GetName()) + "-golden"
	err := r.Get(ctx, client.ObjectKey{Namespace: g.obj.GetNamespace(), Name: name}, &snapshotv1.VolumeSnapshot{})
	if err == nil {
		g.status.SnapshotName = name
	}
	return client.IgnoreNotFound(err)
}
