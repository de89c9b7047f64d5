// Package v1alpha1 is the hypercloud.tmaxanc.com/v1alpha1 API of HyperCloud's image design:
// VirtualMachineImage, VirtualMachinePvc and VirtualMachineVolumeExport, with the seed's field
// names kept so existing manifests apply unchanged.
//
// +kubebuilder:object:generate=true
// +groupName=hypercloud.tmaxanc.com
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of these kinds.
	GroupVersion = schema.GroupVersion{Group: "hypercloud.tmaxanc.com", Version: "v1alpha1"}

	// SchemeBuilder registers the kinds with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
