package importer

import (
	"archive/tar"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
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

	"github.com/diskpipe/diskpipe/importer/registrytest"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// The registry helpers live in registrytest, shared with the end-to-end tests.
type (
	blob     = registrytest.Blob
	ociImage = registrytest.Image
)

var descriptor = registrytest.Descriptor

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func containerDisk(t *testing.T, disk, arch, dir string) ociImage {
	return registrytest.ContainerDisk(t, disk, arch, dir)
}
func index(t *testing.T, images map[string]ociImage) blob { return registrytest.Index(t, images) }
func registry(t *testing.T) string                        { return registrytest.Start(t) }
func registryWith(t *testing.T, extra string, c *http.Client) string {
	return registrytest.StartWith(t, extra, c)
}
func push(t *testing.T, addr, repo, tag string, manifest blob, mediaType string, blobs []blob) {
	registrytest.Push(t, addr, repo, tag, manifest, mediaType, blobs)
}
func pushWith(t *testing.T, c *http.Client, base, user, pass, repo, tag string, manifest blob, mediaType string, blobs []blob) {
	registrytest.PushWith(t, c, base, user, pass, repo, tag, manifest, mediaType, blobs)
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
		"manifests": []any{descriptor("application/vnd.oci.image.manifest.v1+json", img.Manifest, nil)}}))
	for _, b := range append([]blob{img.Manifest}, img.Blobs...) {
		data := b.Data
		if tamper && b.Digest == img.Blobs[len(img.Blobs)-1].Digest { // the layer
			data = append([]byte(nil), data...)
			data[len(data)/2] ^= 0xff
		}
		add("blobs/sha256/"+strings.TrimPrefix(b.Digest, "sha256:"), data)
	}
	_ = tw.Close()
	return p
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
		append(append([]blob{amd.Manifest, arm.Manifest}, amd.Blobs...), arm.Blobs...))
	noDisk := containerDisk(t, other, "amd64", "data")
	push(t, addr, "containerdisks/nodisk", "latest", noDisk.Manifest, "application/vnd.oci.image.manifest.v1+json", noDisk.Blobs)
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
	pushWith(t, client, "https://"+addr, "alice", "s3cret", "private/disk", "v1", img.Manifest,
		"application/vnd.oci.image.manifest.v1+json", img.Blobs)

	auth := filepath.Join(dir, "config.json")
	writeFile(t, auth, mustJSON(t, map[string]any{"auths": map[string]any{
		addr: map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte("alice:s3cret"))}}}))
	url := "docker://" + addr + "/private/disk:v1"
	target, _ := mustImport(t, t.TempDir(), Options{Source: &RegistrySource{URL: url, CAFile: cert, AuthFile: auth}})
	sameDisk(t, raw, target)

	// CDI's forms, as mounted: a Secret of accessKeyId and secretKey, a ConfigMap whose key is
	// not ca.crt.
	secret, caDir := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(secret, "accessKeyId"), []byte("alice\n"))
	writeFile(t, filepath.Join(secret, "secretKey"), []byte("s3cret"))
	writeFile(t, filepath.Join(caDir, "ca.pem"), certPEM)
	cdi := &RegistrySource{URL: url, CAFile: caDir}
	if err := cdi.loadCredentials(secret); err != nil {
		t.Fatal(err)
	}
	target, _ = mustImport(t, t.TempDir(), Options{Source: cdi})
	sameDisk(t, raw, target)
	// A Secret of neither form says which keys it lacks.
	if err := (&RegistrySource{}).loadCredentials(t.TempDir()); err == nil || !strings.Contains(err.Error(), "neither username nor accessKeyId") {
		t.Fatalf("an empty Secret: %v", err)
	}

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
