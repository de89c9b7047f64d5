// Package registrytest runs a real OCI registry (Debian's docker-registry, distribution) for
// tests, and builds and pushes container disks the way KubeVirt's are built.
package registrytest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/payload"

	"github.com/diskpipe/diskpipe/test/freeport"
)

// T is what the helpers need of a test: *testing.T, or Ginkgo's GinkgoT().
type T interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Skip(args ...any)
	Cleanup(func())
	TempDir() string
}

func writeFileT(t T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// Blob is a content-addressed piece of an OCI image.
type Blob struct {
	Digest string
	Data   []byte
}

// NewBlob addresses b by its sha256.
func NewBlob(b []byte) Blob {
	sum := sha256.Sum256(b)
	return Blob{Digest: "sha256:" + hex.EncodeToString(sum[:]), Data: b}
}

// Descriptor describes b for a manifest or index.
func Descriptor(mediaType string, b Blob, extra map[string]any) map[string]any {
	d := map[string]any{"mediaType": mediaType, "digest": b.Digest, "size": len(b.Data)}
	for k, v := range extra {
		d[k] = v
	}
	return d
}

func mustJSON(t T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Image is an image manifest and the blobs it refers to.
type Image struct {
	Manifest Blob
	Blobs    []Blob
}

// ContainerDisk builds a container disk the way KubeVirt's are built: one gzip layer holding
// /disk/ and the image file in it.
func ContainerDisk(t T, disk, arch, dir string) Image {
	t.Helper()
	content, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	var tarBuf bytes.Buffer
	tw := tar.NewWriter(&tarBuf)
	_ = tw.WriteHeader(&tar.Header{Name: dir + "/", Typeflag: tar.TypeDir, Mode: 0o555})
	if err := tw.WriteHeader(&tar.Header{Name: dir + "/disk.img", Typeflag: tar.TypeReg, Mode: 0o444, Size: int64(len(content)), Uid: 107}); err != nil {
		t.Fatal(err)
	}
	_, _ = tw.Write(content)
	_ = tw.Close()
	diffID := NewBlob(tarBuf.Bytes()).Digest
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(tarBuf.Bytes())
	_ = zw.Close()
	layer := NewBlob(gz.Bytes())
	config := NewBlob(mustJSON(t, map[string]any{"architecture": arch, "os": "linux",
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{diffID}}}))
	manifest := NewBlob(mustJSON(t, map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": Descriptor("application/vnd.oci.image.config.v1+json", config, nil),
		"layers": []any{Descriptor("application/vnd.oci.image.layer.v1.tar+gzip", layer, nil)}}))
	return Image{Manifest: manifest, Blobs: []Blob{config, layer}}
}

