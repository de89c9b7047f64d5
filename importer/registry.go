package importer

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/opencontainers/go-digest"
	"go.podman.io/image/v5/docker"
	"go.podman.io/image/v5/image"
	"go.podman.io/image/v5/manifest"
	"go.podman.io/image/v5/oci/archive"
	"go.podman.io/image/v5/pkg/blobinfocache/none"
	"go.podman.io/image/v5/pkg/compression"
	"go.podman.io/image/v5/types"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// RegistrySource imports a container disk: the file under /disk/ of a container image, as
// KubeVirt's containerDisks ship VM images. The layer is streamed and unpacked on the fly —
// no image is stored or unpacked to disk — and its digest is verified as it is read. Both
// raw and qcow2 disks work, as for any stream.
type RegistrySource struct {
	// URL is "docker://registry/repository:tag" (or @digest) or "oci-archive:/path".
	URL string
	// AuthFile is a .dockerconfigjson (a mounted Secret) with the registry's credentials.
	AuthFile string
	// Username and Password, when set, are the registry's credentials (in place of AuthFile).
	Username, Password string
	// CAFile is a PEM bundle that verifies the registry.
	CAFile string
	// Insecure skips TLS verification and allows plain HTTP.
	Insecure bool
	// Architecture picks the image from a multi-architecture index (default: this machine's).
	Architecture string
	// PublicKeyFile, when set, is the PEM public key the image must carry a cosign signature
	// by (signature.go); it is checked before a byte is written.
	PublicKeyFile string
	// Disk picks the disk of a KubeVirt VM artifact (an OCI artifact of one layer per disk,
	// media type application/vnd.kubevirt.disk.raw+zstd and the like): its io.kubevirt.disk.name
	// or its layer's digest; empty takes the artifact's only disk.
	Disk string
	// Egress is where the source may connect (nil: anywhere). The registry client takes no
	// dialer, so its connections go through an in-process SOCKS proxy that dials by the rule.
	Egress *transfer.Egress

	socks *transfer.SOCKS
}

func (s *RegistrySource) String() string { return s.URL }

func (s *RegistrySource) reference() (types.ImageReference, error) {
	var (
		ref types.ImageReference
		err error
	)
	switch {
	case strings.HasPrefix(s.URL, "docker://"):
		ref, err = docker.ParseReference(strings.TrimPrefix(s.URL, "docker:"))
	case strings.HasPrefix(s.URL, "oci-archive:"):
		ref, err = archive.ParseReference(strings.TrimPrefix(s.URL, "oci-archive:"))
	default:
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "registry URL %q must start with docker:// or oci-archive:", s.URL)
	}
	if err != nil {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "registry URL %q: %w", s.URL, err)
	}
	return ref, nil
}

func (s *RegistrySource) system(ctx context.Context) (*types.SystemContext, func(), error) {
	sys := &types.SystemContext{
		AuthFilePath:                s.AuthFile,
		DockerInsecureSkipTLSVerify: types.NewOptionalBool(s.Insecure),
		ArchitectureChoice:          s.Architecture,
		OSChoice:                    "linux",
		DockerRegistryUserAgent:     "diskpipe-importer",
	}
	if s.Username != "" {
		sys.DockerAuthConfig = &types.DockerAuthConfig{Username: s.Username, Password: s.Password}
	}
	stop, err := s.egress(ctx, sys)
	if err != nil {
		return nil, nil, err
	}
	proxyCA := transfer.ProxyCA()
	if s.CAFile == "" && proxyCA == nil {
		return sys, stop, nil
	}
	// containers/image reads CAs from a directory of *.crt files, beside the system's roots.
	dir, err := os.MkdirTemp("", "diskpipe-registry-ca-")
	if err != nil {
		return nil, nil, err
	}
	if s.CAFile != "" {
		var pem []byte
		if pem, err = transfer.ReadCABundle(s.CAFile); err == nil {
			err = os.WriteFile(filepath.Join(dir, "ca.crt"), pem, 0o600)
		}
	}
	if err == nil && proxyCA != nil {
		err = os.WriteFile(filepath.Join(dir, "proxy-ca.crt"), proxyCA, 0o600)
	}
	if err != nil {
		os.RemoveAll(dir)
		stop()
		return nil, nil, err
	}
	sys.DockerCertPath = dir
	return sys, func() { os.RemoveAll(dir); stop() }, nil
}

