package disk

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
