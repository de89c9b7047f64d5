package image

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
)

// clones lists the PVCs being cloned from g's image, which its deletion waits for. The label
// goldenimage.LabelCloneOf finds them in every namespace, but anyone may put a label on a PVC of theirs:
// a PVC counts only when diskpipe made it for a disk (its mark) whose source is this image and
// which is still being made (its status, which only the manager writes, is neither Ready nor
// Failed), so no tenant holds back the deletion of another namespace's image.
func (r *Reconciler) clones(ctx context.Context, g *goldenImage) ([]corev1.PersistentVolumeClaim, error) {
	list := &corev1.PersistentVolumeClaimList{}
	if err := r.List(ctx, list, client.MatchingLabels{goldenimage.LabelCloneOf: string(g.obj.GetUID())}); err != nil {
		return nil, err
	}
	var out []corev1.PersistentVolumeClaim
	for _, pvc := range list.Items {
		ref := owned.MadeFor("PersistentVolumeClaim", &pvc, "VirtualMachinePvc", "DiskVolume")
		if ref == nil {
			continue
		}
		kind, ns, name, err := r.diskInProgress(ctx, pvc.Namespace, ref)
		if err != nil {
			return nil, err
		}
		// A disk of a scheduled image is made from one of its revisions, g perhaps.
		parent := metav1.GetControllerOf(g.obj)
		if kind == g.kind() && ns == g.obj.GetNamespace() && (name == g.obj.GetName() || (parent != nil && parent.Kind == string(g.kind()) && name == parent.Name)) {
			out = append(out, pvc)
		}
	}
	return out, nil
}

// diskInProgress is the image the disk ref (in namespace ns) is being made from; "" when ref
// is no disk of that UID, is made from no image, or is made (or failed) already.
func (r *Reconciler) diskInProgress(ctx context.Context, ns string, ref *metav1.OwnerReference) (kind diskvolume.ImageKind, imageNS, name string, err error) {
	key := client.ObjectKey{Namespace: ns, Name: ref.Name}
	switch ref.Kind {
	case "VirtualMachinePvc":
		v := &hypercloud.VirtualMachinePvc{}
		if err := r.Get(ctx, key, v); err != nil || v.UID != ref.UID || done(&v.Status) {
			return "", "", "", client.IgnoreNotFound(err)
		}
		return goldenimage.KindVirtualMachineImage, ns, v.Spec.VirtualMachineImageName, nil
	case "DiskVolume":
		d := &diskvolume.DiskVolume{}
		if err := r.Get(ctx, key, d); err != nil || d.UID != ref.UID || d.Spec.Source.Image == nil || done(&d.Status) {
			if apierrors.IsNotFound(err) {
				err = nil
			}
			return "", "", "", err
		}
		img := d.Spec.Source.Image
		kind, imageNS = img.Kind, img.Namespace
		if kind == "" {
			kind = goldenimage.KindImageTemplate // DiskVolume's default
		}
		if imageNS == "" {
			imageNS = ns
		}
		return kind, imageNS, string(img.Name), nil
	}
	return "", "", "", nil
}

// done says whether a disk is made or failed: no longer cloned. A disk Ready before its PVC is
// bound (deferred to its VM's node, controllers/disk.deferToConsumer) is copied from the
// image when that node is known: it is done once bound (its capacity noted).
func done(st *common.DiskStatus) bool {
	return st.Phase == common.PhaseFailed || (st.Phase == common.PhaseReady && st.Capacity != nil)
}
