package v1alpha1

// Checksum is the expected digest of the source bytes, written "<algorithm>:<hex digest>".
// The importer computes it while streaming and fails the import, leaving the disk empty, on a
// mismatch.
// +kubebuilder:validation:MaxLength=135
// +kubebuilder:validation:XValidation:rule="self.matches('^(sha256:[0-9a-fA-F]{64}|sha512:[0-9a-fA-F]{128}|sha1:[0-9a-fA-F]{40}|md5:[0-9a-fA-F]{32})$')",message="checksum must be <algorithm>:<hex digest> with sha256 (64 hex digits), sha512 (128), sha1 (40) or md5 (32)"
type Checksum string

// BucketName is an S3 bucket name.
// +kubebuilder:validation:MaxLength=63
// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$')",message="bucketName must be a valid S3 bucket name: 3 to 63 lower-case letters, digits, dots or hyphens, starting and ending with a letter or digit",messageExpression="'bucketName \"' + self + '\" is not a valid S3 bucket name: use 3 to 63 lower-case letters, digits, dots or hyphens, starting and ending with a letter or digit'"
type BucketName string

// ObjectName is the key of an object in a bucket.
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=1024
type ObjectName string

// HTTPURL is an http:// or https:// URL.
// +kubebuilder:validation:MaxLength=2048
// +kubebuilder:validation:XValidation:rule="self.matches('^https?://[^/?#\\\\s]+')",message="must be an http:// or https:// URL with a host"
type HTTPURL string

// LocalName names an object in the namespace of the object that refers to it.
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=253
type LocalName string

// HTTPOptions are the connection settings of an HTTP(S) source.
type HTTPOptions struct {
	// secretRef names a Secret in the same namespace with the keys "username" and "password"
	// (or CDI's "accessKeyId" and "secretKey"), sent as HTTP basic authentication.
	// +optional
	SecretRef LocalName `json:"secretRef,omitempty"`

	// certConfigMap names a ConfigMap in the same namespace whose keys ("ca.crt", or any, as
	// CDI's) hold the PEM CA bundle that verifies the server, in place of the system roots.
	// +optional
	CertConfigMap LocalName `json:"certConfigMap,omitempty"`

	// insecureSkipTLSVerify turns off verification of the server's certificate.
	// +optional
	InsecureSkipTLSVerify bool `json:"insecureSkipTLSVerify,omitempty"`

	// extraHeaders are sent with every request, each written "Name: value".
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=4096
	// +kubebuilder:validation:items:XValidation:rule="self.matches('^[A-Za-z0-9-]+: ?.*$')",message="each header must be written \"Name: value\""
	ExtraHeaders []string `json:"extraHeaders,omitempty"`

	// secretExtraHeaders name Secrets in the same namespace whose values (each key's, as CDI
	// reads them) are further headers "Name: value", for tokens that must not stand in the spec.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	SecretExtraHeaders []LocalName `json:"secretExtraHeaders,omitempty"`

	// userAgent is sent as the User-Agent of every request, for servers that answer only
	// some clients (default: Go's).
	// +optional
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="!self.contains('\\n') && !self.contains('\\r')",message="userAgent must be one line"
	UserAgent string `json:"userAgent,omitempty"`
}

// HTTPSource imports from an HTTP(S) URL.
type HTTPSource struct {
	// url of the image.
	// +required
	URL HTTPURL `json:"url"`

	HTTPOptions `json:",inline"`
}

// ObjectStoreSource names an object in diskpipe's bundled object store.
type ObjectStoreSource struct {
	// bucketName is the bucket that holds the object.
	// +required
	BucketName BucketName `json:"bucketName"`

	// objectName is the object's key.
	// +required
	ObjectName ObjectName `json:"objectName"`
}

// BucketLookup says how requests address a bucket.
// +kubebuilder:validation:Enum=Auto;Path;VirtualHost
type BucketLookup string

