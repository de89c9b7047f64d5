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
