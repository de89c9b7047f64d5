package disk

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
)

// nodeLost says whether d failed because its volume's node is gone (checkNode).
func nodeLost(d *vmDisk) bool { return goldenimage.LostToNode(d.status) != nil }

// checkNode fails a Ready disk whose volume is on a node gone from the cluster (storage.Lost:
// a node lost for good is deleted), rather than leave its VM waiting for a node that will not
// come: a node-local volume's data went with the node. A disk failed so is Ready again when a
// node that reaches its volume comes (back) into the cluster. The disk's controller hears of
// nodes that come and go (controller.go).
func (r *Reconciler) checkNode(ctx context.Context, d *vmDisk, pvc *corev1.PersistentVolumeClaim) error {
	pv, err := r.volumeOf(ctx, pvc)
	if pv == nil || pv.Spec.NodeAffinity == nil || storage.Zonal(pv) || err != nil {
		return err // network storage, or a zone's: no node takes it away
	}
	nodes := &corev1.NodeList{}
	if err := r.List(ctx, nodes); err != nil {
		return err
	}
	switch lost := storage.Lost(pv, nodes.Items); {
	case lost && d.status.Phase == common.PhaseReady:
		msg := fmt.Sprintf("its volume %s is on %s, and no node of the cluster is: that node is gone, and the disk's data with it unless the node comes back",
			pv.Name, storage.Placement(pv))
		d.tracked().SetFailed(goldenimage.ReasonNodeLost, msg)
		r.Pods.Events.Eventf(d.obj, nil, corev1.EventTypeWarning, goldenimage.ReasonNodeLost, "Check", "The disk is lost: %s", msg)
	case !lost && d.status.Phase == common.PhaseFailed:
		d.status.Phase = common.PhaseReady
		d.tracked().SetReady(metav1.ConditionTrue, reasonMade, fmt.Sprintf("its volume %s is on %s, which is in the cluster again", pv.Name, storage.Placement(pv)))
		r.Pods.Events.Eventf(d.obj, nil, corev1.EventTypeNormal, reasonMade, "Check", "The disk's node is back: its volume %s is reached again", pv.Name)
	}
	return nil
}
