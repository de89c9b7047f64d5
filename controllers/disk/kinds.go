package disk

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/status"
)

// vmDisk is what the reconciler needs of a VirtualMachinePvc or a DiskVolume.
type vmDisk struct {
	obj    client.Object
	status *common.DiskStatus
	pvc    common.PVCTemplate
	// One of image, snapshot and blank is set.
	image    *diskvolume.ImageSource
	snapshot string
	blank    bool
	strategy *common.CloneStrategy
	retry    common.RetryLimit
}

func (d *vmDisk) tracked() status.Work {
	st := d.status
	return status.Work{Phase: &st.Phase, Conditions: &st.Conditions, Retries: &st.Retries, Transfer: &st.Transfer, Progress: &st.Progress}
}

// imageNamespace is the namespace of the disk's image source.
func (d *vmDisk) imageNamespace() string {
	if d.image == nil || d.image.Namespace == "" {
		return d.obj.GetNamespace()
	}
	return d.image.Namespace
}

func fromVirtualMachinePvc(o client.Object) *vmDisk {
	v := o.(*hypercloud.VirtualMachinePvc)
	return &vmDisk{obj: v, status: &v.Status, pvc: v.Spec.PVC, strategy: v.Spec.CloneStrategy, retry: retryOf(v.Spec.Retry),
		image: &diskvolume.ImageSource{Name: common.LocalName(v.Spec.VirtualMachineImageName), Kind: goldenimage.KindVirtualMachineImage}}
}

func fromDiskVolume(o client.Object) *vmDisk {
	v := o.(*diskvolume.DiskVolume)
	d := &vmDisk{obj: v, status: &v.Status, pvc: v.Spec.PVCTemplate, strategy: v.Spec.CloneStrategy, retry: retryOf(v.Spec.Retry)}
	switch src := v.Spec.Source; {
	case src.Image != nil:
		d.image = src.Image
	case src.Snap != nil:
		d.snapshot = string(src.Snap.Name)
	default:
		d.blank = true
	}
	return d
}

// claimsGoUnder are the kinds whose DiskVolumes' claims they control, as CDI's DataVolume
// controls its claim (KubeVirt reads a claim's controller to find its DataVolume: whether the
// disk is populated, its content type, its in-place restore).
var claimsGoUnder = map[schema.GroupKind]bool{{Group: "cdi.kubevirt.io", Kind: "DataVolume"}: true}

// claimController is the controller of the disk's own claim other than the disk: the disk's
// controller, when the disk is a DiskVolume made (and marked) for an object of claimsGoUnder;
// nil when the disk controls its claim itself.
func (d *vmDisk) claimController() *metav1.OwnerReference {
	ref := metav1.GetControllerOf(d.obj)
	if _, ok := d.obj.(*diskvolume.DiskVolume); !ok || ref == nil {
		return nil
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil || !claimsGoUnder[gv.WithKind(ref.Kind).GroupKind()] || !owned.Marked("DiskVolume", d.obj, ref.UID) {
		return nil
	}
	return ref
}

func retryOf(r *common.RetryLimit) common.RetryLimit {
	if r == nil {
		return common.DefaultRetryLimit
	}
	return *r
}

// imageKey indexes disks by the image they are made from: "kind/namespace/name".
func imageKey(kind diskvolume.ImageKind, ns, name string) string {
	if kind == "" {
		kind = goldenimage.KindImageTemplate // DiskVolume's default
	}
	return string(kind) + "/" + ns + "/" + name
}

// snapshotKey indexes disks by the VolumeSnapshot they are restored from.
func snapshotKey(ns, name string) string { return "VolumeSnapshot/" + ns + "/" + name }