// egress makes the registry client obey s.Egress: through the environment's proxy, the
// target's addresses are checked before each request; else every connection goes through an
// in-process SOCKS proxy that checks the address it dials.
func (s *RegistrySource) egress(ctx context.Context, sys *types.SystemContext) (func(), error) {
	if s.Egress == nil || s.Egress.Unrestricted || !strings.HasPrefix(s.URL, "docker://") {
		return func() {}, nil
	}
	if transfer.ProxyConfigured() {
		sys.DockerProxy = func(u *url.URL) (*url.URL, error) {
			if err := s.Egress.CheckHost(ctx, u.Hostname()); err != nil {
				return nil, err
			}
			return http.ProxyFromEnvironment(&http.Request{URL: u})
		}
		return func() {}, nil
	}
	socks, err := s.Egress.ServeSOCKS(ctx)
	if err != nil {
		return nil, err
	}
	s.socks, sys.DockerProxyURL = socks, socks.URL
	return socks.Close, nil
}

// fail names a registry failure; a connection the egress rule refused is told as such.
func (s *RegistrySource) fail(err error) error {
	if r := s.refused(nil); r != nil {
		return r
	}
	return registryError(err, s.URL)
}

// refused returns the egress rule's refusal if the rule refused a connection, else err.
func (s *RegistrySource) refused(err error) error {
	if s.socks != nil {
		if r := s.socks.Refusal(); r != nil {
			return r
		}
	}
	var te *transfer.Error
	if errors.As(err, &te) && te.Reason == transfer.ReasonForbiddenDestination {
		return te
	}
	return err
}

// Open reads the manifest (choosing the architecture from an index) and finds the disk.
func (s *RegistrySource) Open(ctx context.Context) (Object, error) {
	ref, err := s.reference()
	if err != nil {
		return nil, err
	}
	sys, cleanup, err := s.system(ctx)
	if err != nil {
		return nil, err
	}
	if s.PublicKeyFile != "" {
		if ref, err = s.verify(ctx, sys, ref); err != nil {
			err = s.refused(err)
			cleanup()
			return nil, err
		}
	}
	src, err := ref.NewImageSource(ctx, sys)
	if err != nil {
		cleanup()
		return nil, s.fail(err)
	}
	o := &registryObject{s: s, src: src, cleanup: cleanup}
	unparsed := image.UnparsedInstance(src, nil)
	raw, _, err := unparsed.Manifest(ctx) // cached: FromUnparsedImage reads it from there
	if err != nil {
		o.Close()
		return nil, s.fail(err)
	}
	if o.digest, err = manifest.Digest(raw); err != nil {
		o.Close()
		return nil, s.fail(err)
	}
	img, err := image.FromUnparsedImage(ctx, sys, unparsed)
	if err != nil {
		o.Close()
		return nil, s.fail(err)
	}
	layers := img.LayerInfos()
	if disks := artifactDisks(layers); len(disks) > 0 || s.Disk != "" {
		info, err := s.pickDisk(disks)
		if err != nil {
			o.Close()
			return nil, err
		}
		r, err := o.openArtifactDisk(ctx, info)
		if err != nil {
			o.Close()
			return nil, err
		}
		o.layer, o.size, o.first, o.artifact = info, info.Size, r, true
		return o, nil
	}
	for i := len(layers) - 1; i >= 0; i-- { // the top-most layer with a disk wins
		r, size, err := o.openDisk(ctx, layers[i])
		if err != nil {
			o.Close()
			return nil, err
		}
		if r != nil {
			o.layer, o.size, o.first = layers[i], size, r
			return o, nil
		}
	}
	o.Close()
	return nil, transfer.Permanent(transfer.ReasonSourceNotFound, "%s has no file under /disk/: it is not a container disk", s.URL)
}

// Revision resolves the image's tag to its manifest digest without reading a layer; with a
// public key, the signature of that digest is verified first.
func (s *RegistrySource) Revision(ctx context.Context) (string, error) {
	ref, err := s.reference()
	if err != nil {
		return "", err
	}
	sys, cleanup, err := s.system(ctx)
	if err != nil {
		return "", err
	}
	defer cleanup()
	if s.PublicKeyFile != "" {
		if ref, err = s.verify(ctx, sys, ref); err != nil {
			return "", s.refused(err)
		}
	}
	dgst, err := manifestDigest(ctx, sys, ref, s.URL)
	return dgst.String(), err
}

// verify checks the image's signature and returns a reference to it by digest.
func (s *RegistrySource) verify(ctx context.Context, sys *types.SystemContext, ref types.ImageReference) (types.ImageReference, error) {
	pem, err := os.ReadFile(s.PublicKeyFile)
	if err != nil {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "reading the signature's public key: %w", err)
	}
	key, err := parsePublicKey(pem)
	if err != nil {
		return nil, err
	}
	return verified(ctx, sys, ref, key, s.URL)
}

