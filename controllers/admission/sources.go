package admission

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
// source namespace's owner consented: its creator may create datavolumes/source
// (cdi.kubevirt.io) there, CDI's rule for the same copy, or the source is an image its owner
// labelled public. diskpipe copies with its own rights, so without this check a namespace
// could read any other's disks; and reading an object is not owning it (the built-in view
// role may get every PVC and image of a namespace), so get is not enough.
type sourceGuard struct {
	client  client.Client
	decoder admission.Decoder
	// self is the manager's user name: what it makes (a VM's disks, a DataVolume's) copies a
	// source its maker's consent was asked for, when the VM or DataVolume was admitted.
	self string
}

// source is a cross-namespace source: what the user must be allowed to get.
type source struct {
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
	if req.UserInfo.Username == h.self {
		return admission.Allowed("made by diskpipe for an object whose source was checked when it was admitted")
	}
	if src.cdi {
		return h.checkClone(ctx, req, src)
	}
	return h.check(ctx, req, src)
}

// checkClone admits a DataVolume made from another namespace's PVC, snapshot or DataSource
// by CDI's rule: its user may create datavolumes/source in that namespace (CDI's
// ClusterRoles grant it; KubeVirt's virt-controller has it, and KubeVirt checks the user who
// made the VM). A DataSource naming another namespace's source is held to the same rule: its
// status would otherwise tell anyone whether a PVC or snapshot of any namespace exists, and
// whether it is ready. An update is checked only when it changes the source.
func (h *sourceGuard) checkClone(ctx context.Context, req admission.Request, src *source) admission.Response {
	if req.Operation == admissionv1.Update {
		var was *source
		switch req.Kind.Kind {
		case "DataSource":
			old := &cdiv1.DataSource{}
			if err := h.decoder.DecodeRaw(req.OldObject, old); err != nil {
				return admission.Errored(http.StatusBadRequest, err)
			}
			was = dataSourceSource(old)
		default:
			old := &cdiv1.DataVolume{}
			if err := h.decoder.DecodeRaw(req.OldObject, old); err != nil {
				return admission.Errored(http.StatusBadRequest, err)
			}
			was = dataVolumeSource(old)
		}
		if was != nil && *was == *src {
			return admission.Allowed("the source is unchanged")
		}
	}
	return h.consent(ctx, req, src)
}

// consent admits copying src, in another namespace than the request's, for the request's user
// when that namespace's owner consented: CDI's rule, create on datavolumes/source
// (cdi.kubevirt.io) in the source's namespace, one rule for every path (images, disks, VMs,
// DataVolumes). The chart's user role holds it in the namespaces it is bound in.
func (h *sourceGuard) consent(ctx context.Context, req admission.Request, src *source) admission.Response {
	allowed, err := review(ctx, h.client, req, authorizationv1.ResourceAttributes{Namespace: src.namespace, Verb: "create",
		Group: cdiv1.SchemeGroupVersion.Group, Resource: "datavolumes", Subresource: "source"})
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("asking whether %s may copy from %s: %w", req.UserInfo.Username, src.namespace, err))
	}
	if !allowed {
		return denied("%s may not copy the %s %s/%s into namespace %s: copying another namespace's data needs its owner's consent, "+
			"create on datavolumes/source (cdi.kubevirt.io) in %s (CDI's rule; diskpipe's user role holds it where it is bound)%s",
			req.UserInfo.Username, src.kind, src.namespace, src.name, req.Namespace, src.namespace, publicHint(src))
	}
	return admission.Allowed("the source's namespace lets the user copy from it")
}

// publicHint says, for an image, how its owner makes it public.
func publicHint(src *source) string {
	if src.image == nil {
		return ""
	}
	return fmt.Sprintf(", or the image labelled %s: \"yes\" by its owner", virtualmachine.LabelImagePublic)
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

// dataSourceSource is what a DataSource names in another namespace than its own, if anything.
func dataSourceSource(ds *cdiv1.DataSource) *source {
	s := &source{cdi: true}
	switch src := ds.Spec.Source; {
	case src.PVC != nil:
		s.kind, s.namespace, s.name = "PersistentVolumeClaim", src.PVC.Namespace, src.PVC.Name
	case src.Snapshot != nil:
		s.kind, s.namespace, s.name = "VolumeSnapshot", src.Snapshot.Namespace, src.Snapshot.Name
	case src.DataSource != nil:
		s.kind, s.namespace, s.name = "DataSource", src.DataSource.Namespace, src.DataSource.Name
	}
	if s.namespace == "" || s.namespace == ds.Namespace {
		return nil
	}
	return s
}

// check admits copying src, in another namespace than the request's, for the request's user:
// a public image, or with the source namespace's consent.
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
	return h.consent(ctx, req, src)
}

// imageSource is the golden image a disk is made from, as a source to check.
func imageSource(img *diskvolume.ImageSource) *source {
	obj, _ := image.NewObject(img.Kind)
	s := &source{kind: string(diskvolume.ImageKindVirtualMachineImage), namespace: img.Namespace, name: string(img.Name), image: obj}
	if img.Kind == diskvolume.ImageKindImageTemplate {
		s.kind = string(img.Kind)
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
			return &source{kind: "ImageTemplate", namespace: c.Namespace, name: string(c.Name), image: &virtualmachine.ImageTemplate{}}, nil
		}
		if d := t.Spec.Source.Disk; d != nil && d.Namespace != "" {
			return &source{kind: "DiskVolume", namespace: d.Namespace, name: string(d.Name)}, nil
		}
	case "DataVolume":
		dv := &cdiv1.DataVolume{}
		if err := h.decoder.Decode(req, dv); err != nil {
			return nil, err
		}
		return dataVolumeSource(dv), nil
	case "DataSource":
		ds := &cdiv1.DataSource{}
		if err := h.decoder.Decode(req, ds); err != nil {
			return nil, err
		}
		return dataSourceSource(ds), nil
	case "VirtualMachineImage":
		v := &hypercloud.VirtualMachineImage{}
		if err := h.decoder.Decode(req, v); err != nil {
			return nil, err
		}
		if p := v.Spec.Source.PVC; p != nil && p.Namespace != "" {
			return &source{kind: "PersistentVolumeClaim", namespace: p.Namespace, name: string(p.Name)}, nil
		}
	}
	return nil, nil
}
