package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
)

// ImageKind is the kind of golden image a disk is made from.
// +kubebuilder:validation:Enum=ImageTemplate;VirtualMachineImage
type ImageKind string

const (
	// ImageKindImageTemplate is virtualmachine.kubesphere.io's ImageTemplate.
	ImageKindImageTemplate ImageKind = "ImageTemplate"
	// ImageKindVirtualMachineImage is hypercloud.tmaxanc.com's VirtualMachineImage.
	ImageKindVirtualMachineImage ImageKind = "VirtualMachineImage"
)

// ImageSource names the golden image a disk is made from.
type ImageSource struct {
	// name of the image.
	// +required
	Name common.LocalName `json:"name"`

	// namespace of the image; empty means the disk's own. Another namespace's image needs
	// permission to read it there, or the image's label
	// virtualmachine.kubesphere.io/image-public: "yes".
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`

	// kind of the image (default ImageTemplate).
	// +optional
	// +kubebuilder:default=ImageTemplate
	Kind ImageKind `json:"kind,omitempty"`
}

// SnapshotSource names the VolumeSnapshot a disk is restored from.
type SnapshotSource struct {
	// name of the VolumeSnapshot, in the disk's namespace.
	// +required
	Name common.LocalName `json:"name"`
}

// DiskVolumeSource is what a disk starts from: exactly one of image, snap or blank.
// +kubebuilder:validation:XValidation:rule="[has(self.image), has(self.snap), has(self.blank)].filter(x, x).size() == 1",message="exactly one of image, snap or blank must be set"
type DiskVolumeSource struct {
	// image makes the disk from a golden image.
	// +optional
	Image *ImageSource `json:"image,omitempty"`

	// snap restores the disk from a VolumeSnapshot.
	// +optional
	Snap *SnapshotSource `json:"snap,omitempty"`

	// blank makes an empty disk of the requested size.
	// +optional
	Blank *common.BlankSource `json:"blank,omitempty"`
}

// DiskVolumeSpec is a VM disk.
// +kubebuilder:validation:XValidation:rule="!has(self.source.blank) || (has(self.resources) && has(self.resources.requests) && has(self.resources.requests.storage))",message="resources.requests.storage is required for a blank disk"
type DiskVolumeSpec struct {
	// source the disk starts from. It cannot change.
	// +required
	Source DiskVolumeSource `json:"source"`

	common.PVCTemplate `json:",inline"`

	// cloneStrategy overrides the strategy chosen from the storage class.
	// +optional
	CloneStrategy *common.CloneStrategy `json:"cloneStrategy,omitempty"`

	// retry is how many times a transient copy failure is retried (default 3).
	// +optional
	// +kubebuilder:default=3
	Retry *common.RetryLimit `json:"retry,omitempty"`
}

// DiskVolume is a PVC holding a VM disk made from an image, a snapshot, or blank.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=dvol,categories=diskpipe
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Progress",type=string,JSONPath=`.status.progress`
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.status.capacity`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,priority=1
// +kubebuilder:printcolumn:name="PVC",type=string,JSONPath=`.status.pvcName`,priority=1
// +kubebuilder:printcolumn:name="Strategy",type=string,JSONPath=`.status.cloneStrategy`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type DiskVolume struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired disk.
	// +required
	// +kubebuilder:validation:XValidation:rule="self.source == oldSelf.source",message="source is immutable"
	Spec DiskVolumeSpec `json:"spec"`

	// status is the observed state of the disk.
	// +optional
	Status common.DiskStatus `json:"status,omitempty"`
}

// DiskVolumeList is a list of DiskVolumes.
// +kubebuilder:object:root=true
type DiskVolumeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []DiskVolume `json:"items"`
}

func init() {
	knownTypes = append(knownTypes, &DiskVolume{}, &DiskVolumeList{})
}
