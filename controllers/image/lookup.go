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
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/hostcopy"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
)

// copySourcePVC finds the PVC a copy reads: for a snapshot, the claim restored from it for
// owner's copy (into a volume of storage class into), made the first time.
func copySourcePVC(ctx context.Context, c client.Client, live client.Reader, owner client.Object, ref *copyRef, into string) (*corev1.PersistentVolumeClaim, error) {
	switch ref.what {
	case copyOfSnapshot:
		pvc, err := hostcopy.Restore(ctx, c, live, owner, ref.namespace, ref.name, into)
		if w := (*hostcopy.SnapshotWait)(nil); errors.As(err, &w) {
			return nil, &goldenimage.NotReadyError{Reason: w.Reason, Message: w.Message}
		}
		if no := (*owned.ErrNotOwned)(nil); errors.As(err, &no) {
			return nil, &goldenimage.NotReadyError{Reason: "NameTaken", Message: no.Error() + " (the snapshot is restored under that name)"}
		}
		return pvc, err
	case copyOfImage:
		g, err := goldenimage.Lookup(ctx, c, goldenimage.KindImageTemplate, ref.namespace, ref.name)
		if err != nil {
			return nil, err
		}
		if g.Deleting() {
			return nil, &goldenimage.NotReadyError{Reason: "SourceDeleting", Message: fmt.Sprintf("the ImageTemplate %s/%s is being deleted", ref.namespace, ref.name)}
		}
		return g.PVC, nil
	case copyOfDisk:
		d := &diskvolume.DiskVolume{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ref.namespace, Name: ref.name}, d); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, &goldenimage.NotReadyError{Reason: "SourceNotFound", Message: fmt.Sprintf("the DiskVolume %s/%s does not exist", ref.namespace, ref.name)}
			}
			return nil, err
		}
		if d.Status.Phase != common.PhaseReady || d.Status.PVCName == "" {
			return nil, &goldenimage.NotReadyError{Reason: "SourceNotReady", Message: fmt.Sprintf("the DiskVolume %s/%s is %s, not Ready yet", ref.namespace, ref.name, goldenimage.PhaseOf(d.Status.Phase))}
		}
		return goldenimage.LookupPVC(ctx, c, ref.namespace, d.Status.PVCName)
	default:
		return goldenimage.LookupPVC(ctx, c, ref.namespace, ref.name)
	}
}
