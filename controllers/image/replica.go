package image

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
)

// The image's side of its replicas (what a replica is, and the design: controllers/goldenimage,
// replica.go): the policy that pre-warms and evicts them, the list in its status, and the
// deletion of one whose node is gone.

// keepReplicas applies the image's replica policy: a replica on each node its nodeSelector
// matches, made as soon as the image is Ready, and replicas of other nodes no disk was made
// from for evictAfter deleted. It says when to look again (0: not for eviction).
func (r *Reconciler) keepReplicas(ctx context.Context, g *goldenImage) (time.Duration, error) {
	policy := g.replicas
	if policy == nil || g.status.Phase != common.PhaseReady {
		return 0, nil
	}
	if stale, err := r.staleRevision(ctx, g); err != nil {
		return 0, err
	} else if stale {
		policy = &common.ReplicaPolicy{EvictAfter: policy.EvictAfter} // only the current revision is pre-warmed
	}
	kind := g.kind()
	golden, err := goldenimage.Lookup(ctx, r.Client, kind, g.obj.GetNamespace(), g.obj.GetName())
	if nr := (*goldenimage.NotReadyError)(nil); errors.As(err, &nr) {
		return 0, nil
	} else if err != nil {
		return 0, err
	}
	pv := &corev1.PersistentVolume{}
	if golden.PVC.Spec.VolumeName == "" {
		return 0, nil
	}
	if err := r.Get(ctx, client.ObjectKey{Name: golden.PVC.Spec.VolumeName}, pv); err != nil {
		return 0, client.IgnoreNotFound(err)
	}
	nodes := &corev1.NodeList{}
	if err := r.List(ctx, nodes); err != nil {
		return 0, err
	}
	if !storage.NodeLocal(pv, nodes.Items) {
		return 0, nil // not node-local: disks are cloned from the image's own volume
	}
	warm := labels.Nothing()
	if policy.NodeSelector != nil {
		if warm, err = metav1.LabelSelectorAsSelector(policy.NodeSelector); err != nil {
			return 0, nil // the API's validation of the selector refused worse; nothing is warmed
		}
	}
	warmed := map[string]bool{}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if !warm.Matches(labels.Set(n.Labels)) || storage.Reaches(pv, n) || !n.DeletionTimestamp.IsZero() {
			continue
		}
		warmed[n.Name] = true
		if _, err := owned.Ensure(ctx, r.Client, g.obj, goldenimage.Replica(golden, kind, n.Name)); err != nil {
			return 0, err
		}
	}
	if policy.EvictAfter == nil {
		return 0, nil
	}
	list, err := goldenimage.Replicas(ctx, r.Client, g.obj)
	if err != nil {
		return 0, err
	}
	var next time.Duration
	for _, d := range list {
		if warmed[goldenimage.ReplicaNode(d)] || !d.DeletionTimestamp.IsZero() {
			continue
		}
		used := d.CreationTimestamp.Time
		if t, err := time.Parse(time.RFC3339, d.Annotations[goldenimage.AnnotationReplicaUsed]); err == nil {
			used = t
		}
		left := time.Until(used.Add(policy.EvictAfter.Duration))
		if left > 0 {
			if next == 0 || left < next {
				next = left
			}
			continue
		}
		// Disks cloned from it are volumes of their own; one being cloned holds its PVC (the
		// provisioner's protection) until it is made.
		if err := r.Delete(ctx, d, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			return 0, err
		}
		r.Pods.Events.Eventf(g.obj, d, corev1.EventTypeNormal, "ReplicaEvicted", "Evict", "Deleted the replica %s on node %s: no disk was made from it for %s",
			d.Name, goldenimage.ReplicaNode(d), policy.EvictAfter.Duration)
	}
	return next, nil
}

// LostReplicaGrace is how long a replica's node is gone before the image deletes the replica:
// a node deleted and registered again (by an admin, a remediation, a cloud controller that
// briefly lost the instance) keeps its replica and the data on it.
var LostReplicaGrace = 10 * time.Minute

