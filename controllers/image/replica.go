package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
)

// # Replicas of a node-local image
//
// On node-local storage a golden image's volume lives on one node, and a CSI clone of it is
// made only there. The first disk wanted on another node N (its node known: a claim filled
// once its VM was scheduled; controllers/disk, copySource and replicaOn) makes a replica of the
// image on N: a DiskVolume of the image in its namespace, controlled by the image, copied once
// (a clone-source pod on the image's node streams it to the importer on N) into the image's
// class on N. That disk, and every later one on N, is a CSI clone of the replica: each node
// receives the image's bytes once, and never from the origin again. A replica is made once per
// node (ReplicaName: the image's and the node's), and goes with the image. The image's
// spec.replicas pre-warms nodes and evicts replicas no disk was made from (keepReplicas); a
// replica whose node is gone goes after LostReplicaGrace (replicas).
//
// This file is the one home of replicas: what one is (IsReplica: the label, the image's
// control and diskpipe's mark; a label or an owner reference is anyone's to write), the list
// of an image's replicas (Replicas), a replica's node and volume (ReplicaNode, ReplicaPVC), and
// the note of its last use (NoteReplicaUsed). Every caller reads them through these.

// Labels of a replica: LabelReplicaOf with its image's UID; LabelReplicaNode with a hash of
// its node's name (a node's name may be longer than a label's value), which its annotation
// storage.AnnotationSelectedNode names.
const (
	LabelReplicaOf   = "diskpipe.io/replica-of"
	LabelReplicaNode = "diskpipe.io/replica-node"
)

// IsReplica says whether rep is one of img's replicas: labelled with its UID, controlled by it
// and marked as diskpipe made it for it (owned.Mine).
func IsReplica(rep, img client.Object) bool {
	return rep.GetLabels()[LabelReplicaOf] == string(img.GetUID()) && owned.Mine("DiskVolume", rep, img)
}

// Replicas lists img's replicas (IsReplica), by name, in every phase and being deleted or not.
func Replicas(ctx context.Context, c client.Reader, img client.Object) ([]*diskvolume.DiskVolume, error) {
	list := &diskvolume.DiskVolumeList{}
	if err := c.List(ctx, list, client.InNamespace(img.GetNamespace()), client.MatchingLabels{LabelReplicaOf: string(img.GetUID())}); err != nil {
		return nil, err
	}
	var out []*diskvolume.DiskVolume
	for i := range list.Items {
		if IsReplica(&list.Items[i], img) {
			out = append(out, &list.Items[i])
		}
	}
	slices.SortFunc(out, func(a, b *diskvolume.DiskVolume) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// ReplicaNode is the node a replica is on.
func ReplicaNode(rep *diskvolume.DiskVolume) string {
	return rep.Annotations[storage.AnnotationSelectedNode]
}

// ReplicaPVC is rep's volume's claim once it can be read from: diskpipe's for rep, Bound and not
// being deleted; nil while it is not.
func ReplicaPVC(ctx context.Context, c client.Reader, rep *diskvolume.DiskVolume) (*corev1.PersistentVolumeClaim, error) {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: rep.Namespace, Name: rep.Name}, pvc); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	if !pvc.DeletionTimestamp.IsZero() || pvc.Status.Phase != corev1.ClaimBound || !owned.Mine("PersistentVolumeClaim", pvc, rep) {
		return nil, nil
	}
	return pvc, nil
}

// AnnotationReplicaUsed is when a disk was last made from a replica (RFC 3339), written by the
// disk controller (NoteReplicaUsed); a replica no disk was made from yet counts from its
// creation.
const AnnotationReplicaUsed = "diskpipe.io/replica-last-used"

// NoteReplicaUsed notes on the replica whose claim pvc is that a disk is made from it now: the
// image's replica policy evicts replicas no disk was made from for a time (keepReplicas).
func NoteReplicaUsed(ctx context.Context, c client.Client, pvc *corev1.PersistentVolumeClaim) error {
	d := &diskvolume.DiskVolume{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: pvc.Namespace, Name: pvc.Name}, d); err != nil {
		return client.IgnoreNotFound(err)
	}
	patch := client.MergeFrom(d.DeepCopy())
	metav1.SetMetaDataAnnotation(&d.ObjectMeta, AnnotationReplicaUsed, time.Now().UTC().Format(time.RFC3339))
	return client.IgnoreNotFound(c.Patch(ctx, d, patch))
}

// ReasonNodeLost is the reason of a disk (a replica among them) whose volume is on a node gone
// from the cluster; the disk controller sets it, and the image deletes such a replica.
const ReasonNodeLost = "NodeLost"

// LostToNode is the Ready condition of a disk that failed because its volume's node is gone
// (ReasonNodeLost), nil for any other disk.
func LostToNode(st *common.DiskStatus) *metav1.Condition {
	c := meta.FindStatusCondition(st.Conditions, common.ConditionReady)
	if st.Phase != common.PhaseFailed || c == nil || c.Reason != ReasonNodeLost {
		return nil
	}
	return c
}

// ReplicaName is the name of golden's replica on node: the image's name (cut), and a hash of
// the image's UID and the node, so that neither two images nor two nodes share one; at most 63
// characters, as the name of a PVC its pods mount must be.
func ReplicaName(golden *Golden, node string) string {
	return replicaName(golden.Obj, node)
}

