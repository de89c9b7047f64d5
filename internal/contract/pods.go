package contract

import "time"

// Chain is a backup chain restored by an http or s3 import (importer/chain.go): its layers
// given one by one, or a point of a backup index.
type Chain struct {
	Layer         []string `flag:"layer" usage:"http, s3: a layer of a backup chain, full backup first: its URL (http) or object (s3), in place of --url or --object (repeatable)"`
	LayerChecksum []string `flag:"layer-checksum" usage:"the expected digest of the Nth --layer, \"N=<algorithm>:<hex>\" (repeatable)"`
	ChainIndex    string   `flag:"chain-index" usage:"http, s3: a backup index (docs/backups.md) whose point to restore: its URL (http) or object (s3), in place of --url or --object"`
	ChainPoint    string   `flag:"chain-point" usage:"the checkpoint of --chain-index restored (default: its newest)"`
	LayerURLDir   string   `flag:"layer-url-dir" usage:"http: the --url (or --url-file) is a backup index, and this directory (a mounted Secret) holds each layer's URL in a file named by its checkpoint (presigned URLs)"`
}

// Import is the importer's command line: an import into a volume, or one of its other modes
// (Probe, Check, Grow, GrowOnly, Serve). The order of the fields is the order of the flags.
type Import struct {
	Source     string   `flag:"source" usage:"source kind: http, s3, registry, containerdisk, file or blank"`
	Format     string   `flag:"format" usage:"force the format (raw); empty detects it"`
	URL        string   `flag:"url" usage:"http: the image's URL; registry: docker://registry/repository:tag"`
	URLFile    string   `flag:"url-file" usage:"http: a file (a mounted Secret key) holding the URL, for URLs that carry a credential (presigned)"`
	AuthDir    string   `flag:"auth-dir" usage:"http, registry: a mounted Secret with username and password (or CDI's accessKeyId and secretKey) for basic auth; registry: or a .dockerconfigjson"`
	CAFile     string   `flag:"ca-file" usage:"http, s3, registry: PEM CA bundle that verifies the server"`
	ServerName string   `flag:"tls-server-name" usage:"http: verify the server's certificate for this name rather than the URL's host (a clone source, reached by its pod's address)"`
	Insecure   bool     `flag:"insecure" usage:"http, s3, registry: skip verification of the server's certificate (registry: allow plain HTTP)"`
	Header     []string `flag:"header" usage:"http: a header sent with every request, \"Name: value\" (repeatable)"`
	HeaderFile []string `flag:"header-file" usage:"http: a file (a mounted Secret key) holding a header \"Name: value\", or a mounted Secret whose every key holds one (repeatable)"`
	UserAgent  string   `flag:"user-agent" usage:"http: the User-Agent of every request (default: Go's)"`
	ExtentsURL string   `flag:"extents-url" usage:"http: where a clone source (--serve) lists its disk's data extents; a raw copy reads those only"`
	S3
	Chain
	RegistryAuthFile      string `flag:"registry-auth-file" usage:"registry: a .dockerconfigjson with the registry's credentials"`
	RegistryPublicKeyFile string `flag:"registry-public-key-file" usage:"registry: a PEM public key the image must carry a cosign signature by"`
	Architecture          string `flag:"architecture" usage:"registry: the architecture to pick from an index (default: this machine's)"`
	Disk                  string `flag:"disk" usage:"registry: the disk of a KubeVirt VM artifact, by its io.kubevirt.disk.name or layer digest (default: its only disk)"`
	// Serve imports nothing: it serves the disk at Path read-only over HTTPS on this address,
	// with the certificate in TLSCertFile, to the bearer of the token in TokenFile (a clone
	// source).
	Serve       string `flag:"serve" usage:"import nothing: serve the disk at --path read-only over HTTPS on this address, to the bearer of --token-file"`
	Path        string `flag:"path" usage:"file: the source disk (a file or block device); containerdisk: the directory that holds the image's one disk (/disk); serve: the disk served"`
	TokenFile   string `flag:"token-file" usage:"serve: the file (a mounted Secret key) holding the bearer token"`
	TLSCertFile string `flag:"tls-cert-file" usage:"serve: the PEM certificate served (a mounted Secret key)"`
	TLSKeyFile  string `flag:"tls-key-file" usage:"serve: the PEM key of --tls-cert-file (a mounted Secret key)"`
	// IdleTimeout ends a clone source that its copy does not read, so that it gives its slot
	// up (reason Idle).
	IdleTimeout time.Duration `flag:"idle-timeout" usage:"serve: end (reason Idle) once no request with the token has been made or answered for this long (0: never)"`
	// ServeMinRate bounds a clone source's life: an hour, and the whole disk at this rate.
	ServeMinRate int64  `flag:"serve-min-rate" usage:"serve: end (reason Idle) after an hour and the time the whole disk takes at this many bytes a second (0: never)"`
	BlankSize    int64  `flag:"blank-size" usage:"blank: the disk's size in bytes"`
	Grow         bool   `flag:"grow" usage:"make disk.img as large as the volume allows when the image is smaller (blank: size 0 is the whole volume)"`
	GrowOnly     bool   `flag:"grow-only" usage:"import nothing: grow the existing disk at --target to the volume (a disk cloned by the storage system)"`
	Probe        bool   `flag:"probe" usage:"only tell the source's format and virtual size (in the result); write nothing"`
	Check        bool   `flag:"check" usage:"only tell the source's revision (in the result): an ETag, Last-Modified or registry digest; read no image"`
	Checksum     string `flag:"checksum" usage:"expected digest of the source, <sha256|sha512|sha1|md5>:<hex>"`
	OVADisk      string `flag:"ova-disk" usage:"an OVA appliance's disk to import, by OVF disk id or file name (default: the first)"`
	Parallel     int    `flag:"parallel" usage:"ranged requests in flight at once"`
	Retries      int    `flag:"retries" usage:"attempts of each request before a transient failure ends the import"`
	// StallTimeout is how long a response may send nothing before it is retried; when serving,
	// how long one write of an answer may wait for its reader.
	StallTimeout time.Duration `flag:"stall-timeout" usage:"how long a response may send nothing before it is retried (serve: how long a write may wait for its reader before the answer ends)"`
	CPUProfile   string        `flag:"cpu-profile" usage:"write a CPU profile to this file (for performance work)"`
	// Install imports nothing: it copies the importer to this path, for a pod that runs it
	// inside another image (a container disk the node pulls).
	Install string `flag:"install" usage:"import nothing: copy this importer to the path (an init container's, for a container disk pulled by the node)"`
	Pod
	Target      string   `flag:"target" usage:"disk.img on a filesystem volume, or a block device"`
	Overhead    *float64 `flag:"overhead" usage:"share of a filesystem volume kept for the filesystem (default 0.06)"`
	Capacity    int64    `flag:"capacity" usage:"the volume's size in bytes (default: the filesystem's or device's)"`
	Preallocate bool     `flag:"preallocate" usage:"allocate the whole disk file on its volume (fallocate)"`
}

