package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// DefaultRetryLimit is how many times a transient failure is retried when spec.retry is unset.
const DefaultRetryLimit = 3

// StorageList is the storage of a request.
type StorageList struct {
	// storage is the size of the volume.
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="storage must be greater than zero"
	Storage *resource.Quantity `json:"storage,omitempty"`
}

// StorageResources is the size of a volume, written as in a PVC: resources.requests.storage.
type StorageResources struct {
	// requests.storage is the size asked for.
	// +optional
	Requests StorageList `json:"requests,omitempty"`
}

// ToCore returns r as a PVC's resources.
func (r StorageResources) ToCore() corev1.VolumeResourceRequirements {
	var out corev1.VolumeResourceRequirements
	if r.Requests.Storage != nil {
		out.Requests = corev1.ResourceList{corev1.ResourceStorage: r.Requests.Storage.DeepCopy()}
	}
	return out
}

// VolumeOptions shape the PVC an image or disk is written to.
type VolumeOptions struct {
	// resources.requests.storage is the size of the PVC. For an image it may be left out: the
	// source is probed and the PVC sized to its virtual size plus filesystem overhead.
	// +optional
	Resources StorageResources `json:"resources,omitempty"`

	// storageClassName of the PVC; empty means the cluster's default storage class.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	StorageClassName *string `json:"storageClassName,omitempty"`

	// volumeMode of the PVC: Filesystem (the disk is the file disk.img) or Block.
	// +optional
	// +kubebuilder:validation:Enum=Filesystem;Block
	VolumeMode *corev1.PersistentVolumeMode `json:"volumeMode,omitempty"`

	// preallocation allocates the whole disk on its volume when diskpipe writes it (fallocate),
	// for storage that must hold all of it from the start rather than as the guest writes.
	// A block volume is the disk already.
	// +optional
	Preallocation *bool `json:"preallocation,omitempty"`
}

// PVCTemplate is the part of a PVC's spec a user chooses for a VM disk; diskpipe sets the
// data source itself.
type PVCTemplate struct {
	// accessModes of the PVC (default ReadWriteOnce).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=4
	AccessModes []corev1.PersistentVolumeAccessMode `json:"accessModes,omitempty"`

	VolumeOptions `json:",inline"`
}

// RetryLimit is how many times a transient failure is retried with exponential backoff before
// the work is marked Failed.
// +kubebuilder:validation:Minimum=0
// +kubebuilder:validation:Maximum=20
type RetryLimit int32
