package gateway

import (
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"

	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
)

// kind is one kind a resource of the gateway serves, and its API resource.
type kind struct {
	gvk      schema.GroupVersionKind
	resource string // plural, as RBAC names it
}

// gvr is the kind's group, version and resource.
func (k kind) gvr() schema.GroupVersionResource { return k.gvk.GroupVersion().WithResource(k.resource) }

// qualified is the resource as RBAC and the apiserver's messages name it: diskvolumes.diskvolume.kubesphere.io.
func (k kind) qualified() string { return k.resource + "." + k.gvk.Group }

// resources are the gateway's resources: each a list of the kinds it is made of, in the order
// a name is looked for when no ?kind= says which.
var resources = map[string][]kind{
	"images": {
		{hypercloud.GroupVersion.WithKind("VirtualMachineImage"), "virtualmachineimages"},
		{virtualmachine.GroupVersion.WithKind("ImageTemplate"), "imagetemplates"},
	},
	"disks": {
		{diskvolume.GroupVersion.WithKind("DiskVolume"), "diskvolumes"},
		{hypercloud.GroupVersion.WithKind("VirtualMachinePvc"), "virtualmachinepvcs"},
	},
	// snapshots of disks: taken by creating one of a disk's PVC, restored by making a disk
	// whose source is the snapshot (a DiskVolume's source.snap).
	"snapshots": {
		{schema.GroupVersionKind{Group: "snapshot.storage.k8s.io", Version: "v1", Kind: "VolumeSnapshot"}, "volumesnapshots"},
	},
	// templates are KubeSphere's image templates, what its template-based creation starts from.
	"templates": {
		{virtualmachine.GroupVersion.WithKind("ImageTemplate"), "imagetemplates"},
	},
	"exports": {
		{hypercloud.GroupVersion.WithKind("VirtualMachineVolumeExport"), "virtualmachinevolumeexports"},
	},
}

// uploadsOf is the resource of uploads: images, those whose source is an upload.
const uploadsOf = "images"

func init() { resources["uploads"] = resources[uploadsOf] }

// mapper maps the kinds the gateway reads: its resources' and the few of Kubernetes it asks
// for. It is static, so that no discovery request is ever made (with whose rights?).
func mapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper(nil)
	for r, ks := range resources {
		if r == "uploads" {
			continue
		}
		for _, k := range ks {
			m.AddSpecific(k.gvk, k.gvr(), k.gvk.GroupVersion().WithResource(k.resource[:len(k.resource)-1]), meta.RESTScopeNamespace)
			m.AddSpecific(k.gvk.GroupVersion().WithKind(k.gvk.Kind+"List"), k.gvr(), k.gvr(), meta.RESTScopeNamespace)
		}
	}
	ssar := authorizationv1.SchemeGroupVersion
	m.AddSpecific(ssar.WithKind("SelfSubjectAccessReview"), ssar.WithResource("selfsubjectaccessreviews"), ssar.WithResource("selfsubjectaccessreview"), meta.RESTScopeRoot)
	m.AddSpecific(ssar.WithKind("SelfSubjectRulesReview"), ssar.WithResource("selfsubjectrulesreviews"), ssar.WithResource("selfsubjectrulesreview"), meta.RESTScopeRoot)
	core := schema.GroupVersion{Version: "v1"}
	m.AddSpecific(core.WithKind("Namespace"), core.WithResource("namespaces"), core.WithResource("namespace"), meta.RESTScopeRoot)
	m.AddSpecific(core.WithKind("NamespaceList"), core.WithResource("namespaces"), core.WithResource("namespaces"), meta.RESTScopeRoot)
	m.AddSpecific(core.WithKind("Secret"), core.WithResource("secrets"), core.WithResource("secret"), meta.RESTScopeNamespace)
	authn := schema.GroupVersion{Group: "authentication.k8s.io", Version: "v1"}
	m.AddSpecific(authn.WithKind("TokenReview"), authn.WithResource("tokenreviews"), authn.WithResource("tokenreview"), meta.RESTScopeRoot)
	return m
}

// kindNamed is the kind of resource named name (?kind=), or false.
func kindNamed(ks []kind, name string) (kind, bool) {
	for _, k := range ks {
		if k.gvk.Kind == name {
			return k, true
		}
	}
	return kind{}, false
}