func replicaName(img client.Object, node string) string {
	sum := sha256.Sum256([]byte(string(img.GetUID()) + "/" + node))
	return fmt.Sprintf("replica-%s-%s", replicaBase(img.GetName()), hex.EncodeToString(sum[:])[:12])
}

// replicaBase is the part of an image's name its replicas' names hold.
func replicaBase(name string) string {
	if len(name) > 40 {
		name = strings.TrimRight(name[:40], ".-")
	}
	return name
}

// IsReplicaName says whether name, in namespace ns, is (or would be) the name of a replica of
// one of its images on one of the cluster's nodes. It is told by the name alone, a hash of the
// image's UID and the node, which the namespace's users can neither change on a replica nor
// make for another image, rather than by labels, annotations or marks, which they can remove
// (and put back) to make a replica look like a disk of theirs for a moment.
func IsReplicaName(ctx context.Context, c client.Reader, ns, name string) (bool, error) {
	rest, ok := strings.CutPrefix(name, "replica-")
	if !ok || len(rest) < 14 || rest[len(rest)-13] != '-' {
		return false, nil
	}
	base := rest[:len(rest)-13]
	var images []client.Object
	vmis, its := &hypercloud.VirtualMachineImageList{}, &virtualmachine.ImageTemplateList{}
	for _, list := range []client.ObjectList{vmis, its} {
		if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
			return false, err
		}
	}
	for i := range vmis.Items {
		images = append(images, &vmis.Items[i])
	}
	for i := range its.Items {
		images = append(images, &its.Items[i])
	}
	images = slices.DeleteFunc(images, func(o client.Object) bool { return replicaBase(o.GetName()) != base })
	if len(images) == 0 {
		return false, nil
	}
	nodes := &corev1.NodeList{}
	if err := c.List(ctx, nodes); err != nil {
		return false, err
	}
	for _, img := range images {
		for _, n := range nodes.Items {
			if replicaName(img, n.Name) == name {
				return true, nil
			}
		}
	}
	return false, nil
}

// Replica is golden's replica on node, as it is made: of the image's size, class, mode and
// access modes, copied (never cloned: the image's volume is on another node).
func Replica(golden *Golden, kind diskvolume.ImageKind, node string) *diskvolume.DiskVolume {
	sum := sha256.Sum256([]byte(node))
	return &diskvolume.DiskVolume{ObjectMeta: metav1.ObjectMeta{Name: ReplicaName(golden, node), Namespace: golden.PVC.Namespace,
		Labels:      map[string]string{LabelReplicaOf: string(golden.Obj.GetUID()), LabelReplicaNode: hex.EncodeToString(sum[:])[:40]},
		Annotations: map[string]string{storage.AnnotationSelectedNode: node}},
		Spec: diskvolume.DiskVolumeSpec{
			Source: diskvolume.DiskVolumeSource{Image: &diskvolume.ImageSource{Name: common.LocalName(golden.Obj.GetName()), Kind: kind}},
			PVCTemplate: common.PVCTemplate{AccessModes: golden.PVC.Spec.AccessModes, VolumeOptions: common.VolumeOptions{
				StorageClassName: golden.PVC.Spec.StorageClassName, VolumeMode: golden.PVC.Spec.VolumeMode}},
			CloneStrategy: ptr.To(common.CloneStrategyHostAssisted)}}
}

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
	golden, err := Lookup(ctx, r.Client, kind, g.obj.GetNamespace(), g.obj.GetName())
	if nr := (*NotReadyError)(nil); errors.As(err, &nr) {
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
		if _, err := owned.Ensure(ctx, r.Client, g.obj, Replica(golden, kind, n.Name)); err != nil {
			return 0, err
		}
	}
	if policy.EvictAfter == nil {
		return 0, nil
	}
	list, err := Replicas(ctx, r.Client, g.obj)
	if err != nil {
		return 0, err
	}
	var next time.Duration
	for _, d := range list {
		if warmed[ReplicaNode(d)] || !d.DeletionTimestamp.IsZero() {
			continue
		}
		used := d.CreationTimestamp.Time
		if t, err := time.Parse(time.RFC3339, d.Annotations[AnnotationReplicaUsed]); err == nil {
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
			d.Name, ReplicaNode(d), policy.EvictAfter.Duration)
	}
	return next, nil
}

// LostReplicaGrace is how long a replica's node is gone before the image deletes the replica:
// a node deleted and registered again (by an admin, a remediation, a cloud controller that
// briefly lost the instance) keeps its replica and the data on it.
var LostReplicaGrace = 10 * time.Minute

// replicas lists the image's replicas on other nodes, by node.
func (r *Reconciler) replicas(ctx context.Context, obj client.Object) ([]common.ImageReplica, time.Duration, error) {
	list, err := Replicas(ctx, r.Client, obj)
	if err != nil {
		return nil, 0, err
	}
	var next time.Duration
	var out []common.ImageReplica
	for _, d := range list {
		node := ReplicaNode(d)
		if len(node) > 253 || len(d.Name) > 63 {
			continue
		}
		// A replica on a node gone from the cluster (its disk failed NodeLost) for
		// LostReplicaGrace goes: were the node to come back later, its next disk makes a new one.
		if c := LostToNode(&d.Status); c != nil && d.DeletionTimestamp.IsZero() {
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
		c.Status, c.Reason = metav1.ConditionFalse, ReasonNodeLost
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
