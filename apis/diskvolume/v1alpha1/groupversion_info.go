// Package v1alpha1 is the diskvolume.kubesphere.io/v1alpha1 API of KubeSphere's KubeVirt
// design: DiskVolume, a VM disk made from an image, a VolumeSnapshot, or blank.
//
// +kubebuilder:object:generate=true
// +groupName=diskvolume.kubesphere.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of these kinds.
	GroupVersion = schema.GroupVersion{Group: "diskvolume.kubesphere.io", Version: "v1alpha1"}

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
