package image

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/internal/hostcopy"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// NotReadyError says why a source cannot be read yet; the reader waits for it.
type NotReadyError struct{ Reason, Message string }

func (e *NotReadyError) Error() string { return e.Message }

// StoreUnavailable is a *NotReadyError for a bundled store that could not act as namespace ns
// (it is away, or refused to make the namespace's account): no pod starts until it can, and
// status says why. A permanent refusal (an external store a namespace may not use) is err.
func StoreUnavailable(ns string, err error) error {
	if te := (*transfer.Error)(nil); errors.As(err, &te) && !te.Transient {
		return err // a refusal, not a wait
	}
	return &NotReadyError{"ObjectStoreUnavailable", fmt.Sprintf("waiting for the bundled object store to act as namespace %s: %v", ns, err)}
}

// Golden is a Ready golden image and its PVC.
type Golden struct {
	Obj    client.Object
	Status *common.ImageStatus
	PVC    *corev1.PersistentVolumeClaim
}

// Deleting says whether the image is being deleted: a clone already started from it goes
// on (the image waits for it), a new one must not start.
func (g *Golden) Deleting() bool { return !g.Obj.GetDeletionTimestamp().IsZero() }

// NewObject returns an empty image of kind (ImageTemplate by default, as in DiskVolume).
func NewObject(kind diskvolume.ImageKind) (client.Object, *common.ImageStatus) {
	if kind == KindVirtualMachineImage {
		v := &hypercloud.VirtualMachineImage{}
		return v, &v.Status
	}
	t := &virtualmachine.ImageTemplate{}
	return t, &t.Status
}

// Lookup finds a Ready image and its golden PVC; a missing or unfinished one is a
// *NotReadyError. For a scheduled image, it is the image of the current revision.
func Lookup(ctx context.Context, c client.Reader, kind diskvolume.ImageKind, ns, name string) (*Golden, error) {
	obj, st := NewObject(kind)
	if kind == "" {
		kind = KindImageTemplate
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &NotReadyError{"SourceNotFound", fmt.Sprintf("the %s %s/%s does not exist", kind, ns, name)}
		}
		return nil, err
	}
	if ss := st.Schedule; ss != nil {
		// A scheduled image: disks are made from the image of its newest Ready revision.
		if ss.Current == "" {
			return nil, &NotReadyError{"SourceNotReady", fmt.Sprintf("the %s %s/%s has no Ready revision yet (%s)", kind, ns, name, phaseOf(st.Phase))}
		}
		return Lookup(ctx, c, kind, ns, ss.Current)
	}
	// An image being deleted has phase Deleting; if it was imported, its clones go on.
	if st.CompletionTime == nil || st.PVCName == "" || st.Phase == common.PhaseFailed {
		return nil, &NotReadyError{"SourceNotReady", fmt.Sprintf("the %s %s/%s is %s, not Ready yet", kind, ns, name, phaseOf(st.Phase))}
	}
	pvc, err := lookupPVC(ctx, c, ns, st.PVCName)
	if err != nil {
		return nil, err
	}
	return &Golden{Obj: obj, Status: st, PVC: pvc}, nil
}

func phaseOf(p common.Phase) string {
	if p == "" {
		return "new"
	}
	return string(p)
}

func lookupPVC(ctx context.Context, c client.Reader, ns, name string) (*corev1.PersistentVolumeClaim, error) {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pvc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &NotReadyError{"SourceNotFound", fmt.Sprintf("the PVC %s/%s does not exist", ns, name)}
		}
		return nil, err
	}
	return pvc, nil
}

// IsBlock says whether a PVC is a block volume.
func IsBlock(pvc *corev1.PersistentVolumeClaim) bool {
	return pvc.Spec.VolumeMode != nil && *pvc.Spec.VolumeMode == corev1.PersistentVolumeBlock
}

// copySourcePVC finds the PVC a copy reads: for a snapshot, the claim restored from it for
// owner's copy (into a volume of storage class into), made the first time.
func copySourcePVC(ctx context.Context, c client.Client, live client.Reader, owner client.Object, ref *copyRef, into string) (*corev1.PersistentVolumeClaim, error) {
	switch ref.what {
	case copyOfSnapshot:
		pvc, err := hostcopy.Restore(ctx, c, live, owner, ref.namespace, ref.name, into)
		if w := (*hostcopy.SnapshotWait)(nil); errors.As(err, &w) {
			return nil, &NotReadyError{w.Reason, w.Message}
		}
		if no := (*owned.ErrNotOwned)(nil); errors.As(err, &no) {
			return nil, &NotReadyError{"NameTaken", no.Error() + " (the snapshot is restored under that name)"}
		}
		return pvc, err
	case copyOfImage:
		g, err := Lookup(ctx, c, KindImageTemplate, ref.namespace, ref.name)
		if err != nil {
			return nil, err
		}
		if g.Deleting() {
			return nil, &NotReadyError{"SourceDeleting", fmt.Sprintf("the ImageTemplate %s/%s is being deleted", ref.namespace, ref.name)}
		}
		return g.PVC, nil
	case copyOfDisk:
		d := &diskvolume.DiskVolume{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ref.namespace, Name: ref.name}, d); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, &NotReadyError{"SourceNotFound", fmt.Sprintf("the DiskVolume %s/%s does not exist", ref.namespace, ref.name)}
			}
			return nil, err
		}
		if d.Status.Phase != common.PhaseReady || d.Status.PVCName == "" {
			return nil, &NotReadyError{"SourceNotReady", fmt.Sprintf("the DiskVolume %s/%s is %s, not Ready yet", ref.namespace, ref.name, phaseOf(d.Status.Phase))}
		}
		return lookupPVC(ctx, c, ref.namespace, d.Status.PVCName)
	default:
		return lookupPVC(ctx, c, ref.namespace, ref.name)
	}
}
