package goldenimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
// spec.replicas pre-warms nodes and evicts replicas no disk was made from (controllers/image, keepReplicas); a
// replica whose node is gone goes after LostReplicaGrace (replicas).
//
// This file is the one home of what a replica is: IsReplica (the label, the image's control and
// diskpipe's mark; a label or an owner reference is anyone's to write), the list of an image's
// replicas (Replicas), a replica's name, node and volume (ReplicaName, ReplicaNode,
// ReplicaPVC), and the note of its last use (NoteReplicaUsed). Every caller reads them through
// these: the image's policy and status (controllers/image/replica.go), and the disk side
// (controllers/disk/replica.go).

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
// image's replica policy evicts replicas no disk was made from for a time (controllers/image).
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
