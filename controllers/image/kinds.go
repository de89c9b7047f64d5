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
	src := v.Spec.Source
	switch shared, ok := sharedSource(src.S3, src.Registry, src.ObjectStore); {
	case src.HTTP != "":
		g.source = httpSource(string(src.HTTP), src.HTTPOptions)
	case ok:
		g.source = shared
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
	src := t.Spec.Source
	switch shared, ok := sharedSource(src.S3, src.Registry, src.ObjectStore); {
	case src.HTTP != nil:
		g.source = httpSource(string(src.HTTP.URL), &src.HTTP.HTTPOptions)
	case ok:
		g.source = shared
	case src.Clone != nil:
		g.source = notYet("clone")
	case src.Disk != nil:
		g.source = notYet("disk")
	default:
		g.source = notYet("upload")
	}
	return g
}

// sharedSource is a source that both kinds spell alike, if one is set.
func sharedSource(s3 *common.S3Source, registry *common.RegistrySource, objectStore *common.ObjectStoreSource) (source, bool) {
	switch {
	case s3 != nil:
		return s3Source(s3), true
	case registry != nil:
		return registrySource(registry), true
	case objectStore != nil:
		return notYet("objectStore"), true
	}
	return source{}, false
}

func retryOf(r *common.RetryLimit) common.RetryLimit {
	if r == nil {
		return common.DefaultRetryLimit
	}
	return *r
}
