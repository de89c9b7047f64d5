package image

import (
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
)

// goldenImage is what the reconciler needs of a VirtualMachineImage or an ImageTemplate: the
// two kinds differ only in the shape of their specs.
type goldenImage struct {
	obj      client.Object
	status   *common.ImageStatus
	source   source
	checksum common.Checksum
	volume   common.VolumeOptions
	retry    common.RetryLimit
	// prefix names the children, so an image and a template of one name do not collide.
	prefix string
}

func fromVirtualMachineImage(o client.Object) *goldenImage {
	v := o.(*hypercloud.VirtualMachineImage)
	g := &goldenImage{obj: v, status: &v.Status, checksum: v.Spec.Source.Checksum, volume: v.Spec.VolumeOptions,
		retry: retryOf(v.Spec.Retry), prefix: "vmim"}
	switch src := v.Spec.Source; {
	case src.HTTP != "":
		g.source = httpSource(string(src.HTTP), src.HTTPOptions)
	case src.S3 != nil:
		g.source = s3Source(src.S3)
	case src.Registry != nil:
		g.source = registrySource(src.Registry)
	case src.ObjectStore != nil:
		g.source = notYet("objectStore")
	case src.PVC != nil:
		g.source = notYet("pvc")
	default:
		g.source = notYet("upload")
	}
	return g
}

func fromImageTemplate(o client.Object) *goldenImage {
	t := o.(*virtualmachine.ImageTemplate)
	g := &goldenImage{obj: t, status: &t.Status, checksum: t.Spec.Source.Checksum, volume: t.Spec.VolumeOptions,
		retry: retryOf(t.Spec.Retry), prefix: "imt"}
	switch src := t.Spec.Source; {
	case src.HTTP != nil:
		g.source = httpSource(string(src.HTTP.URL), &src.HTTP.HTTPOptions)
	case src.S3 != nil:
		g.source = s3Source(src.S3)
	case src.Registry != nil:
		g.source = registrySource(src.Registry)
	case src.ObjectStore != nil:
		g.source = notYet("objectStore")
	case src.Clone != nil:
		g.source = notYet("clone")
	case src.Disk != nil:
		g.source = notYet("disk")
	default:
		g.source = notYet("upload")
	}
	return g
}

func retryOf(r *common.RetryLimit) common.RetryLimit {
	if r == nil {
		return common.DefaultRetryLimit
	}
	return *r
}