const (
	// BucketLookupAuto lets the client choose by the endpoint.
	BucketLookupAuto BucketLookup = "Auto"
	// BucketLookupPath addresses buckets as https://endpoint/bucket/key.
	BucketLookupPath BucketLookup = "Path"
	// BucketLookupVirtualHost addresses buckets as https://bucket.endpoint/key.
	BucketLookupVirtualHost BucketLookup = "VirtualHost"
)

// S3Source names an object in any S3-compatible store (AWS S3, Ceph RGW, SeaweedFS, MinIO, ...).
type S3Source struct {
	// endpoint is the store's URL, e.g. https://s3.eu-west-1.amazonaws.com.
	// +required
	Endpoint HTTPURL `json:"endpoint"`

	// region of the bucket; empty lets the client discover it.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Region string `json:"region,omitempty"`

	// bucketLookup chooses path-style or virtual-host-style requests.
	// +optional
	// +kubebuilder:default=Auto
	BucketLookup BucketLookup `json:"bucketLookup,omitempty"`

	// bucketName is the bucket that holds the object.
	// +required
	BucketName BucketName `json:"bucketName"`

	// objectName is the object's key.
	// +required
	ObjectName ObjectName `json:"objectName"`

	// secretRef names a Secret in the same namespace with the keys "accessKeyId" and
	// "secretAccessKey" (or CDI's "secretKey"); without it requests are anonymous.
	// +optional
	SecretRef LocalName `json:"secretRef,omitempty"`

	// certConfigMap names a ConfigMap in the same namespace whose keys ("ca.crt", or any) hold
	// the PEM CA bundle that verifies the endpoint.
	// +optional
	CertConfigMap LocalName `json:"certConfigMap,omitempty"`
}

// RegistrySource imports the disk of a container disk image (the single file under /disk/),
// or one disk of a KubeVirt VM artifact (an OCI artifact of one layer per disk).
// +kubebuilder:validation:XValidation:rule="!has(self.pullMethod) || self.pullMethod == 'Pod' || !(has(self.certConfigMap) || has(self.insecureSkipTLSVerify) && self.insecureSkipTLSVerify || has(self.architecture) || has(self.signature))",message="with pullMethod Node the node pulls the image with its own settings: certConfigMap, insecureSkipTLSVerify, architecture and signature apply to pullMethod Pod only"
// +kubebuilder:validation:XValidation:rule="!has(self.pullMethod) || self.pullMethod == 'Pod' || !has(self.disk)",message="a KubeVirt VM artifact is not a container image a node can run: import its disk with pullMethod Pod (the default)"
type RegistrySource struct {
	// url of the image, "docker://registry/repository:tag" or "...@sha256:<digest>". An
	// "oci-archive:" path would name a file inside the importer's pod, which holds none:
	// push the archive to a registry instead.
	// +required
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.startsWith('docker://')",message="url must start with docker:// (an oci-archive: path names a file inside the importer pod, which holds none: push the image to a registry)"
	URL string `json:"url"`

	// secretRef names a Secret in the same namespace: of type kubernetes.io/dockerconfigjson,
	// or with the keys "username" and "password" (or CDI's "accessKeyId" and "secretKey").
	// +optional
	SecretRef LocalName `json:"secretRef,omitempty"`

	// certConfigMap names a ConfigMap in the same namespace whose keys ("ca.crt", or any) hold
	// the PEM CA bundle that verifies the registry.
	// +optional
	CertConfigMap LocalName `json:"certConfigMap,omitempty"`

	// architecture picks the image from a multi-architecture index; empty means the node's.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	Architecture string `json:"architecture,omitempty"`

	// disk picks the disk of a KubeVirt VM artifact (VEP 256: one layer per disk, of media
	// type application/vnd.kubevirt.disk.raw+zstd or the like): its io.kubevirt.disk.name, or
	// its layer's digest. Without it an artifact's only disk is imported; an artifact of
	// several is refused with their names. A claim not sized otherwise is sized from the disk's
	// io.kubevirt.pvc.capacity.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Disk string `json:"disk,omitempty"`

	// insecureSkipTLSVerify turns off verification of the registry's certificate.
	// +optional
	InsecureSkipTLSVerify bool `json:"insecureSkipTLSVerify,omitempty"`

	// pullMethod is who pulls the image: Pod (the default), diskpipe's importer, which streams
	// the disk out of the registry with no scratch space; or Node, the node's container
	// runtime, with the node's registry mirrors and credentials (and secretRef, as an image
	// pull secret), into a pod that runs the image and reads its disk.
	// +optional
	// +kubebuilder:validation:Enum=Pod;Node
	PullMethod PullMethod `json:"pullMethod,omitempty"`

	// signature, when set, requires the image to be signed, and checks it before a byte of
	// the disk is written. An unsigned image (reason Unsigned), one signed by another key
	// (SignatureInvalid) or one changed after it was signed (SignedDigestMismatch) fails
	// without retries.
	// +optional
	Signature *RegistrySignature `json:"signature,omitempty"`
}

