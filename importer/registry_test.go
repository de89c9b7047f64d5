package importer

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// blob is a content-addressed piece of an OCI image.
type blob struct {
	digest string
	data   []byte
}

func newBlob(b []byte) blob {
	sum := sha256.Sum256(b)
	return blob{digest: "sha256:" + hex.EncodeToString(sum[:]), data: b}
}

func descriptor(mediaType string, b blob, extra map[string]any) map[string]any {
	d := map[string]any{"mediaType": mediaType, "digest": b.digest, "size": len(b.data)}
	for k, v := range extra {
		d[k] = v
	}
	return d
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ociImage is an image manifest and the blobs it refers to.
type ociImage struct {
	manifest blob
	blobs    []blob
}

// containerDisk builds a container disk the way KubeVirt's are built: one gzip layer holding
// /disk/ and the image file in it.
func containerDisk(t *testing.T, disk, arch, dir string) ociImage {
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
	diffID := newBlob(tarBuf.Bytes()).digest
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(tarBuf.Bytes())
	_ = zw.Close()
	layer := newBlob(gz.Bytes())
	config := newBlob(mustJSON(t, map[string]any{"architecture": arch, "os": "linux",
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{diffID}}}))
	manifest := newBlob(mustJSON(t, map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": descriptor("application/vnd.oci.image.config.v1+json", config, nil),
		"layers": []any{descriptor("application/vnd.oci.image.layer.v1.tar+gzip", layer, nil)}}))
	return ociImage{manifest: manifest, blobs: []blob{config, layer}}
}

func index(t *testing.T, images map[string]ociImage) blob {
	t.Helper()
	var ms []any
	for arch, img := range images {
		ms = append(ms, descriptor("application/vnd.oci.image.manifest.v1+json", img.manifest,
			map[string]any{"platform": map[string]string{"architecture": arch, "os": "linux"}}))
	}
	return newBlob(mustJSON(t, map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": ms}))
}

// ociArchive writes an OCI layout holding img as a tar archive.
func ociArchive(t *testing.T, img ociImage, tamper bool) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "image.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	add := func(name string, b []byte) {
		_ = tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b))})
		_, _ = tw.Write(b)
	}
	add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	add("index.json", mustJSON(t, map[string]any{"schemaVersion": 2,
		"manifests": []any{descriptor("application/vnd.oci.image.manifest.v1+json", img.manifest, nil)}}))
	for _, b := range append([]blob{img.manifest}, img.blobs...) {
		data := b.data
		if tamper && b.digest == img.blobs[len(img.blobs)-1].digest { // the layer
			data = append([]byte(nil), data...)
			data[len(data)/2] ^= 0xff
		}
		add("blobs/sha256/"+strings.TrimPrefix(b.digest, "sha256:"), data)
	}
	_ = tw.Close()
	return p
}

// registry runs Debian's docker-registry (distribution) on a free loopback port.
func registry(t *testing.T) string {
	t.Helper()
	return registryWith(t, "", http.DefaultClient)
}

