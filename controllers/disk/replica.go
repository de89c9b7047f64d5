package disk

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/image"
	"github.com/diskpipe/diskpipe/controllers/internal/hostcopy"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
)

// # Replicas of a node-local image
//
// On node-local storage a golden image's volume lives on one node, and a CSI clone of it is
// made only there. The first disk wanted on another node N (its node known: a claim filled
// once its VM was scheduled) makes a replica of the image on N: a DiskVolume of the image in
// its namespace, controlled by the image, copied (a clone-source pod on the image's node
// streams it to the importer on N) into the image's class on N. That disk, and every later
// one on N, is a CSI clone of the replica: each node receives the image's bytes once, and
// never from the origin again. A replica is made once per node (its name is the image's and
// the node's), and goes with the image.

// Labels of a replica (image.LabelReplicaOf, image.LabelReplicaNode), and the reason of a
// disk that waits for the image's replica on its node.
const (
	LabelReplicaOf          = image.LabelReplicaOf
	LabelReplicaNode        = image.LabelReplicaNode
	reasonWaitingForReplica = "WaitingForReplica"
)

// isReplica says whether d is a replica of golden's image (which is copied, never made of
// one): a DiskVolume the image controls and diskpipe made for it. A label is anyone's to write.
func isReplica(d *vmDisk, golden *image.Golden) bool {
	return golden != nil && d.obj.GetLabels()[LabelReplicaOf] == string(golden.Obj.GetUID()) && owned.Mine("DiskVolume", d.obj, golden.Obj)
}

// errReplicaFailed says the replica on a node failed: its disks are copied from the image's
// node instead, and the replica's Ready condition says why it failed.
type errReplicaFailed struct{ name, why string }

func (e *errReplicaFailed) Error() string {
	return fmt.Sprintf("the replica %s failed: %s", e.name, e.why)
}

// replicaOn makes golden's replica on node unless it exists, and returns its PVC once it is
// made (bound on node); nil while it is being made; an *errReplicaFailed when it failed.
func (r *Reconciler) replicaOn(ctx context.Context, golden *image.Golden, kind diskvolume.ImageKind, node string) (*corev1.PersistentVolumeClaim, error) {
	replica := image.Replica(golden, kind, node)
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
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: replica.Namespace, Name: replica.Name}, pvc); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return pvc, nil
}

// copySource is the volume replica d is copied from: the nearest that holds the image. That is
// a Ready replica on another node of d's node's zone (topology.kubernetes.io/zone) if there is
// one, else the image's own volume while a node of the cluster reaches it, else any Ready
// replica: a zone's nodes are served from within it, the image's node is not the only one
// serving every copy, and new replicas are made while the image's node is gone. It says which
// and why; "" for a copy that began, which goes on from its volume (hostcopy.Serving). With the
// image's node gone and no replica Ready, there is none: an *image.NotReadyError says so.
func (r *Reconciler) copySource(ctx context.Context, d *vmDisk, golden *image.Golden) (*corev1.PersistentVolumeClaim, string, error) {
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
	zone, inZone := zoneOf[d.obj.GetAnnotations()[AnnotationSelectedNode]]
	inZone = inZone && zone != ""
	list := &diskvolume.DiskVolumeList{}
	if err := r.List(ctx, list, client.InNamespace(golden.PVC.Namespace), client.MatchingLabels{LabelReplicaOf: string(golden.Obj.GetUID())}); err != nil {
		return nil, "", err
	}
	slices.SortFunc(list.Items, func(a, b diskvolume.DiskVolume) int { return strings.Compare(a.Name, b.Name) })
	var ready []*diskvolume.DiskVolume
	for i := range list.Items {
		rep := &list.Items[i]
		node := rep.Annotations[AnnotationSelectedNode]
		if _, there := zoneOf[node]; there && rep.Name != d.obj.GetName() && owned.Mine("DiskVolume", rep, golden.Obj) &&
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
		pvc := &corev1.PersistentVolumeClaim{}
		if err := r.Get(ctx, client.ObjectKey{Namespace: golden.PVC.Namespace, Name: pinned}, pvc); err == nil {
			return pvc, "", nil
		} else if !apierrors.IsNotFound(err) {
			return nil, "", err
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
		if inZone && zoneOf[rep.Annotations[AnnotationSelectedNode]] == zone {
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
		pvc := &corev1.PersistentVolumeClaim{}
		if err := r.Get(ctx, client.ObjectKey{Namespace: c.rep.Namespace, Name: c.rep.Name}, pvc); err == nil && pvc.DeletionTimestamp.IsZero() &&
			pvc.Status.Phase == corev1.ClaimBound && owned.Mine("PersistentVolumeClaim", pvc, c.rep) {
			return pvc, fmt.Sprintf("from the replica %s on node %s, %s", c.rep.Name, c.rep.Annotations[AnnotationSelectedNode], c.why), nil
		} else if client.IgnoreNotFound(err) != nil {
			return nil, "", err
		}
	}
	if lost {
		// A clone source there would wait for ever, and hold one of the image's serving slots.
		return nil, "", &image.NotReadyError{Reason: ReasonNodeLost, Message: fmt.Sprintf(
			"the image's volume is on %s, which is gone from the cluster, and no replica of it is Ready to copy from", storage.Placement(pv))}
	}
	return golden.PVC, "from the image's volume", nil
}

// usedReplica notes on the replica whose PVC pvc is that a disk is made from it now: the
// image's replica policy evicts replicas no disk was made from for a time (image.keepReplicas).
func (r *Reconciler) usedReplica(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	d := &diskvolume.DiskVolume{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: pvc.Namespace, Name: pvc.Name}, d); err != nil {
		return client.IgnoreNotFound(err)
	}
	patch := client.MergeFrom(d.DeepCopy())
	metav1.SetMetaDataAnnotation(&d.ObjectMeta, image.AnnotationReplicaUsed, time.Now().UTC().Format(time.RFC3339))
	return client.IgnoreNotFound(r.Patch(ctx, d, patch))
}