type registryObject struct {
	s       *RegistrySource
	src     types.ImageSource
	cleanup func()
	layer   types.BlobInfo
	size    int64
	first   io.ReadCloser
	// digest is the manifest's (a manifest list's, for a multi-architecture image): a tag's
	// revision, and what pins it.
	digest digest.Digest
	// artifact: the layer is a VM artifact's disk, the disk's bytes themselves (compressed),
	// not a tar holding it.
	artifact bool
}

func (o *registryObject) Size() int64        { return o.size }
func (o *registryObject) RandomAccess() bool { return false }
func (o *registryObject) Identity() string   { return "" } // a layer is decoded from its start
func (o *registryObject) Revision() string   { return o.digest.String() }

func (o *registryObject) Close() error {
	if o.first != nil {
		o.first.Close()
	}
	err := o.src.Close()
	o.cleanup()
	return err
}

// ReadRange returns the disk's bytes; the first call gets the layer Open found, later ones
// (after a transient failure) fetch the layer again.
func (o *registryObject) ReadRange(ctx context.Context, off, _ int64) (io.ReadCloser, error) {
	if off != 0 {
		return nil, transfer.Permanent(transfer.ReasonNeedsRandomAccess, "a container disk is read as a stream")
	}
	if r := o.first; r != nil {
		o.first = nil
		return r, nil
	}
	if o.artifact {
		return o.openArtifactDisk(ctx, o.layer)
	}
	r, _, err := o.openDisk(ctx, o.layer)
	if err == nil && r == nil {
		err = transfer.Permanent(transfer.ReasonSourceUnavailable, "the disk vanished from %s", o.s.URL)
	}
	return r, err
}

// openDisk streams the layer and returns a reader of its file under /disk/, or nil when the
// layer has none.
func (o *registryObject) openDisk(ctx context.Context, info types.BlobInfo) (io.ReadCloser, int64, error) {
	blob, _, err := o.src.GetBlob(ctx, info, none.NoCache)
	if err != nil {
		return nil, 0, o.s.fail(err)
	}
	verifier := info.Digest.Verifier()
	raw := io.TeeReader(blob, verifier)
	unpacked, _, err := compression.AutoDecompress(raw)
	if err != nil {
		blob.Close()
		return nil, 0, transfer.Permanent(transfer.ReasonMalformedImage, "layer %s: %w", info.Digest, err)
	}
	tr := tar.NewReader(unpacked)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			unpacked.Close()
			blob.Close()
			return nil, 0, nil
		}
		if err != nil {
			unpacked.Close()
			blob.Close()
			return nil, 0, layerError(err, info.Digest)
		}
		name := strings.TrimPrefix(path.Clean("/"+hdr.Name), "/")
		if hdr.Typeflag == tar.TypeReg && path.Dir(name) == "disk" {
			return &diskEntry{r: tr, blob: blob, unpacked: unpacked, raw: raw, verifier: verifier, digest: info.Digest}, hdr.Size, nil
		}
	}
}

// diskEntry reads a layer's disk file; at its end it reads the rest of the layer and checks
// the layer's digest, so a tampered or corrupt layer fails the import.
type diskEntry struct {
	r        io.Reader
	blob     io.ReadCloser
	unpacked io.ReadCloser
	raw      io.Reader
	verifier digest.Verifier
	digest   digest.Digest
}

func (d *diskEntry) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	if errors.Is(err, io.EOF) {
		if _, cerr := io.Copy(io.Discard, d.raw); cerr != nil {
			return n, layerError(cerr, d.digest)
		}
		if !d.verifier.Verified() {
			return n, transfer.Permanent(transfer.ReasonChecksumMismatch, "layer %s does not match its digest: the image is corrupt or was tampered with", d.digest)
		}
	} else if err != nil {
		err = layerError(err, d.digest)
	}
	return n, err
}

func (d *diskEntry) Close() error {
	d.unpacked.Close()
	return d.blob.Close()
}

// # KubeVirt's VM artifacts
//
// KubeVirt exports a VM as an OCI artifact (VEP 256): one layer per disk, of media type
// application/vnd.kubevirt.disk.raw+zstd (or raw+gzip, or raw), annotated with the disk's name
// (io.kubevirt.disk.name) and its claim's capacity, volume mode and access modes; other layers
// (the VM's persistent TPM and EFI state) are not disks. Such a layer is the disk itself, not a
// tar: it is streamed as any compressed raw image is, its compression told from its bytes and
// its digest checked at its end, with no scratch space.

// Media types and annotations of KubeVirt's VM artifacts.
const (
	artifactDiskPrefix  = "application/vnd.kubevirt.disk."
	annArtifactDiskName = "io.kubevirt.disk.name"
	AnnArtifactCapacity = "io.kubevirt.pvc.capacity"
)

