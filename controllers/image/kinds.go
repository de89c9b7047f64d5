package image

import (
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/status"
)

// goldenImage is what the reconciler needs of a VirtualMachineImage or an ImageTemplate: the
// two kinds differ only in the shape of their specs.
type goldenImage struct {
	obj      client.Object
	status   *common.ImageStatus
	source   source
	checksum common.Checksum
	ovaDisk  string
	volume   common.VolumeOptions
	retry    common.RetryLimit
	schedule *common.ImageSchedule
	// replicas is the image's replica policy (replica.go).
	replicas *common.ReplicaPolicy
	// revisionImage makes the image of one revision of a scheduled image's source: the same
	// kind and spec, without the schedule, a registry source pinned to digest (if not "").
	revisionImage func(digest string) client.Object
	// prefix names the children, so an image and a template of one name do not collide.
	prefix string
}

// tracked is the part of the status an importer pod moves.
func (g *goldenImage) tracked() status.Work {
	st := g.status
	return status.Work{Phase: &st.Phase, Conditions: &st.Conditions, Retries: &st.Retries, Transfer: &st.Transfer, Progress: &st.Progress}
}

// kind is the image's kind.
func (g *goldenImage) kind() diskvolume.ImageKind {
	if g.prefix == goldenimage.PrefixVirtualMachineImage {
		return goldenimage.KindVirtualMachineImage
	}
	return goldenimage.KindImageTemplate
}

func fromVirtualMachineImage(o client.Object) *goldenImage {
	v := o.(*hypercloud.VirtualMachineImage)
	g := &goldenImage{obj: v, status: &v.Status, checksum: v.Spec.Source.Checksum, ovaDisk: v.Spec.Source.OVADisk, volume: v.Spec.VolumeOptions,
		retry: retryOf(v.Spec.Retry), schedule: v.Spec.Schedule, replicas: v.Spec.Replicas, prefix: goldenimage.PrefixVirtualMachineImage}
	g.revisionImage = func(digest string) client.Object {
		c := &hypercloud.VirtualMachineImage{Spec: *v.Spec.DeepCopy()}
		c.Spec.Schedule = nil
		pinRegistry(c.Spec.Source.Registry, digest)
		return c
	}
	src := v.Spec.Source
	switch shared, ok := sharedSource(src.S3, src.Registry, src.ObjectStore); {
	case src.HTTP != "":
		g.source = httpSource(string(src.HTTP), src.HTTPOptions)
	case ok:
		g.source = shared
	case src.PVC != nil:
		g.source = copySource(copyOfPVC, namespaceOr(src.PVC.Namespace, v.Namespace), string(src.PVC.Name))
	case src.Snapshot != nil:
		g.source = copySource(copyOfSnapshot, namespaceOr(src.Snapshot.Namespace, v.Namespace), string(src.Snapshot.Name))
	case src.Chain != nil:
		g.source = chainSource(src.Chain)
	default:
		g.source = source{kind: "upload", upload: "virtualmachineimages"}
	}
	return g
}

func fromImageTemplate(o client.Object) *goldenImage {
	t := o.(*virtualmachine.ImageTemplate)
	g := &goldenImage{obj: t, status: &t.Status, checksum: t.Spec.Source.Checksum, ovaDisk: t.Spec.Source.OVADisk, volume: t.Spec.VolumeOptions,
		retry: retryOf(t.Spec.Retry), schedule: t.Spec.Schedule, replicas: t.Spec.Replicas, prefix: goldenimage.PrefixImageTemplate}
	g.revisionImage = func(digest string) client.Object {
		c := &virtualmachine.ImageTemplate{Spec: *t.Spec.DeepCopy()}
		c.Spec.Schedule = nil
		pinRegistry(c.Spec.Source.Registry, digest)
		return c
	}
	src := t.Spec.Source
	switch shared, ok := sharedSource(src.S3, src.Registry, src.ObjectStore); {
	case src.HTTP != nil:
		g.source = httpSource(string(src.HTTP.URL), &src.HTTP.HTTPOptions)
	case ok:
		g.source = shared
	case src.Clone != nil:
		g.source = copySource(copyOfImage, namespaceOr(src.Clone.Namespace, t.Namespace), string(src.Clone.Name))
	case src.Disk != nil:
		g.source = copySource(copyOfDisk, namespaceOr(src.Disk.Namespace, t.Namespace), string(src.Disk.Name))
	case src.Chain != nil:
		g.source = chainSource(src.Chain)
	default:
		g.source = source{kind: "upload", upload: "imagetemplates"}
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
		return source{kind: "objectStore", objectStore: objectStore}, true
	}
	return source{}, false
}

func namespaceOr(ns, def string) string {
	if ns == "" {
		return def
	}
	return ns
}

func retryOf(r *common.RetryLimit) common.RetryLimit {
	if r == nil {
		return common.DefaultRetryLimit
	}
	return *r
}