// replicas lists the image's replicas on other nodes, by node.
func (r *Reconciler) replicas(ctx context.Context, obj client.Object) ([]common.ImageReplica, time.Duration, error) {
	list, err := goldenimage.Replicas(ctx, r.Client, obj)
	if err != nil {
		return nil, 0, err
	}
	var next time.Duration
	var out []common.ImageReplica
	for _, d := range list {
		node := goldenimage.ReplicaNode(d)
		if len(node) > 253 || len(d.Name) > 63 {
			continue
		}
		// A replica on a node gone from the cluster (its disk failed NodeLost) for
		// LostReplicaGrace goes: were the node to come back later, its next disk makes a new one.
		if c := goldenimage.LostToNode(&d.Status); c != nil && d.DeletionTimestamp.IsZero() {
			if left := time.Until(c.LastTransitionTime.Add(LostReplicaGrace)); left > 0 {
				if next == 0 || left < next {
					next = left
				}
			} else {
				if err := r.Delete(ctx, d, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
					return nil, 0, err
				}
				r.Pods.Events.Eventf(obj, d, corev1.EventTypeWarning, "ReplicaLost", "Delete", "Deleted the replica %s, whose node is gone for %s: %s",
					d.Name, LostReplicaGrace, c.Message)
				continue
			}
		}
		out = append(out, common.ImageReplica{Node: node, Name: d.Name, Phase: d.Status.Phase})
	}
	slices.SortFunc(out, func(a, b common.ImageReplica) int { return strings.Compare(a.Node, b.Node) })
	return out[:min(len(out), 256)], next, nil
}

// staleRevision says whether g is a revision of a scheduled image that is not its current one.
func (r *Reconciler) staleRevision(ctx context.Context, g *goldenImage) (bool, error) {
	owner := metav1.GetControllerOf(g.obj)
	if owner == nil || owner.Kind != string(g.kind()) {
		return false, nil
	}
	parent := r.newObject()
	if err := r.Get(ctx, client.ObjectKey{Namespace: g.obj.GetNamespace(), Name: owner.Name}, parent); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	if parent.GetUID() != owner.UID {
		return false, nil
	}
	p := r.adapt(parent)
	return p.schedule != nil && (p.status.Schedule == nil || p.status.Schedule.Current != g.obj.GetName()), nil
}

// ConditionGoldenVolume says, on a Ready image whose golden volume is node-local, whether that
// volume's node is in the cluster. A node lost for good takes the golden bytes with it; the
// image stays Ready while its replicas on other nodes hold them (disks are made from those),
// and says so here rather than pretend its volume is there.
const ConditionGoldenVolume = "GoldenVolume"

// checkGoldenNode notes in a Ready image's ConditionGoldenVolume whether its golden volume is
// reached by a node of the cluster, for a node-local one (storage.Lost); an event marks each
// change.
func (r *Reconciler) checkGoldenNode(ctx context.Context, g *goldenImage) error {
	st := g.status
	if st.Phase != common.PhaseReady || st.PVCName == "" {
		return nil
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: g.obj.GetNamespace(), Name: st.PVCName}, pvc); err != nil || pvc.Spec.VolumeName == "" {
		return client.IgnoreNotFound(err)
	}
	pv := &corev1.PersistentVolume{}
	if err := r.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, pv); err != nil {
		return client.IgnoreNotFound(err)
	}
	if pv.Spec.NodeAffinity == nil || storage.Zonal(pv) {
		return nil // network storage, or a zone's: no node takes it away
	}
	nodes := &corev1.NodeList{}
	if err := r.List(ctx, nodes); err != nil {
		return err
	}
	c := metav1.Condition{Type: ConditionGoldenVolume, Status: metav1.ConditionTrue, Reason: "Reachable",
		Message: fmt.Sprintf("its volume %s is on %s, in the cluster", pv.Name, storage.Placement(pv))}
	if storage.Lost(pv, nodes.Items) {
		ready := 0
		for _, rep := range st.Replicas {
			if rep.Phase == common.PhaseReady {
				ready++
			}
		}
		c.Status, c.Reason = metav1.ConditionFalse, goldenimage.ReasonNodeLost
		c.Message = fmt.Sprintf("its volume %s is on %s, and no node of the cluster is: the golden bytes are gone with that node unless it comes back; "+
			"%d Ready replicas on other nodes hold them, and disks are made from those", pv.Name, storage.Placement(pv), ready)
		if ready == 0 {
			c.Message = fmt.Sprintf("its volume %s is on %s, and no node of the cluster is: the golden bytes are gone with that node, and no replica "+
				"on another node holds them; no disk can be made from the image unless the node comes back", pv.Name, storage.Placement(pv))
		}
	}
	if was := meta.FindStatusCondition(st.Conditions, ConditionGoldenVolume); was == nil && c.Status == metav1.ConditionTrue {
		return nil // nothing to say while nothing was lost
	} else if was == nil || was.Status != c.Status {
		kind := corev1.EventTypeNormal
		if c.Status == metav1.ConditionFalse {
			kind = corev1.EventTypeWarning
		}
		r.Pods.Events.Eventf(g.obj, nil, kind, c.Reason, "Check", "The golden volume: %s", c.Message)
	}
	meta.SetStatusCondition(&st.Conditions, c)
	return nil
}
