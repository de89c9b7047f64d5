// Package goldenimage is what every controller reads of a golden image, apart from the image
// reconcilers (controllers/image) that make them: the image and its golden PVC (Lookup,
// Golden), why one cannot be read yet (NotReadyError), the names and labels of its children
// (names.go), its golden snapshot (snapshot.go) and its replicas on other nodes (replica.go).
// The disk, CDI, export, populator and admission code import this package, not the
// reconcilers.
package goldenimage

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
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// NotReadyError says why a source cannot be read yet; the reader waits for it.
type NotReadyError struct{ Reason, Message string }

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
			return nil, &NotReadyError{"SourceNotReady", fmt.Sprintf("the %s %s/%s has no Ready revision yet (%s)", kind, ns, name, PhaseOf(st.Phase))}
		}
		return Lookup(ctx, c, kind, ns, ss.Current)
	}
	// An image being deleted has phase Deleting; if it was imported, its clones go on.
	if st.CompletionTime == nil || st.PVCName == "" || st.Phase == common.PhaseFailed {
		return nil, &NotReadyError{"SourceNotReady", fmt.Sprintf("the %s %s/%s is %s, not Ready yet", kind, ns, name, PhaseOf(st.Phase))}
	}
	pvc, err := LookupPVC(ctx, c, ns, st.PVCName)
	if err != nil {
		return nil, err
	}
	return &Golden{Obj: obj, Status: st, PVC: pvc}, nil
}

// PhaseOf is a phase as a message says it ("new" for none yet).
func PhaseOf(p common.Phase) string {
	if p == "" {
		return "new"
	}
	return string(p)
}

// LookupPVC is the PVC ns/name; a *NotReadyError (SourceNotFound) while there is none.
func LookupPVC(ctx context.Context, c client.Reader, ns, name string) (*corev1.PersistentVolumeClaim, error) {
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

func (e *NotReadyError) Error() string { return e.Message }

// Deleting says whether the image is being deleted: a clone already started from it goes
// on (the image waits for it), a new one must not start.
func (g *Golden) Deleting() bool { return !g.Obj.GetDeletionTimestamp().IsZero() }
