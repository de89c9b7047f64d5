package admission

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/image"
	"github.com/diskpipe/diskpipe/internal/authz"
)

// sourceGuard admits a disk or image whose source is in another namespace only when the
// user creating it may read that source, or the source is a public image. diskpipe copies
// with its own rights, so without this check a namespace could read any other's disks.
type sourceGuard struct {
	client  client.Client
	decoder admission.Decoder
}

// source is a cross-namespace source: what the user must be allowed to get.
type source struct {
	resource        schema.GroupVersionResource
	kind            string
	namespace, name string
	// image is set for sources that may be public images.
	image client.Object
	// cdi is set for a DataVolume's source, which CDI's rule guards instead of get.
	cdi bool
}

func (h *sourceGuard) Handle(ctx context.Context, req admission.Request) admission.Response {
	src, err := h.crossNamespaceSource(req)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if src == nil || src.namespace == req.Namespace {
		return admission.Allowed("")
	}
	if src.cdi {
		return h.checkClone(ctx, req, src)
	}
	return h.check(ctx, req, src)
}

// checkClone admits a DataVolume made from another namespace's PVC, snapshot or DataSource
// by CDI's rule: its user may create datavolumes/source in that namespace (CDI's
// ClusterRoles grant it; KubeVirt's virt-controller has it, and KubeVirt checks the user who
// made the VM). An update is checked only when it changes the source.
func (h *sourceGuard) checkClone(ctx context.Context, req admission.Request, src *source) admission.Response {
	if req.Operation == admissionv1.Update {
		old := &cdiv1.DataVolume{}
		if err := h.decoder.DecodeRaw(req.OldObject, old); err != nil {
			return admission.Errored(http.StatusBadRequest, err)
		}
		if was := dataVolumeSource(old); was != nil && *was == *src {
			return admission.Allowed("the source is unchanged")
		}
	}
	allowed, err := review(ctx, h.client, req, authorizationv1.ResourceAttributes{Namespace: src.namespace, Verb: "create",
		Group: cdiv1.SchemeGroupVersion.Group, Resource: "datavolumes", Subresource: "source"})
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("asking whether %s may clone from %s: %w", req.UserInfo.Username, src.namespace, err))
	}
	if !allowed {
		return denied("%s may not clone the %s %s/%s into namespace %s: CDI's rule asks for create on datavolumes/source "+
			"(cdi.kubevirt.io) in %s", req.UserInfo.Username, src.kind, src.namespace, src.name, req.Namespace, src.namespace)
	}
	return admission.Allowed("the user may clone from the source's namespace")
}

// dataVolumeSource is what a DataVolume is made from in another namespace than its own, if
// anything.
func dataVolumeSource(dv *cdiv1.DataVolume) *source {
	s := &source{cdi: true}
	switch src, ref := dv.Spec.Source, dv.Spec.SourceRef; {
	case ref != nil && ref.Namespace != nil:
		s.kind, s.namespace, s.name = "DataSource", *ref.Namespace, ref.Name
	case src != nil && src.PVC != nil:
		s.kind, s.namespace, s.name = "PersistentVolumeClaim", src.PVC.Namespace, src.PVC.Name
	case src != nil && src.Snapshot != nil:
		s.kind, s.namespace, s.name = "VolumeSnapshot", src.Snapshot.Namespace, src.Snapshot.Name
	}
	if s.namespace == "" || s.namespace == dv.Namespace {
		return nil
	}
	return s
}

// check admits reading src, in another namespace than the request's, for the request's user.
func (h *sourceGuard) check(ctx context.Context, req admission.Request, src *source) admission.Response {
	if src.image != nil {
		err := h.client.Get(ctx, client.ObjectKey{Namespace: src.namespace, Name: src.name}, src.image)
		if err != nil && !apierrors.IsNotFound(err) {
			return admission.Errored(http.StatusInternalServerError, err)
		}
		if err == nil && src.image.GetLabels()[virtualmachine.LabelImagePublic] == "yes" {
			return admission.Allowed("a public image")
		}
	}
	allowed, err := review(ctx, h.client, req, authorizationv1.ResourceAttributes{Namespace: src.namespace, Verb: "get",
		Group: src.resource.Group, Version: src.resource.Version, Resource: src.resource.Resource, Name: src.name})
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("asking whether %s may read the source: %w", req.UserInfo.Username, err))
	}
	if !allowed {
		return denied("%s may not read the %s %s/%s, so cannot copy it into namespace %s: ask for get on %s in %s, or, for an image, "+
			"have it labelled %s: \"yes\"", req.UserInfo.Username, src.kind, src.namespace, src.name, req.Namespace,
			src.resource.Resource, src.namespace, virtualmachine.LabelImagePublic)
	}
	return admission.Allowed("the user may read the source")
}

// The resources a source may be.
var (
	imageTemplates = virtualmachine.GroupVersion.WithResource("imagetemplates")
	images         = hypercloud.GroupVersion.WithResource("virtualmachineimages")
	diskVolumes    = diskvolume.GroupVersion.WithResource("diskvolumes")
	pvcs           = schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumeclaims"}
)

// imageSource is the golden image a disk is made from, as a source to check.
func imageSource(img *diskvolume.ImageSource) *source {
	obj, _ := image.NewObject(img.Kind)
	s := &source{resource: images, kind: string(diskvolume.ImageKindVirtualMachineImage), namespace: img.Namespace, name: string(img.Name), image: obj}
	if img.Kind == diskvolume.ImageKindImageTemplate {
		s.resource, s.kind = imageTemplates, string(img.Kind)
	}
	return s
}

// review asks the apiserver whether the request's user may do what attrs say.
func review(ctx context.Context, c client.Client, req admission.Request, attrs authorizationv1.ResourceAttributes) (bool, error) {
	return authz.Allowed(ctx, c, req.UserInfo, attrs)
}

// crossNamespaceSource is the object's source in another namespace, if it has one.
func (h *sourceGuard) crossNamespaceSource(req admission.Request) (*source, error) {
	switch req.Kind.Kind {
	case "DiskVolume":
		d := &diskvolume.DiskVolume{}
		if err := h.decoder.Decode(req, d); err != nil {
			return nil, err
		}
		if img := d.Spec.Source.Image; img != nil && img.Namespace != "" {
			return imageSource(img), nil
		}
	case "ImageTemplate":
		t := &virtualmachine.ImageTemplate{}
		if err := h.decoder.Decode(req, t); err != nil {
			return nil, err
		}
		if c := t.Spec.Source.Clone; c != nil && c.Namespace != "" {
			return &source{resource: imageTemplates, kind: "ImageTemplate", namespace: c.Namespace, name: string(c.Name), image: &virtualmachine.ImageTemplate{}}, nil
		}
		if d := t.Spec.Source.Disk; d != nil && d.Namespace != "" {
			return &source{resource: diskVolumes, kind: "DiskVolume", namespace: d.Namespace, name: string(d.Name)}, nil
		}
	case "DataVolume":
		dv := &cdiv1.DataVolume{}
		if err := h.decoder.Decode(req, dv); err != nil {
			return nil, err
		}
		return dataVolumeSource(dv), nil
	case "VirtualMachineImage":
		v := &hypercloud.VirtualMachineImage{}
		if err := h.decoder.Decode(req, v); err != nil {
			return nil, err
		}
		if p := v.Spec.Source.PVC; p != nil && p.Namespace != "" {
			return &source{resource: pvcs, kind: "PersistentVolumeClaim", namespace: p.Namespace, name: string(p.Name)}, nil
		}
	}
	return nil, nil
}
