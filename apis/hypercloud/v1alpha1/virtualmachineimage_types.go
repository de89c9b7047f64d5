package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
)

// VirtualMachineImageSource is where an image's bytes come from: exactly one of http,
// objectStore, s3, registry, pvc, snapshot, upload or chain.
// +kubebuilder:validation:XValidation:rule="[has(self.http), has(self.objectStore), has(self.s3), has(self.registry), has(self.pvc), has(self.snapshot), has(self.upload), has(self.chain)].filter(x, x).size() == 1",message="exactly one of http, objectStore, s3, registry, pvc, snapshot, upload or chain must be set"
// +kubebuilder:validation:XValidation:rule="!has(self.httpOptions) || has(self.http)",message="httpOptions needs an http source"
// +kubebuilder:validation:XValidation:rule="!has(self.checksum) || !(has(self.pvc) || has(self.snapshot) || has(self.chain))",message="checksum does not apply to a pvc, snapshot or chain source (a chain's index holds each layer's digest)"
// +kubebuilder:validation:XValidation:rule="!has(self.ovaDisk) || !(has(self.pvc) || has(self.snapshot) || has(self.chain))",message="ovaDisk does not apply to a pvc, snapshot or chain source"
type VirtualMachineImageSource struct {
	// http is the URL of the image.
	// +optional
	HTTP common.HTTPURL `json:"http,omitempty"`

	// httpOptions are the credentials, CA and headers used with http.
	// +optional
	HTTPOptions *common.HTTPOptions `json:"httpOptions,omitempty"`

	// objectStore names an object in diskpipe's bundled object store.
	// +optional
	ObjectStore *common.ObjectStoreSource `json:"objectStore,omitempty"`

	// s3 names an object in an external S3-compatible store.
	// +optional
	S3 *common.S3Source `json:"s3,omitempty"`

	// registry names a container disk image.
	// +optional
	Registry *common.RegistrySource `json:"registry,omitempty"`

	// pvc copies an existing PVC's disk.
	// +optional
	PVC *common.PVCSource `json:"pvc,omitempty"`

	// snapshot copies the disk of an existing VolumeSnapshot: it is restored into a volume in
	// its own namespace for as long as the copy runs.
	// +optional
	Snapshot *common.VolumeSnapshotSource `json:"snapshot,omitempty"`

	// upload waits for the image's bytes to be uploaded through the upload proxy.
	// +optional
	Upload *common.UploadSource `json:"upload,omitempty"`

	// chain restores a point of a disk's backups: a full and its incrementals, through their
	// index.
	// +optional
	Chain *common.ChainSource `json:"chain,omitempty"`

	// checksum is the expected digest of the source bytes.
	// +optional
	Checksum common.Checksum `json:"checksum,omitempty"`

	// ovaDisk chooses the disk to import when the source is an OVA appliance: its OVF disk id
	// (e.g. "vmdisk2") or its file name in the archive (e.g. "data.vmdk"). The first disk is
	// imported by default, and the disk gets the capacity the OVF gives it.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	OVADisk string `json:"ovaDisk,omitempty"`
}

// VirtualMachineImageSpec is a golden image: a source imported once into a read-only PVC.
// +kubebuilder:validation:XValidation:rule="!has(self.schedule) || has(self.source.http) || has(self.source.objectStore) || has(self.source.s3) || has(self.source.registry)",message="schedule needs an http, objectStore, s3 or registry source"
// +kubebuilder:validation:XValidation:rule="!has(self.schedule) || !has(self.source.checksum)",message="a scheduled image's bytes change with each revision: checksum does not apply"
// +kubebuilder:validation:XValidation:rule="has(self.schedule) == has(oldSelf.schedule)",message="schedule cannot be added or removed: create a new image instead"
type VirtualMachineImageSpec struct {
	// source of the image's bytes. It cannot change once set.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="source is immutable: create a new image instead"
	Source VirtualMachineImageSource `json:"source"`

	common.VolumeOptions `json:",inline"`

	// retry is how many times a transient import failure is retried (default 3).
	// +optional
	// +kubebuilder:default=3
	Retry *common.RetryLimit `json:"retry,omitempty"`

	// schedule keeps the image current: the source is checked on this schedule and each new
	// revision is imported into an image of its own; disks made from this image get the
	// newest Ready one. Only for http, objectStore, s3 and registry sources.
	// +optional
	Schedule *common.ImageSchedule `json:"schedule,omitempty"`

	// replicas pre-warms nodes with copies of a node-local image and evicts copies no disk
	// uses (see ReplicaPolicy).
	// +optional
	Replicas *common.ReplicaPolicy `json:"replicas,omitempty"`
}

// VirtualMachineImage imports a disk image into a read-only golden PVC that VirtualMachinePvcs
// are cloned from.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=vmimage,categories=diskpipe
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Progress",type=string,JSONPath=`.status.progress`
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.status.virtualSize`
// +kubebuilder:printcolumn:name="Revision",type=string,JSONPath=`.status.revision`
// +kubebuilder:printcolumn:name="Last Check",type=date,JSONPath=`.status.schedule.lastCheckTime`
// +kubebuilder:printcolumn:name="Next Check",type=string,JSONPath=`.status.schedule.nextCheckTime`
// +kubebuilder:printcolumn:name="Current",type=string,JSONPath=`.status.schedule.current`,priority=1
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,priority=1
// +kubebuilder:printcolumn:name="Format",type=string,JSONPath=`.status.format`,priority=1
// +kubebuilder:printcolumn:name="PVC",type=string,JSONPath=`.status.pvcName`,priority=1
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.status.sourceType`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type VirtualMachineImage struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired image.
	// +required
	Spec VirtualMachineImageSpec `json:"spec"`

	// status is the observed state of the import.
	// +optional
	Status common.ImageStatus `json:"status,omitempty"`
}

// VirtualMachineImageList is a list of VirtualMachineImages.
// +kubebuilder:object:root=true
type VirtualMachineImageList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineImage `json:"items"`
}

func init() {
	knownTypes = append(knownTypes, &VirtualMachineImage{}, &VirtualMachineImageList{})
}
