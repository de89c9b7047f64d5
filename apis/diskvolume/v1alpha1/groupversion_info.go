// Package v1alpha1 is the diskvolume.kubesphere.io/v1alpha1 API of KubeSphere's KubeVirt
// design: DiskVolume, a VM disk made from an image, a VolumeSnapshot, or blank.
//
// +kubebuilder:object:generate=true
// +groupName=diskvolume.kubesphere.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of these kinds.
	GroupVersion = schema.GroupVersion{Group: "diskvolume.kubesphere.io", Version: "v1alpha1"}

	// SchemeBuilder registers the kinds with a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