// artifactDisks are the layers of layers that are VM artifact disks.
func artifactDisks(layers []types.BlobInfo) []types.BlobInfo {
	var disks []types.BlobInfo
	for _, l := range layers {
		if strings.HasPrefix(l.MediaType, artifactDiskPrefix) {
			disks = append(disks, l)
		}
	}
	return disks
}

// pickDisk is the disk of disks that s.Disk names (by name or digest), or the only one.
func (s *RegistrySource) pickDisk(disks []types.BlobInfo) (types.BlobInfo, error) {
	var names []string
	for _, d := range disks {
		name := d.Annotations[annArtifactDiskName]
		if s.Disk != "" && (s.Disk == name || s.Disk == d.Digest.String()) {
			return d, nil
		}
		names = append(names, fmt.Sprintf("%s (%s)", name, d.Digest))
	}
	switch {
	case len(disks) == 0:
		return types.BlobInfo{}, transfer.Permanent(transfer.ReasonSourceNotFound, "%s is not a KubeVirt VM artifact (no layer of media type %s*): it has no disk %q to pick", s.URL, artifactDiskPrefix, s.Disk)
	case s.Disk != "":
		return types.BlobInfo{}, transfer.Permanent(transfer.ReasonSourceNotFound, "the VM artifact %s has no disk %q: its disks are %s", s.URL, s.Disk, strings.Join(names, ", "))
	case len(disks) > 1:
		return types.BlobInfo{}, transfer.Permanent(transfer.ReasonInvalidArgument, "the VM artifact %s has %d disks, %s: name the one to import (its io.kubevirt.disk.name or digest)", s.URL, len(disks), strings.Join(names, ", "))
	}
	return disks[0], nil
}

// openArtifactDisk streams a VM artifact's disk layer, checking its digest at its end.
func (o *registryObject) openArtifactDisk(ctx context.Context, info types.BlobInfo) (io.ReadCloser, error) {
	blob, _, err := o.src.GetBlob(ctx, info, none.NoCache)
	if err != nil {
		return nil, o.s.fail(err)
	}
	return &verifiedBlob{ReadCloser: blob, verifier: info.Digest.Verifier(), digest: info.Digest}, nil
}

// capacity is the io.kubevirt.pvc.capacity of a VM artifact's disk, in bytes (0: none, or not
// an artifact): the size of the claim the disk was exported from, which the disk does not
// exceed, for sizing a volume before the compressed disk is read.
func (o *registryObject) capacity() int64 {
	q, err := resource.ParseQuantity(o.layer.Annotations[AnnArtifactCapacity])
	if !o.artifact || err != nil || q.Value() < o.layer.Size || q.Value() > transfer.MaxVirtualSize {
		return 0 // none, or not one the layer could hold
	}
	return q.Value()
}

// verifiedBlob reads a blob and checks its digest once it has been read to its end.
type verifiedBlob struct {
	io.ReadCloser
	verifier digest.Verifier
	digest   digest.Digest
}

func (v *verifiedBlob) Read(p []byte) (int, error) {
	n, err := v.ReadCloser.Read(p)
	_, _ = v.verifier.Write(p[:n])
	if errors.Is(err, io.EOF) && !v.verifier.Verified() {
		return n, transfer.Permanent(transfer.ReasonChecksumMismatch, "layer %s does not match its digest: the artifact is corrupt or was tampered with", v.digest)
	}
	return n, err
}

func layerError(err error, dg digest.Digest) error {
	var te *transfer.Error
	if errors.As(err, &te) {
		return err
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, tar.ErrHeader) {
		return transfer.Transient(transfer.ReasonSourceUnavailable, "layer %s: %w", dg, err)
	}
	return classifyNetError(fmt.Errorf("layer %s: %w", dg, err), "registry")
}

// registryError names registry failures by what a user can do about them.
func registryError(err error, url string) error {
	msg := strings.ToLower(err.Error())
	var unauthorized docker.ErrUnauthorizedForCredentials
	switch {
	case errors.As(err, &unauthorized) || strings.Contains(msg, "unauthorized") || strings.Contains(msg, "authentication required") ||
		strings.Contains(msg, "denied"):
		return transfer.Permanent(transfer.ReasonSourceForbidden, "%s: %w", url, err)
	case strings.Contains(msg, "manifest unknown") || strings.Contains(msg, "name unknown") ||
		strings.Contains(msg, "not found") || strings.Contains(msg, "no such file") ||
		strings.Contains(msg, "no image found") || strings.Contains(msg, "choosing image instance"):
		return transfer.Permanent(transfer.ReasonSourceNotFound, "%s: %w", url, err)
	}
	return classifyNetError(err, url)
}