// Index is an image index of one image per architecture.
func Index(t T, images map[string]Image) Blob {
	t.Helper()
	var ms []any
	for arch, img := range images {
		ms = append(ms, Descriptor("application/vnd.oci.image.manifest.v1+json", img.Manifest,
			map[string]any{"platform": map[string]string{"architecture": arch, "os": "linux"}}))
	}
	return NewBlob(mustJSON(t, map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": ms}))
}

// Start runs Debian's docker-registry (distribution) on a free loopback port and returns its
// address.
func Start(t T) string {
	t.Helper()
	return StartWith(t, "", http.DefaultClient)
}

// StartAt runs the registry on host (an address pods of a real cluster reach).
func StartAt(t T, host string) string {
	t.Helper()
	return startOn(t, host, "", http.DefaultClient)
}

// StartAtWith runs the registry on host with extra configuration (e.g. tls under http);
// client checks that it is up.
func StartAtWith(t T, host, extra string, client *http.Client) string {
	t.Helper()
	return startOn(t, host, extra, client)
}

// StartWith runs the registry with extra configuration; client checks that it is up.
func StartWith(t T, extra string, client *http.Client) string {
	t.Helper()
	return startOn(t, "127.0.0.1", extra, client)
}

func startOn(t T, host, extra string, client *http.Client) string {
	t.Helper()
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		t.Skip("docker-registry is not installed (hack/setup.sh installs it): registry pulls are not tested")
	}
	addr, err := freeport.Addr(host)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yml")
	writeFileT(t, cfg, []byte(fmt.Sprintf("version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n%s",
		filepath.Join(dir, "data"), addr, extra)))
	cmd := exec.Command(bin, "serve", cfg)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	scheme := "http://"
	if strings.Contains(extra, "tls:") {
		scheme = "https://"
	}
	for i := 0; ; i++ {
		resp, err := client.Get(scheme + addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			break
		}
		if i > 100 {
			t.Fatalf("the registry did not start: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return addr
}

// Push uploads blobs and a manifest (or index) with the distribution API.
func Push(t T, addr, repo, tag string, manifest Blob, mediaType string, blobs []Blob) {
	t.Helper()
	PushWith(t, http.DefaultClient, "http://"+addr, "", "", repo, tag, manifest, mediaType, blobs)
}

// PushWith pushes through c to base (http:// or https://), with basic auth if user is set.
func PushWith(t T, c *http.Client, base, user, pass, repo, tag string, manifest Blob, mediaType string, blobs []Blob) {
	t.Helper()
	do := func(method, url string, body []byte, contentType string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, url, bytes.NewReader(body))
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		return resp
	}
	for _, b := range blobs {
		resp := do(http.MethodPost, base+"/v2/"+repo+"/blobs/uploads/", nil, "")
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("starting an upload: %v", resp.Status)
		}
		resp.Body.Close()
		loc := resp.Header.Get("Location")
		if !strings.HasPrefix(loc, "http") {
			loc = base + loc
		}
		sep := "?"
		if strings.Contains(loc, "?") {
			sep = "&"
		}
		resp = do(http.MethodPut, loc+sep+"digest="+b.Digest, b.Data, "application/octet-stream")
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("uploading %s: %v", b.Digest, resp.Status)
		}
		resp.Body.Close()
	}
	resp := do(http.MethodPut, base+"/v2/"+repo+"/manifests/"+tag, manifest.Data, mediaType)
	if resp.StatusCode != http.StatusCreated {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("pushing the manifest: %v %s", resp.Status, b)
	}
	resp.Body.Close()
}

// Signer signs images as `cosign sign --key` does, with sigstore's Go libraries: a
// simple-signing payload naming the image's digest, signed by an ECDSA P-256 key, pushed as
// the layer of the image <repository>:sha256-<hex>.sig with the signature in its annotation.
type Signer struct {
	sv signature.SignerVerifier
	// PublicKey is the PEM public key, as cosign.pub.
	PublicKey []byte
}

// NewSigner makes a key pair.
func NewSigner(t T) *Signer {
	t.Helper()
	sv, _, err := signature.NewDefaultECDSASignerVerifier()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := sv.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	pem, err := cryptoutils.MarshalPublicKeyToPEM(pub)
	if err != nil {
		t.Fatal(err)
	}
	return &Signer{sv: sv, PublicKey: pem}
}

// Sign pushes the signature of the image of manifest digest dgst in repo.
func (s *Signer) Sign(t T, addr, repo, dgst string) { s.SignAs(t, addr, repo, dgst, dgst) }

// SignAs pushes, as the signature of the image of digest at, a signature of the image of
// digest signed: what a registry holds when an image was replaced after it was signed.
func (s *Signer) SignAs(t T, addr, repo, at, signed string) {
	t.Helper()
	d, err := name.NewDigest(addr+"/"+repo+"@"+signed, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := payload.Cosign{Image: d, ClaimedIdentity: addr + "/" + repo}.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	sig, err := s.sv.SignMessage(bytes.NewReader(pl))
	if err != nil {
		t.Fatal(err)
	}
	layer := NewBlob(pl)
	config := NewBlob(mustJSON(t, map[string]any{"architecture": "", "os": "", "config": map[string]any{},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layer.Digest}}}))
	m := NewBlob(mustJSON(t, map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": Descriptor("application/vnd.oci.image.config.v1+json", config, nil),
		"layers": []any{Descriptor("application/vnd.dev.cosign.simplesigning.v1+json", layer,
			map[string]any{"annotations": map[string]string{"dev.cosignproject.cosign/signature": base64.StdEncoding.EncodeToString(sig)}})},
	}))
	Push(t, addr, repo, strings.Replace(at, ":", "-", 1)+".sig", m, "application/vnd.oci.image.manifest.v1+json", []Blob{config, layer})
}
