package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
)

// ExportFormat is the format of an exported disk.
// +kubebuilder:validation:Enum=qcow2;raw
type ExportFormat string

const (
	// ExportFormatQcow2 writes a qcow2 v3 image holding only the non-zero clusters.
	ExportFormatQcow2 ExportFormat = "qcow2"
	// ExportFormatRaw writes the disk's bytes as they are.
	ExportFormatRaw ExportFormat = "raw"
)

// ExportCompression compresses the clusters of a qcow2 export.
// +kubebuilder:validation:Enum=none;zlib;zstd
type ExportCompression string

const (
	// ExportCompressionNone stores clusters uncompressed.
	ExportCompressionNone ExportCompression = "none"
	// ExportCompressionZlib stores deflate-compressed clusters, readable by every qcow2 reader.
	ExportCompressionZlib ExportCompression = "zlib"
	// ExportCompressionZstd stores zstd-compressed clusters (qemu 5.1 and later).
	ExportCompressionZstd ExportCompression = "zstd"
)

// RetainPolicy says what happens to the exported object when the export is deleted.
// +kubebuilder:validation:Enum=Retain;Delete
type RetainPolicy string

const (
	// RetainPolicyRetain keeps the object.
	RetainPolicyRetain RetainPolicy = "Retain"
	// RetainPolicyDelete deletes the object with the export.
	RetainPolicyDelete RetainPolicy = "Delete"
)

// VirtualMachineVolumeExportSpec exports a PVC's disk into an object store.
// +kubebuilder:validation:XValidation:rule="[has(self.objectStore), has(self.s3)].filter(x, x).size() == 1",message="exactly one of objectStore or s3 must be set"
// +kubebuilder:validation:XValidation:rule="!has(self.compression) || self.compression == 'none' || !has(self.format) || self.format == 'qcow2'",message="compression needs format qcow2"
// +kubebuilder:validation:XValidation:rule="!has(self.backup) || !has(self.format) || self.format == 'qcow2'",message="a backup is written as qcow2"
// +kubebuilder:validation:XValidation:rule="!has(self.backup) || !has(self.retainPolicy) || self.retainPolicy == 'Retain'",message="a backup is retained (the backups after it need it): the index's keepFulls drops old ones"
// +kubebuilder:validation:XValidation:rule="has(self.backup) == has(oldSelf.backup)",message="backup is immutable: create a new export instead"
// +kubebuilder:validation:XValidation:rule="self.pvcName == oldSelf.pvcName && has(self.objectStore) == has(oldSelf.objectStore) && (!has(self.objectStore) || self.objectStore == oldSelf.objectStore) && has(self.s3) == has(oldSelf.s3) && (!has(self.s3) || self.s3 == oldSelf.s3)",message="pvcName and the destination are immutable: create a new export instead"
type VirtualMachineVolumeExportSpec struct {
	// pvcName is the PVC to export, in the export's namespace. A PVC in use by a running pod or
	// VM is exported from a snapshot, never read live.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	PVCName string `json:"pvcName"`

	// objectStore names the object in diskpipe's bundled object store to write.
	// +optional
	ObjectStore *common.ObjectStoreSource `json:"objectStore,omitempty"`

	// s3 names the object in an external S3-compatible store to write.
	// +optional
	S3 *common.S3Source `json:"s3,omitempty"`

	// format of the exported image (default qcow2).
	// +optional
	// +kubebuilder:default=qcow2
	Format ExportFormat `json:"format,omitempty"`

	// compression of a qcow2 export's clusters (default none).
	// +optional
	// +kubebuilder:default=none
	Compression ExportCompression `json:"compression,omitempty"`

	// retainPolicy says whether deleting the export deletes the object (default Retain).
	// +optional
	// +kubebuilder:default=Retain
	RetainPolicy RetainPolicy `json:"retainPolicy,omitempty"`

	// downloadURLExpiry is how long the presigned download URL (status.downloadSecretName) stays valid
	// (default 4h, at most 7 days, S3's limit). Changing it renews the URL.
	// +optional
	DownloadURLExpiry *metav1.Duration `json:"downloadURLExpiry,omitempty"`

	// retry is how many times a transient export failure is retried (default 3).
	// +optional
	// +kubebuilder:default=3
	Retry *common.RetryLimit `json:"retry,omitempty"`

	// backup keeps the export as one backup of the disk, in the index of its backups that the
	// destination's objectName names (docs/backups.md): the backup is written beside the
	// index as <checkpoint>.qcow2 and holds, when the index has a backup to follow, only what
	// changed since it. Run one backup of an index at a time.
	// +optional
	Backup *ExportBackup `json:"backup,omitempty"`
}