// PullMethod is who pulls a container disk.
type PullMethod string

const (
	// PullMethodPod is diskpipe's importer pulling it.
	PullMethodPod PullMethod = "Pod"
	// PullMethodNode is the node's container runtime pulling it.
	PullMethodNode PullMethod = "Node"
)

// RegistrySignature is what a container disk must be signed by.
type RegistrySignature struct {
	// publicKeySecretRef names a Secret in the same namespace whose key "cosign.pub" holds the
	// PEM public key (ECDSA, as cosign generate-key-pair makes, Ed25519 or RSA) of cosign's
	// key-based signatures: the image's digest must carry a signature by it, stored where
	// cosign stores it (<repository>:sha256-<hex>.sig).
	// +required
	PublicKeySecretRef LocalName `json:"publicKeySecretRef"`
}

// ChainSource restores a point of a disk's backups kept in a store: a full backup and the
// incrementals taken after it, each a qcow2 object beside the backups' index, which gives
// their order, sizes and digests (docs/backups.md). The layers are read with the index's
// credentials and CA, at random, with no scratch space, each checked against the index.
// +kubebuilder:validation:XValidation:rule="[has(self.objectStore), has(self.s3), has(self.http)].filter(x, x).size() == 1",message="exactly one of objectStore, s3 or http must name the backup index"
type ChainSource struct {
	// objectStore names the index, an object of diskpipe's bundled object store.
	// +optional
	ObjectStore *ObjectStoreSource `json:"objectStore,omitempty"`

	// s3 names the index, an object of an S3-compatible store.
	// +optional
	S3 *S3Source `json:"s3,omitempty"`

	// http is the index's URL; the layers' URLs are relative to it.
	// +optional
	HTTP *HTTPSource `json:"http,omitempty"`

	// point is the checkpoint restored; empty restores the newest the index lists when the
	// image is imported.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][A-Za-z0-9._-]*$`
	Point string `json:"point,omitempty"`
}

// PVCSource copies the disk of an existing PVC.
type PVCSource struct {
	// name of the PVC.
	// +required
	Name LocalName `json:"name"`

	// namespace of the PVC; empty means the referring object's own namespace. Copying another
	// namespace's PVC needs its owner's consent: create on datavolumes/source (cdi.kubevirt.io)
	// there.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`
}

// VolumeSnapshotSource copies the disk of an existing VolumeSnapshot.
type VolumeSnapshotSource struct {
	// name of the VolumeSnapshot.
	// +required
	Name LocalName `json:"name"`

	// namespace of the VolumeSnapshot; empty means the referring object's own namespace.
	// Copying another namespace's snapshot needs its owner's consent, as a PVC does.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`
}

// UploadSource marks an image whose bytes come through diskpipe's upload proxy.
type UploadSource struct{}

// BlankSource makes an empty disk of the requested size.
type BlankSource struct{}
