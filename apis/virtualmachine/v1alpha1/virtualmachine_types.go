package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
)

// TemplateMeta is the metadata of an object a template makes.
type TemplateMeta struct {
	// name of the object.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// labels of the object.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Labels map[string]string `json:"labels,omitempty"`

	// annotations of the object.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Annotations map[string]string `json:"annotations,omitempty"`
}

// DiskVolumeTemplate is a DiskVolume the VirtualMachine creates and owns.
type DiskVolumeTemplate struct {
	// metadata of the DiskVolume: its name (a disk of spec.hardware with the same name is bound
	// to it), labels and annotations.
	// +required
	Metadata TemplateMeta `json:"metadata"`

	// spec of the DiskVolume.
	// +required
	Spec diskvolume.DiskVolumeSpec `json:"spec"`
}

// RunStrategy is KubeVirt's run strategy of the VM.
// +kubebuilder:validation:Enum=Always;Halted;Manual;RerunOnFailure;Once
type RunStrategy string

// VirtualMachineSpec is a thin VM: KubeVirt hardware plus the disks to make for it.
type VirtualMachineSpec struct {
	// ippool names the IP pool the VM's address comes from; it is passed to the network layer
	// as an annotation on the VM's pod template.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	IPPool string `json:"ippool,omitempty"`

	// hardware is a KubeVirt VirtualMachineInstance spec (kubevirt.io/v1): domain, hostname,
	// volumes, networks, .... Disks of domain.devices.disks named like a diskVolumeTemplate
	// are bound to that DiskVolume's PVC; volumes written here pass through unchanged.
	//
	// The schema is kept open (unknown fields preserved) rather than embedding KubeVirt's:
	// the VMI spec is several hundred kilobytes of schema that would tie this CRD to one
	// KubeVirt release, and a field the embedded schema did not know would be silently pruned
	// for users of a newer KubeVirt. The controller decodes it strictly with kubevirt.io/api
	// types instead and reports a HardwareValid condition naming any field it cannot accept.
	// +required
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	Hardware runtime.RawExtension `json:"hardware"`

	// diskVolumeTemplates are DiskVolumes made for this VM and deleted with it. At most 12 (the
	// limit keeps the CEL validation of each template's size within the apiserver's budget);
	// further disks attach as persistentVolumeClaim volumes in hardware.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=12
	// +kubebuilder:validation:XValidation:rule="self.all(t, self.exists_one(u, u.metadata.name == t.metadata.name))",message="diskVolumeTemplates' metadata.name must be unique within the VM"
	DiskVolumeTemplates []DiskVolumeTemplate `json:"diskVolumeTemplates,omitempty"`

	// runStrategy of the KubeVirt VM (default Always).
	// +optional
	RunStrategy *RunStrategy `json:"runStrategy,omitempty"`
}

// VirtualMachineStatus is the observed state of a VM.
type VirtualMachineStatus struct {
	// phase: Pending while its disks are made, Ready once the KubeVirt VM exists, Failed.
	// +optional
	Phase common.Phase `json:"phase,omitempty"`

	// conditions: Ready, DisksReady, HardwareValid.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the generation this status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// virtualMachineName is the KubeVirt VirtualMachine made for this VM.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	VirtualMachineName string `json:"virtualMachineName,omitempty"`

	// printableStatus is the KubeVirt VM's printableStatus (Running, Stopped, Provisioning, ...).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	PrintableStatus string `json:"printableStatus,omitempty"`

	// diskVolumes are the names of the VM's DiskVolumes.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	DiskVolumes []string `json:"diskVolumes,omitempty"`
}

// VirtualMachine is a thin VM: it makes its DiskVolumes and, once they are Ready, a KubeVirt
// VirtualMachine bound to their PVCs.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ksvm,categories=diskpipe
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.printableStatus`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="IPPool",type=string,JSONPath=`.spec.ippool`,priority=1
// +kubebuilder:printcolumn:name="KubeVirt VM",type=string,JSONPath=`.status.virtualMachineName`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type VirtualMachine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired VM.
	// +required
	Spec VirtualMachineSpec `json:"spec"`

	// status is the observed state of the VM.
	// +optional
	Status VirtualMachineStatus `json:"status,omitempty"`
}

// VirtualMachineList is a list of VirtualMachines.
// +kubebuilder:object:root=true
type VirtualMachineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachine `json:"items"`
}

func init() {
	knownTypes = append(knownTypes, &VirtualMachine{}, &VirtualMachineList{})
}
