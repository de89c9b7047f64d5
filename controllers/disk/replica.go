package disk

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/hostcopy"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
)

// Replicas of a node-local image (what they are, and why: controllers/goldenimage/replica.go, their
// one home): the disk side makes a replica for the first disk wanted on a node (replicaOn) and
// chooses the volume a replica is copied from (copySource).

// reasonWaitingForReplica is the reason of a disk that waits for the image's replica on its
// node.
const reasonWaitingForReplica = "WaitingForReplica"

// isReplica says whether d is a replica of golden's image (which is copied, never made of
// one).
func isReplica(d *vmDisk, golden *goldenimage.Golden) bool {
	return golden != nil && goldenimage.IsReplica(d.obj, golden.Obj)
}

// errReplicaFailed says the replica on a node failed: its disks are copied from the image's
// node instead, and the replica's Ready condition says why it failed.
type errReplicaFailed struct{ name, why string }

func (e *errReplicaFailed) Error() string {
	return fmt.Sprintf("the replica %s failed: %s", e.name, e.why)
}

// replicaOn makes golden's replica on node unless it exists, and returns its PVC once it is
// made (bound on node); nil while it is being made; an *errReplicaFailed when it failed.
func (r *Reconciler) replicaOn(ctx context.Context, golden *goldenimage.Golden, kind diskvolume.ImageKind, node string) (*corev1.PersistentVolumeClaim, error) {
	replica := goldenimage.Replica(golden, kind, node)
	if _, err := owned.Ensure(ctx, r.Client, golden.Obj, replica); err != nil {
		return nil, err
	}
	if replica.Status.Phase == common.PhaseFailed {
		why := "failed"
		if c := meta.FindStatusCondition(replica.Status.Conditions, common.ConditionReady); c != nil {
			why = c.Reason + ": " + c.Message
		}
		return nil, &errReplicaFailed{name: replica.Name, why: why}
	}
	if replica.Status.Phase != common.PhaseReady || replica.Status.Capacity == nil {
		return nil, nil
	}
	return goldenimage.ReplicaPVC(ctx, r.Client, replica)
}

// copySource is the volume replica d is copied from: the nearest that holds the image. That is
// a Ready replica on another node of d's node's zone (topology.kubernetes.io/zone) if there is
// one, else the image's own volume while a node of the cluster reaches it, else any Ready
// replica: a zone's nodes are served from within it, the image's node is not the only one
// serving every copy, and new replicas are made while the image's node is gone. It says which
// and why; "" for a copy that began, which goes on from its volume (hostcopy.Serving). With the
// image's node gone and no replica Ready, there is none: an *goldenimage.NotReadyError says so.
func (r *Reconciler) copySource(ctx context.Context, d *vmDisk, golden *goldenimage.Golden) (*corev1.PersistentVolumeClaim, string, error) {
	pinned, err := hostcopy.Serving(ctx, r.Client, d.obj, golden.PVC.Namespace)
	if err != nil {
		return nil, "", err
	}
	nodes := &corev1.NodeList{}
	if err := r.List(ctx, nodes); err != nil {
		return nil, "", err
	}
	zoneOf := map[string]string{}
	for _, n := range nodes.Items {
		zoneOf[n.Name] = n.Labels[corev1.LabelTopologyZone]
	}
	zone, inZone := zoneOf[d.obj.GetAnnotations()[storage.AnnotationSelectedNode]]
	inZone = inZone && zone != ""
	list, err := goldenimage.Replicas(ctx, r.Client, golden.Obj)
	if err != nil {
		return nil, "", err
	}
	var ready []*diskvolume.DiskVolume
	for _, rep := range list {
		if _, there := zoneOf[goldenimage.ReplicaNode(rep)]; there && rep.Name != d.obj.GetName() &&
			rep.Status.Phase == common.PhaseReady && rep.DeletionTimestamp.IsZero() {
			ready = append(ready, rep)
		}
	}
	pv, err := r.volumeOf(ctx, golden.PVC)
	if err != nil {
		return nil, "", err
	}
	lost := pv != nil && storage.Lost(pv, nodes.Items)
	// A copy that began goes on from its volume while that is there; one whose volume's node
	// is gone (or whose replica is not Ready any more) starts again from another.
	switch {
	case pinned == "":
	case pinned == golden.PVC.Name && !lost:
		return golden.PVC, "", nil // chosen before: its condition says why
	case slices.ContainsFunc(ready, func(rep *diskvolume.DiskVolume) bool { return rep.Name == pinned }):
		i := slices.IndexFunc(ready, func(rep *diskvolume.DiskVolume) bool { return rep.Name == pinned })
		if pvc, err := goldenimage.ReplicaPVC(ctx, r.Client, ready[i]); err != nil || pvc != nil {
			return pvc, "", err
		}
		fallthrough
	default:
		if err := hostcopy.Cleanup(ctx, r.Client, d.obj, golden.PVC.Namespace); err != nil {
			return nil, "", err
		}
	}
	type candidate struct {
		rep *diskvolume.DiskVolume // nil: the image's volume
		why string
	}
	var order []candidate
	for _, rep := range ready {
		if inZone && zoneOf[goldenimage.ReplicaNode(rep)] == zone {
			order = append(order, candidate{rep, "in zone " + zone})
		}
	}
	if !lost {
		order = append(order, candidate{nil, ""})
	} else {
		for _, rep := range ready {
			order = append(order, candidate{rep, "as the image's volume is on " + storage.Placement(pv) + ", which is gone from the cluster"})
		}
	}
	for _, c := range order {
		if c.rep == nil {
			break
		}
		if pvc, err := goldenimage.ReplicaPVC(ctx, r.Client, c.rep); err != nil {
			return nil, "", err
		} else if pvc != nil {
			return pvc, fmt.Sprintf("from the replica %s on node %s, %s", c.rep.Name, goldenimage.ReplicaNode(c.rep), c.why), nil
		}
	}
	if lost {
		// A clone source there would wait for ever, and hold one of the image's serving slots.
		return nil, "", &goldenimage.NotReadyError{Reason: goldenimage.ReasonNodeLost, Message: fmt.Sprintf(
			"the image's volume is on %s, which is gone from the cluster, and no replica of it is Ready to copy from", storage.Placement(pv))}
	}
	return golden.PVC, "from the image's volume", nil
}
