// Package v1alpha1 is the hypercloud.tmaxanc.com/v1alpha1 API of HyperCloud's image design:
// VirtualMachineImage, VirtualMachinePvc and VirtualMachineVolumeExport, with the seed's field
// names kept so existing manifests apply unchanged.
//
// +kubebuilder:object:generate=true
// +groupName=hypercloud.tmaxanc.com
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of these kinds.
	GroupVersion = schema.GroupVersion{Group: "hypercloud.tmaxanc.com", Version: "v1alpha1"}

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
