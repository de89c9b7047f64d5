package admission

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/internal/authz"
)

// A SourceKind is a kind whose objects may be made from a source in another namespace, which
// the sources webhook checks: the engine's kinds (engineKinds), and those of a tree that
// serves another API, given to Register and Configuration (CDI's: controllers/cdi/policy).
type SourceKind struct {
	Resource schema.GroupVersionResource
	Kind     string
	// New is an empty object of the kind.
	New func() client.Object
	// Source is what the object is made from in another namespace than its own, nil if none.
	Source func(client.Object) *Source
	// Updates are checked too, when they change the source.
	Updates bool
}

// A Source is what an object is made from in another namespace: what its user must be
// allowed to copy.
type Source struct {
	Kind, Namespace, Name string
	// Image is set, an empty object of its kind, for sources that may be public images.
	Image client.Object
}

// engineKinds are the engine's kinds that may name a source in another namespace.
var engineKinds = []SourceKind{
	{Resource: diskvolume.GroupVersion.WithResource("diskvolumes"), Kind: "DiskVolume",
		New: func() client.Object { return &diskvolume.DiskVolume{} },
		Source: func(o client.Object) *Source {
			if img := o.(*diskvolume.DiskVolume).Spec.Source.Image; img != nil && img.Namespace != "" {
				return imageSource(img)
			}
			return nil
		}},
	{Resource: virtualmachine.GroupVersion.WithResource("imagetemplates"), Kind: "ImageTemplate",
		New: func() client.Object { return &virtualmachine.ImageTemplate{} },
		Source: func(o client.Object) *Source {
			t := o.(*virtualmachine.ImageTemplate)
			if c := t.Spec.Source.Clone; c != nil && c.Namespace != "" {
				return &Source{Kind: "ImageTemplate", Namespace: c.Namespace, Name: string(c.Name), Image: &virtualmachine.ImageTemplate{}}
			}
			if d := t.Spec.Source.Disk; d != nil && d.Namespace != "" {
				return &Source{Kind: "DiskVolume", Namespace: d.Namespace, Name: string(d.Name)}
			}
			return nil
		}},
	{Resource: hypercloud.GroupVersion.WithResource("virtualmachineimages"), Kind: "VirtualMachineImage",
		New: func() client.Object { return &hypercloud.VirtualMachineImage{} },
		Source: func(o client.Object) *Source {
			src := o.(*hypercloud.VirtualMachineImage).Spec.Source
			if p := src.PVC; p != nil && p.Namespace != "" {
				return &Source{Kind: "PersistentVolumeClaim", Namespace: p.Namespace, Name: string(p.Name)}
			}
			if s := src.Snapshot; s != nil && s.Namespace != "" {
				return &Source{Kind: "VolumeSnapshot", Namespace: s.Namespace, Name: string(s.Name)}
			}
			return nil
		}},
}

// sourceGuard admits a disk or image whose source is in another namespace only when the
// source namespace's owner consented: its creator may create datavolumes/source
// (cdi.kubevirt.io) there, CDI's rule for the same copy, or the source is an image its owner
// labelled public. diskpipe copies with its own rights, so without this check a namespace
// could read any other's disks; and reading an object is not owning it (the built-in view
// role may get every PVC and image of a namespace), so get is not enough. An update of a kind
// whose updates are checked is admitted when it leaves the source as it was.
type sourceGuard struct {
	client  client.Client
	decoder admission.Decoder
	// self is the manager's user name: what it makes (a VM's disks, a DataVolume's) copies a
	// source its maker's consent was asked for, when the VM or DataVolume was admitted.
	self string
	// kinds are the kinds checked, by kind.
	kinds map[string]SourceKind
}

func (h *sourceGuard) Handle(ctx context.Context, req admission.Request) admission.Response {
	k, ok := h.kinds[req.Kind.Kind]
	if !ok {
		return admission.Allowed("")
	}
	obj := k.New()
	if err := h.decoder.Decode(req, obj); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	src := k.Source(obj)
	if src == nil || src.Namespace == req.Namespace {
		return admission.Allowed("")
	}
	if req.UserInfo.Username == h.self {
		return admission.Allowed("made by diskpipe for an object whose source was checked when it was admitted")
	}
	if req.Operation == admissionv1.Update {
		old := k.New()
		if err := h.decoder.DecodeRaw(req.OldObject, old); err != nil {
			return admission.Errored(http.StatusBadRequest, err)
		}
		if was := k.Source(old); was != nil && was.Kind == src.Kind && was.Namespace == src.Namespace && was.Name == src.Name {
			return admission.Allowed("the source is unchanged")
		}
	}
	return h.check(ctx, req, src)
}

