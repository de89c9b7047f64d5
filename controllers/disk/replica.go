package disk

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/image"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
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

// isReplica says whether d is a replica of an image (which is copied, never made of one).
func isReplica(d *vmDisk) bool { return d.obj.GetLabels()[LabelReplicaOf] != "" }

// replicaName is the name of golden's replica on node: the image's name (cut), and a hash of
// the image's UID and the node, so that neither two images nor two nodes share one; at most 63
// characters, as the name of a PVC its pods mount must be.
func replicaName(golden *image.Golden, node string) string {
	sum := sha256.Sum256([]byte(string(golden.Obj.GetUID()) + "/" + node))
	name := golden.Obj.GetName()
	if len(name) > 40 {
		name = strings.TrimRight(name[:40], ".-")
	}
	return fmt.Sprintf("replica-%s-%s", name, hex.EncodeToString(sum[:])[:12])
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
	sum := sha256.Sum256([]byte(node))
	// Of the image's size: no size of its own, so that its disk is the image's, not grown.
	replica := &diskvolume.DiskVolume{ObjectMeta: metav1.ObjectMeta{Name: replicaName(golden, node), Namespace: golden.PVC.Namespace,
		Labels:      map[string]string{LabelReplicaOf: string(golden.Obj.GetUID()), LabelReplicaNode: hex.EncodeToString(sum[:])[:40]},
		Annotations: map[string]string{AnnotationSelectedNode: node}},
		Spec: diskvolume.DiskVolumeSpec{
			Source: diskvolume.DiskVolumeSource{Image: &diskvolume.ImageSource{Name: common.LocalName(golden.Obj.GetName()), Kind: kind}},
			PVCTemplate: common.PVCTemplate{AccessModes: golden.PVC.Spec.AccessModes, VolumeOptions: common.VolumeOptions{
				StorageClassName: golden.PVC.Spec.StorageClassName, VolumeMode: golden.PVC.Spec.VolumeMode}},
			CloneStrategy: ptr.To(common.CloneStrategyHostAssisted)}}
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
