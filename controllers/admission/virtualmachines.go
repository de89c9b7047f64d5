package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
)

// vmGuard admits a VirtualMachine (virtualmachine.kubesphere.io) only when its author may do
// everything the manager then does for them with its own rights: create (or update) the
// KubeVirt VirtualMachine, read each diskVolumeTemplate's image in another namespace, and
// use each volume its hardware names. Without it the kind is a confused deputy: a user allowed
// to create a VirtualMachine would get a KubeVirt VM, another namespace's image, a Secret or
// a node's files.
type vmGuard struct {
	sources       *sourceGuard
	decoder       admission.Decoder
	allowHostDisk bool
}

// AllowHostDiskValue is the chart value that lets VirtualMachines use hostDisk volumes.
const AllowHostDiskValue = "virtualMachines.allowHostDisk"

func (h *vmGuard) Handle(ctx context.Context, req admission.Request) admission.Response {
	vm := &virtualmachine.VirtualMachine{}
	if err := h.decoder.Decode(req, vm); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	verb := "create"
	if req.Operation == admissionv1.Update {
		verb = "update"
	}
	if n := checksOf(vm); n > MaxChecks {
		return denied("the VirtualMachine names %d volumes and disk templates that each need a check of its author's rights; at most %d are checked in one request", n, MaxChecks)
	}
	kubevirtVMs := schema.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"}
	if r := h.may(ctx, req, verb, kubevirtVMs, "", vm.Name, "the KubeVirt VirtualMachine it makes"); r != nil {
		return *r
	}
	for _, t := range vm.Spec.DiskVolumeTemplates {
		img := t.Spec.Source.Image
		if img == nil || img.Namespace == "" || img.Namespace == req.Namespace {
			continue
		}
		if r := h.sources.check(ctx, req, imageSource(img)); !r.Allowed {
			return r
		}
	}
	var hw struct {
		Volumes []kubevirtv1.Volume `json:"volumes"`
	}
	if err := json.Unmarshal(vm.Spec.Hardware.Raw, &hw); err != nil {
		return admission.Allowed("") // not a VMI spec: the controller fails it with InvalidHardware
	}
	for _, v := range hw.Volumes {
		if v.HostDisk != nil && !h.allowHostDisk {
			return denied("volume %q of spec.hardware is a hostDisk (%s on the node): VirtualMachines may not reach the node's files unless the chart's %s is true",
				v.Name, v.HostDisk.Path, AllowHostDiskValue)
		}
		for _, use := range volumeUses(v) {
			if r := h.may(ctx, req, use.verb, use.resource, use.subresource, use.name, fmt.Sprintf("volume %q of spec.hardware", v.Name)); r != nil {
				return *r
			}
		}
	}
	return admission.Allowed("the author may do what the VirtualMachine does")
}

// MaxChecks bounds the SubjectAccessReviews one admission request makes: each is a request to
// the apiserver, and anyone who reaches the webhook's port may send a review.
const MaxChecks = 256

// checksOf counts the SubjectAccessReviews vm's admission asks, at most.
func checksOf(vm *virtualmachine.VirtualMachine) int {
	n := 1 + len(vm.Spec.DiskVolumeTemplates)
	var hw struct {
		Volumes []kubevirtv1.Volume `json:"volumes"`
	}
	if json.Unmarshal(vm.Spec.Hardware.Raw, &hw) == nil {
		for _, v := range hw.Volumes {
			n += len(volumeUses(v))
		}
	}
	return n
}

// use is what a volume does with the author's namespace's objects.
type use struct {
	verb              string
	resource          schema.GroupVersionResource
	subresource, name string
}

var (
	secrets         = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	configMaps      = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	serviceAccounts = schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}
	claims          = schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumeclaims"}
	dataVolumes     = schema.GroupVersionResource{Group: "cdi.kubevirt.io", Version: "v1beta1", Resource: "datavolumes"}
)

// volumeUses lists the objects a KubeVirt volume exposes to the guest: a Secret's or a
// ConfigMap's content, a service account's token, a PVC's disk.
func volumeUses(v kubevirtv1.Volume) []use {
	var out []use
	get := func(r schema.GroupVersionResource, name string) {
		if name != "" {
			out = append(out, use{verb: "get", resource: r, name: name})
		}
	}
	switch s := v.VolumeSource; {
	case s.Secret != nil:
		get(secrets, s.Secret.SecretName)
	case s.ConfigMap != nil:
		get(configMaps, s.ConfigMap.Name)
	case s.ServiceAccount != nil:
		out = append(out, use{verb: "create", resource: serviceAccounts, subresource: "token", name: s.ServiceAccount.ServiceAccountName})
	case s.PersistentVolumeClaim != nil:
		get(claims, s.PersistentVolumeClaim.ClaimName)
	case s.Ephemeral != nil && s.Ephemeral.PersistentVolumeClaim != nil:
		get(claims, s.Ephemeral.PersistentVolumeClaim.ClaimName)
	case s.DataVolume != nil:
		get(dataVolumes, s.DataVolume.Name)
	case s.CloudInitNoCloud != nil:
		if r := s.CloudInitNoCloud.UserDataSecretRef; r != nil {
			get(secrets, r.Name)
		}
		if r := s.CloudInitNoCloud.NetworkDataSecretRef; r != nil {
			get(secrets, r.Name)
		}
	case s.CloudInitConfigDrive != nil:
		if r := s.CloudInitConfigDrive.UserDataSecretRef; r != nil {
			get(secrets, r.Name)
		}
		if r := s.CloudInitConfigDrive.NetworkDataSecretRef; r != nil {
			get(secrets, r.Name)
		}
	case s.Sysprep != nil:
		if r := s.Sysprep.Secret; r != nil {
			get(secrets, r.Name)
		}
		if r := s.Sysprep.ConfigMap; r != nil {
			get(configMaps, r.Name)
		}
	case s.MemoryDump != nil:
		get(claims, s.MemoryDump.ClaimName)
	}
	return out
}

// may asks the apiserver whether the request's user may verb the resource's object name in the
// request's namespace; a refusal names what for and what to ask for.
func (h *vmGuard) may(ctx context.Context, req admission.Request, verb string, r schema.GroupVersionResource, sub, name, what string) *admission.Response {
	allowed, err := review(ctx, h.sources.client, req, authorizationv1.ResourceAttributes{Namespace: req.Namespace, Verb: verb,
		Group: r.Group, Version: r.Version, Resource: r.Resource, Subresource: sub, Name: name})
	if err != nil {
		resp := admission.Errored(http.StatusInternalServerError, fmt.Errorf("asking whether %s may %s %s: %w", req.UserInfo.Username, verb, r.Resource, err))
		return &resp
	}
	if allowed {
		return nil
	}
	resource := r.Resource
	if r.Group != "" {
		resource += "." + r.Group
	}
	if sub != "" {
		resource += "/" + sub
	}
	resp := denied("%s may not %s %s %s in %s, which %s needs: ask for %s on %s in %s",
		req.UserInfo.Username, verb, resource, name, req.Namespace, what, verb, resource, req.Namespace)
	return &resp
}