// consent admits copying src, in another namespace than the request's, for the request's user
// when that namespace's owner consented: CDI's rule, create on datavolumes/source
// (cdi.kubevirt.io) in the source's namespace, one rule for every path (images, disks, VMs,
// DataVolumes). The chart's user role holds it in the namespaces it is bound in.
func (h *sourceGuard) consent(ctx context.Context, req admission.Request, src *Source) admission.Response {
	allowed, err := review(ctx, h.client, req, authorizationv1.ResourceAttributes{Namespace: src.Namespace, Verb: "create",
		Group: "cdi.kubevirt.io", Resource: "datavolumes", Subresource: "source"})
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("asking whether %s may copy from %s: %w", req.UserInfo.Username, src.Namespace, err))
	}
	if !allowed {
		return denied("%s may not copy the %s %s/%s into namespace %s: copying another namespace's data needs its owner's consent, "+
			"create on datavolumes/source (cdi.kubevirt.io) in %s (CDI's rule; diskpipe's user role holds it where it is bound)%s",
			req.UserInfo.Username, src.Kind, src.Namespace, src.Name, req.Namespace, src.Namespace, publicHint(src))
	}
	return admission.Allowed("the source's namespace lets the user copy from it")
}

// publicHint says, for an image, how its owner makes it public.
func publicHint(src *Source) string {
	if src.Image == nil {
		return ""
	}
	return fmt.Sprintf(", or the image labelled %s: \"yes\" by its owner", virtualmachine.LabelImagePublic)
}

// check admits copying src, in another namespace than the request's, for the request's user:
// a public image, or with the source namespace's consent.
func (h *sourceGuard) check(ctx context.Context, req admission.Request, src *Source) admission.Response {
	if src.Image != nil {
		err := h.client.Get(ctx, client.ObjectKey{Namespace: src.Namespace, Name: src.Name}, src.Image)
		if err != nil && !apierrors.IsNotFound(err) {
			return admission.Errored(http.StatusInternalServerError, err)
		}
		if err == nil {
			switch public, err := h.public(ctx, src.Image); {
			case err != nil:
				return admission.Errored(http.StatusInternalServerError, err)
			case public:
				return admission.Allowed("a public image")
			}
		}
	}
	return h.consent(ctx, req, src)
}

// public says whether img is public: labelled so by its owner and, for a revision of a
// scheduled image (controlled by another image), its parent labelled so too. A revision takes
// its parent's labels when it is made; a parent made private later keeps its revisions so.
func (h *sourceGuard) public(ctx context.Context, img client.Object) (bool, error) {
	if img.GetLabels()[virtualmachine.LabelImagePublic] != "yes" {
		return false, nil
	}
	ref := metav1.GetControllerOf(img)
	if ref == nil || !goldenimage.IsKind(ref.Kind) {
		return true, nil
	}
	parent, _ := goldenimage.NewObject(diskvolume.ImageKind(ref.Kind))
	switch err := h.client.Get(ctx, client.ObjectKey{Namespace: img.GetNamespace(), Name: ref.Name}, parent); {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, err
	}
	return parent.GetUID() == ref.UID && parent.GetLabels()[virtualmachine.LabelImagePublic] == "yes", nil
}

// imageSource is the golden image a disk is made from, as a source to check.
func imageSource(img *diskvolume.ImageSource) *Source {
	obj, _ := goldenimage.NewObject(img.Kind)
	s := &Source{Kind: string(diskvolume.ImageKindVirtualMachineImage), Namespace: img.Namespace, Name: string(img.Name), Image: obj}
	if img.Kind == diskvolume.ImageKindImageTemplate {
		s.Kind = string(img.Kind)
	}
	return s
}

// review asks the apiserver whether the request's user may do what attrs say.
func review(ctx context.Context, c client.Client, req admission.Request, attrs authorizationv1.ResourceAttributes) (bool, error) {
	return authz.Allowed(ctx, c, req.UserInfo, attrs)
}
