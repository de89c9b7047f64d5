package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ConditionReady is the condition every kind reports: True once the object's result is usable.
const ConditionReady = "Ready"

// Phase is the coarse state of an object, for humans and printer columns; conditions carry the
// detail.
// +kubebuilder:validation:Enum=Pending;Importing;Cloning;Exporting;Ready;Failed;Deleting
type Phase string

const (
	// PhasePending means the object is accepted and waits for a dependency (a source, a storage class, a volume).
	PhasePending Phase = "Pending"
	// PhaseImporting means an importer is copying the source into the golden PVC.
	PhaseImporting Phase = "Importing"
	// PhaseCloning means a disk is being made from an image or snapshot.
	PhaseCloning Phase = "Cloning"
	// PhaseExporting means an exporter is uploading the disk to the object store.
	PhaseExporting Phase = "Exporting"
	// PhaseReady means the result is usable.
	PhaseReady Phase = "Ready"
	// PhaseFailed means the work failed for good; conditions say why.
	PhaseFailed Phase = "Failed"
	// PhaseDeleting means the object is being deleted and its children cleaned up.
	PhaseDeleting Phase = "Deleting"
)

// CloneStrategy is how a disk is made from a golden image.
// +kubebuilder:validation:Enum=CSIClone;Snapshot;HostAssisted
type CloneStrategy string

const (
	// CloneStrategyCSIClone creates the disk with the golden PVC as its dataSource.
	CloneStrategyCSIClone CloneStrategy = "CSIClone"
	// CloneStrategySnapshot restores the disk from the image's golden VolumeSnapshot.
	CloneStrategySnapshot CloneStrategy = "Snapshot"
	// CloneStrategyHostAssisted copies the bytes with an importer pod.
	CloneStrategyHostAssisted CloneStrategy = "HostAssisted"
)

// Transfer is the progress of a long copy.
type Transfer struct {
	// bytesDone is how many bytes of the source have been processed.
	// +optional
	BytesDone int64 `json:"bytesDone,omitempty"`

	// bytesTotal is the size of the work, when known.
	// +optional
	BytesTotal int64 `json:"bytesTotal,omitempty"`

	// bytesPerSecond is the recent rate.
	// +optional
	BytesPerSecond int64 `json:"bytesPerSecond,omitempty"`

	// updateTime is when these figures were read.
	// +optional
	UpdateTime *metav1.Time `json:"updateTime,omitempty"`
}

// ImageStatus is the observed state of a golden image (VirtualMachineImage, ImageTemplate).
type ImageStatus struct {
	// phase is the coarse state: Pending, Importing, Ready or Failed.
	// +optional
	Phase Phase `json:"phase,omitempty"`

	// conditions: Ready, plus one per dependency (SourceReachable, Imported, ...).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the generation this status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// progress of the import in percent, e.g. "42.5%".
	// +optional
	// +kubebuilder:validation:MaxLength=8
	Progress string `json:"progress,omitempty"`

	// transfer is the progress of the import in bytes.
	// +optional
	Transfer *Transfer `json:"transfer,omitempty"`

	// sourceType is the kind of source imported: http, objectStore, s3, registry, pvc, upload,
	// clone, disk or chain.
	// +optional
	// +kubebuilder:validation:MaxLength=16
	SourceType string `json:"sourceType,omitempty"`

	// format of the source image (qcow2, raw, vmdk, ...).
	// +optional
	// +kubebuilder:validation:MaxLength=16
	Format string `json:"format,omitempty"`

	// virtualSize is the size of the disk the image holds.
	// +optional
	VirtualSize *resource.Quantity `json:"virtualSize,omitempty"`

	// storedSize is how many bytes the source took to transfer.
	// +optional
	StoredSize *resource.Quantity `json:"storedSize,omitempty"`

	// digest is the checksum of the source bytes, "<algorithm>:<hex>", verified when the spec
	// gave one. A copy of another volume that skipped the holes of its sparse disk has none.
	// +optional
	// +kubebuilder:validation:MaxLength=135
	Digest string `json:"digest,omitempty"`

	// pvcName is the golden PVC holding the imported disk.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	PVCName string `json:"pvcName,omitempty"`

	// snapshotName is the golden VolumeSnapshot that disks are restored from, when one exists.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	SnapshotName string `json:"snapshotName,omitempty"`

	// retries is how many times the import was retried after a transient failure.
	// +optional
	Retries int32 `json:"retries,omitempty"`

	// completionTime is when the import finished.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`

	// revision identifies the version of the source that was imported: a registry image's
	// manifest digest, an HTTP ETag or Last-Modified, an S3 ETag. For a scheduled image, the
	// revision of its current image.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Revision string `json:"revision,omitempty"`

	// schedule is the state of a scheduled image's checks (spec.schedule).
	// +optional
	Schedule *ScheduleStatus `json:"schedule,omitempty"`

	// replicas are the copies of a node-local image on other nodes, which disks on those nodes
	// are cloned from (a DiskVolume each, controlled by the image).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=256
	Replicas []ImageReplica `json:"replicas,omitempty"`
}

// ImageReplica is a copy of a node-local image on one node.
type ImageReplica struct {
	// node the replica is on.
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node"`

	// name of the replica's DiskVolume and PVC, in the image's namespace.
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`

	// phase of the replica: Pending, Cloning (being copied), Ready or Failed.
	// +optional
	Phase Phase `json:"phase,omitempty"`
}

// DiskStatus is the observed state of a VM disk (VirtualMachinePvc, DiskVolume).
type DiskStatus struct {
	// phase is the coarse state: Pending, Cloning, Ready or Failed.
	// +optional
	Phase Phase `json:"phase,omitempty"`

	// conditions: Ready, plus one per dependency (SourceReady, PVCBound, ...).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the generation this status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// progress of a host-assisted copy in percent, e.g. "42.5%".
	// +optional
	// +kubebuilder:validation:MaxLength=8
	Progress string `json:"progress,omitempty"`

	// transfer is the progress of a host-assisted copy in bytes.
	// +optional
	Transfer *Transfer `json:"transfer,omitempty"`

	// pvcName is the PVC that holds the disk.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	PVCName string `json:"pvcName,omitempty"`

	// cloneStrategy is how the disk was made.
	// +optional
	CloneStrategy CloneStrategy `json:"cloneStrategy,omitempty"`

	// capacity is the size of the bound PVC.
	// +optional
	Capacity *resource.Quantity `json:"capacity,omitempty"`

	// virtualSize is the size of the disk inside the PVC.
	// +optional
	VirtualSize *resource.Quantity `json:"virtualSize,omitempty"`

	// retries is how many times the copy was retried after a transient failure.
	// +optional
	Retries int32 `json:"retries,omitempty"`
}