// ExportBackup says how an export is kept as a backup.
type ExportBackup struct {
	// checkpoint names the backup in the index (default: the export's name).
	// +optional
	// +kubebuilder:validation:MaxLength=200
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][A-Za-z0-9._-]*$`
	Checkpoint string `json:"checkpoint,omitempty"`

	// full writes the whole disk, even when the index has a backup to take the changes since.
	// +optional
	Full bool `json:"full,omitempty"`

	// maxChain is how many incrementals may follow a full before the next backup is a full
	// again (default 7, at most 15): a restore reads every layer of its chain, each with a cache
	// of its own.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=15
	MaxChain *int32 `json:"maxChain,omitempty"`

	// keepFulls is how many fulls the index keeps, each with the incrementals that follow it;
	// the backups of older ones are dropped from the index, then from the store. 0 keeps all.
	// +optional
	// +kubebuilder:validation:Minimum=0
	KeepFulls int32 `json:"keepFulls,omitempty"`
}

// VirtualMachineVolumeExportStatus is the observed state of an export.
type VirtualMachineVolumeExportStatus struct {
	// phase is the coarse state: Pending, Exporting, Ready or Failed.
	// +optional
	Phase common.Phase `json:"phase,omitempty"`

	// conditions: Ready, plus one per dependency (SourceReady, Snapshotted, Uploaded, ...).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the generation this status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// progress of the export in percent of the source disk, e.g. "42.5%".
	// +optional
	// +kubebuilder:validation:MaxLength=8
	Progress string `json:"progress,omitempty"`

	// transfer is the progress of the export in bytes of the source disk.
	// +optional
	Transfer *common.Transfer `json:"transfer,omitempty"`

	// objectURL is the s3:// URL of the written object.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	ObjectURL string `json:"objectURL,omitempty"`

	// downloadSecretName names the Secret, in the export's namespace and owned by it, whose
	// key "url" holds a presigned HTTP GET URL of the object (and "expiresAt" when it stops
	// working). The URL is a bearer credential for the whole disk, so it is kept where only
	// those who may read the namespace's Secrets read it, not in this status, which the
	// namespace's viewers read.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	DownloadSecretName string `json:"downloadSecretName,omitempty"`

	// downloadURLExpiresAt is when the URL in the download Secret stops working.
	// +optional
	DownloadURLExpiresAt *metav1.Time `json:"downloadURLExpiresAt,omitempty"`

	// virtualSize is the size of the exported disk.
	// +optional
	VirtualSize *resource.Quantity `json:"virtualSize,omitempty"`

	// storedSize is the size of the written object.
	// +optional
	StoredSize *resource.Quantity `json:"storedSize,omitempty"`

	// digest is the sha256 of the written object, "sha256:<hex>".
	// +optional
	// +kubebuilder:validation:MaxLength=135
	Digest string `json:"digest,omitempty"`

	// snapshotName is the VolumeSnapshot the export was read from, when the PVC was in use.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	SnapshotName string `json:"snapshotName,omitempty"`

	// retries is how many times the export was retried after a transient failure.
	// +optional
	Retries int32 `json:"retries,omitempty"`

	// completionTime is when the export finished.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
}

// AnnotationRenewDownloadURL on a Ready export asks for a fresh download URL.
const AnnotationRenewDownloadURL = "diskpipe.io/renew-download-url"

// Keys of an export's download Secret (status.downloadSecretName).
const (
	// DownloadSecretKeyURL holds the presigned HTTP GET URL of the exported object.
	DownloadSecretKeyURL = "url"
	// DownloadSecretKeyExpiresAt holds when it stops working, in RFC 3339.
	DownloadSecretKeyExpiresAt = "expiresAt"
)

// VirtualMachineVolumeExport converts a PVC's disk to qcow2 (or raw) and uploads it to an
// object store, from where it downloads with a plain HTTP GET.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=vmve,categories=diskpipe
// +kubebuilder:printcolumn:name="PVC",type=string,JSONPath=`.spec.pvcName`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Progress",type=string,JSONPath=`.status.progress`
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.status.storedSize`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,priority=1
// +kubebuilder:printcolumn:name="Format",type=string,JSONPath=`.spec.format`,priority=1
// +kubebuilder:printcolumn:name="Object",type=string,JSONPath=`.status.objectURL`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type VirtualMachineVolumeExport struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired export.
	// +required
	Spec VirtualMachineVolumeExportSpec `json:"spec"`

	// status is the observed state of the export.
	// +optional
	Status VirtualMachineVolumeExportStatus `json:"status,omitempty"`
}

// VirtualMachineVolumeExportList is a list of VirtualMachineVolumeExports.
// +kubebuilder:object:root=true
type VirtualMachineVolumeExportList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineVolumeExport `json:"items"`
}

func init() {
	knownTypes = append(knownTypes, &VirtualMachineVolumeExport{}, &VirtualMachineVolumeExportList{})
}
