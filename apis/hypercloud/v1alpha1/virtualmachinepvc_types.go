package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
)

// VirtualMachinePvcSpec is a VM disk made from a VirtualMachineImage of the same namespace.
type VirtualMachinePvcSpec struct {
	// virtualMachineImageName is the image the disk is cloned from. It cannot change.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="virtualMachineImageName is immutable"
	VirtualMachineImageName string `json:"virtualMachineImageName"`

	// pvc is the spec of the disk's PVC. A requested size larger than the image grows the disk;
	// a smaller one is refused.
	// +required
	PVC common.PVCTemplate `json:"pvc"`

	// cloneStrategy overrides the strategy chosen from the storage class.
	// +optional
	CloneStrategy *common.CloneStrategy `json:"cloneStrategy,omitempty"`

	// retry is how many times a transient copy failure is retried (default 3).
	// +optional
	// +kubebuilder:default=3
	Retry *common.RetryLimit `json:"retry,omitempty"`
}

// VirtualMachinePvc is a PVC holding a VM disk cloned from a VirtualMachineImage.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=vmpvc,categories=diskpipe
// +kubebuilder:printcolumn:name="Image",type=string,JSONPath=`.spec.virtualMachineImageName`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Progress",type=string,JSONPath=`.status.progress`
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.status.capacity`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,priority=1
// +kubebuilder:printcolumn:name="PVC",type=string,JSONPath=`.status.pvcName`,priority=1
// +kubebuilder:printcolumn:name="Strategy",type=string,JSONPath=`.status.cloneStrategy`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type VirtualMachinePvc struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired disk.
	// +required
	Spec VirtualMachinePvcSpec `json:"spec"`

	// status is the observed state of the disk.
	// +optional
	Status common.DiskStatus `json:"status,omitempty"`
}

// VirtualMachinePvcList is a list of VirtualMachinePvcs.
// +kubebuilder:object:root=true
type VirtualMachinePvcList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachinePvc `json:"items"`
}

func init() {
	knownTypes = append(knownTypes, &VirtualMachinePvc{}, &VirtualMachinePvcList{})
}
