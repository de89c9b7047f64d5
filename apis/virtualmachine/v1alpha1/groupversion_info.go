// Package v1alpha1 is the virtualmachine.kubesphere.io/v1alpha1 API of KubeSphere's KubeVirt
// design: ImageTemplate (a golden image) and VirtualMachine (a thin VM bound to DiskVolumes).
//
// +kubebuilder:object:generate=true
// +groupName=virtualmachine.kubesphere.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of these kinds.
	GroupVersion = schema.GroupVersion{Group: "virtualmachine.kubesphere.io", Version: "v1alpha1"}

	// SchemeBuilder registers the kinds with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme

	// knownTypes are the kinds' objects, each file adding its own from init.
	knownTypes []runtime.Object
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, knownTypes...)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// Labels of ImageTemplates, as KubeSphere's image catalog uses them.
const (
	// LabelImagePublic, set to "yes", lets disks in any namespace be made from the image.
	LabelImagePublic = "virtualmachine.kubesphere.io/image-public"
	// LabelOSPlatform is the catalog's OS platform, e.g. "linux".
	LabelOSPlatform = "virtualmachine.kubesphere.io/os-platform"
	// LabelOSFamily is the catalog's OS family, e.g. "centos".
	LabelOSFamily = "virtualmachine.kubesphere.io/os-family"
	// LabelOSVersion is the catalog's OS version, e.g. "7.5_x86_64".
	LabelOSVersion = "virtualmachine.kubesphere.io/os-version"
)