// Export is the exporter's command line: an export of a disk to an object (Action export),
// or only a download URL of it (presign) or its deletion (delete).
type Export struct {
	Source      string `flag:"source" usage:"disk.img on a filesystem volume, or a block device"`
	Size        int64  `flag:"size" usage:"the disk's expected size in bytes; a shorter disk fails the export"`
	Format      string `flag:"format" usage:"qcow2 or raw"`
	Compression string `flag:"compression" usage:"qcow2 cluster compression: none, zlib or zstd"`
	Output      string `flag:"output" usage:"write to this local file instead of an object store"`
	Action      string `flag:"action" usage:"export, presign (a download URL of the object) or delete (the object)"`
	S3
	CreateBucket      bool          `flag:"create-bucket" usage:"create the bucket if it does not exist"`
	KeepStaleUploads  bool          `flag:"keep-stale-uploads" usage:"leave earlier unfinished uploads of the object alone (the manager aborted them: a credential scoped to one object may not list the bucket's uploads)"`
	CAFile            string        `flag:"ca-file" usage:"PEM CA bundle that verifies the store"`
	Insecure          bool          `flag:"insecure" usage:"skip verification of the store's certificate"`
	PartSize          int           `flag:"part-size" usage:"smallest multipart part in bytes"`
	ParallelUploads   int           `flag:"parallel-uploads" usage:"parts uploaded at once"`
	Workers           int           `flag:"workers" usage:"goroutines reading and compressing clusters"`
	DownloadURLExpiry time.Duration `flag:"download-url-expiry" usage:"after exporting (or with --action presign), sign a download URL valid this long"`
	SealKey           string        `flag:"seal-key" usage:"the manager's public key (internal/seal): a signed download URL is left in the result sealed to it"`
	SealContext       string        `flag:"seal-context" usage:"what the sealed download URL is bound to (the export, as the manager names it)"`
	Backup
	Pod
}

// Backup keeps an export as a backup in an index of a disk's backups (exporter/backup.go).
type Backup struct {
	BackupIndex      string `flag:"backup-index" usage:"keep the export as a backup in this index (an object of --bucket); --object, beside it, is the backup's"`
	BackupCheckpoint string `flag:"backup-checkpoint" usage:"the backup's checkpoint in the index"`
	BackupFull       bool   `flag:"backup-full" usage:"write the whole disk even when the index has a backup to follow"`
	BackupMaxChain   int    `flag:"backup-max-chain" usage:"incrementals after a full before the next backup is a full"`
	BackupKeepFulls  int    `flag:"backup-keep-fulls" usage:"fulls the index keeps with their incrementals (0: all)"`
}

// DownloadSealContext is what an exporter binds the download URL it seals to: the export the
// manager named in --seal-context, and when the URL stops working. The manager opens it only
// with its own export's context, so a sealed URL copied into another export's pod result is
// refused.
func DownloadSealContext(export string, expiresAt time.Time) []byte {
	return []byte("diskpipe download URL\x00" + export + "\x00" + expiresAt.UTC().Format(time.RFC3339Nano))
}

// DefaultImport is what the importer does with no flag given.
func DefaultImport() Import {
	return Import{Source: "http", S3: S3{BucketLookup: "Auto"}, Parallel: 8, Retries: DefaultRetries, StallTimeout: time.Minute,
		Pod: DefaultPod(56 << 20)}
}

// DefaultExport is what the exporter does with no flag given.
func DefaultExport() Export {
	return Export{Format: "qcow2", Compression: "none", Action: "export", S3: S3{BucketLookup: "Auto"},
		PartSize: 16 << 20, ParallelUploads: 4, Workers: 4, Backup: Backup{BackupMaxChain: 7}, Pod: DefaultPod(192 << 20)}
}

// DefaultRetries is how many times a request is tried before a transient failure ends the
// work.
const DefaultRetries = 6

// DefaultOverhead is the share of a filesystem volume kept for the filesystem when nothing
// says otherwise (CDI's default).
const DefaultOverhead = 0.06