// registryWith runs the registry with extra configuration; client checks that it is up.
func registryWith(t *testing.T, extra string, client *http.Client) string {
	t.Helper()
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		t.Skip("docker-registry is not installed (hack/setup.sh installs it): registry pulls are not tested")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yml")
	writeFile(t, cfg, []byte(fmt.Sprintf("version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n%s",
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

// push uploads blobs and a manifest (or index) with the distribution API.
func push(t *testing.T, addr, repo, tag string, manifest blob, mediaType string, blobs []blob) {
	t.Helper()
	pushWith(t, http.DefaultClient, "http://"+addr, "", "", repo, tag, manifest, mediaType, blobs)
}

func pushWith(t *testing.T, c *http.Client, base, user, pass, repo, tag string, manifest blob, mediaType string, blobs []blob) {
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
		resp = do(http.MethodPut, loc+sep+"digest="+b.digest, b.data, "application/octet-stream")
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("uploading %s: %v", b.digest, resp.Status)
		}
		resp.Body.Close()
	}
	resp := do(http.MethodPut, base+"/v2/"+repo+"/manifests/"+tag, manifest.data, mediaType)
	if resp.StatusCode != http.StatusCreated {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("pushing the manifest: %v %s", resp.Status, b)
	}
	resp.Body.Close()
}

// TestRegistrySource imports container disks from an OCI archive and from a real registry,
// a qcow2 disk streamed out of a gzip layer, with architecture selection from an index.
func TestRegistrySource(t *testing.T) {
	dir := t.TempDir()
	raw := makeRaw(t, dir)
	qcow := convertTo(t, raw, "qcow2", "-c")
	other := filepath.Join(dir, "arm.raw")
	writeFile(t, other, bytes.Repeat([]byte("arm64 disk "), 400000))
	amd := containerDisk(t, qcow, "amd64", "disk")
	arm := containerDisk(t, other, "arm64", "disk")

	t.Run("oci-archive", func(t *testing.T) {
		target, res := mustImport(t, t.TempDir(), Options{Source: &RegistrySource{URL: "oci-archive:" + ociArchive(t, amd, false)}})
		sameDisk(t, raw, target)
		if res.Format != "qcow2" {
			t.Errorf("format %s", res.Format)
		}
	})
	t.Run("tampered layer", func(t *testing.T) {
		target, _, err := importTo(t, t.TempDir(), Options{Source: &RegistrySource{URL: "oci-archive:" + ociArchive(t, amd, true)}})
		if err == nil {
			t.Fatal("a tampered layer was imported")
		}
		if r := transfer.ReasonOf(err); r != transfer.ReasonChecksumMismatch && r != transfer.ReasonMalformedImage {
			t.Errorf("reason %s: %v", r, err)
		}
		if _, serr := os.Stat(target); serr == nil {
			t.Error("the target was left behind")
		}
	})

	addr := registry(t)
	idx := index(t, map[string]ociImage{"amd64": amd, "arm64": arm})
	push(t, addr, "containerdisks/test", "latest", idx, "application/vnd.oci.image.index.v1+json",
		append(append([]blob{amd.manifest, arm.manifest}, amd.blobs...), arm.blobs...))
	noDisk := containerDisk(t, other, "amd64", "data")
	push(t, addr, "containerdisks/nodisk", "latest", noDisk.manifest, "application/vnd.oci.image.manifest.v1+json", noDisk.blobs)
	url := "docker://" + addr + "/containerdisks/test:latest"

	for _, c := range []struct{ arch, want string }{{"", raw}, {"amd64", raw}, {"arm64", other}} {
		t.Run("docker "+c.arch, func(t *testing.T) {
			target, _ := mustImport(t, t.TempDir(), Options{Source: &RegistrySource{URL: url, Insecure: true, Architecture: c.arch}})
			sameDisk(t, c.want, target)
		})
	}
	t.Run("command", func(t *testing.T) {
		target := filepath.Join(t.TempDir(), "disk.img")
		code, res, log := runMain(t, "--source", "registry", "--url", url, "--insecure", "--architecture", "arm64", "--target", target)
		if code != 0 {
			t.Fatalf("exit %d %+v\n%s", code, res, log)
		}
		sameDisk(t, other, target)
	})
	for _, c := range []struct {
		name, url string
		reason    transfer.Reason
		msg       string
	}{
		{"missing tag", "docker://" + addr + "/containerdisks/test:nope", transfer.ReasonSourceNotFound, "manifest unknown"},
		{"no disk", "docker://" + addr + "/containerdisks/nodisk:latest", transfer.ReasonSourceNotFound, "has no file under /disk/"},
		{"bad url", "quay.io/containerdisks/fedora:40", transfer.ReasonInvalidArgument, "must start with docker:// or oci-archive:"},
	} {
		t.Run(c.name, func(t *testing.T) {
			target, _, err := importTo(t, t.TempDir(), Options{Source: &RegistrySource{URL: c.url, Insecure: true}})
			wantFailure(t, target, err, c.reason, false, c.msg)
		})
	}
}

// TestRegistryCredentials pulls from a registry that serves TLS with a certificate only the
// given CA bundle trusts and asks for credentials, given as a .dockerconfigjson.
func TestRegistryCredentials(t *testing.T) {
	if _, err := exec.LookPath("docker-registry"); err != nil {
		t.Skip("docker-registry is not installed (hack/setup.sh installs it): registry pulls are not tested")
	}
	dir := t.TempDir()
	raw := makeRaw(t, dir)
	certPEM, keyPEM := selfSigned(t)
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeFile(t, cert, certPEM)
	writeFile(t, key, keyPEM)
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	htpasswd := filepath.Join(dir, "htpasswd")
	writeFile(t, htpasswd, []byte("alice:"+string(hash)+"\n"))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	addr := registryWith(t, fmt.Sprintf("  tls:\n    certificate: %s\n    key: %s\nauth:\n  htpasswd:\n    realm: diskpipe\n    path: %s\n",
		cert, key, htpasswd), client)
	img := containerDisk(t, convertTo(t, raw, "qcow2"), "amd64", "disk")
	pushWith(t, client, "https://"+addr, "alice", "s3cret", "private/disk", "v1", img.manifest,
		"application/vnd.oci.image.manifest.v1+json", img.blobs)

	auth := filepath.Join(dir, "config.json")
	writeFile(t, auth, mustJSON(t, map[string]any{"auths": map[string]any{
		addr: map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte("alice:s3cret"))}}}))
	url := "docker://" + addr + "/private/disk:v1"
	target, _ := mustImport(t, t.TempDir(), Options{Source: &RegistrySource{URL: url, CAFile: cert, AuthFile: auth}})
	sameDisk(t, raw, target)

	target, _, err = importTo(t, t.TempDir(), Options{Source: &RegistrySource{URL: url, CAFile: cert}})
	wantFailure(t, target, err, transfer.ReasonSourceForbidden, false, "")
	target, _, err = importTo(t, t.TempDir(), Options{Source: &RegistrySource{URL: url, AuthFile: auth}})
	wantFailure(t, target, err, transfer.ReasonTLSError, false, "certificate")
}

// selfSigned makes a certificate for 127.0.0.1 and its key, PEM-encoded.
func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}
