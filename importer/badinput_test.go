package importer

import (
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha512"
	"encoding/hex"
	"encoding/pem"
	"hash"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/test/freeport"
)

func digestFile(t *testing.T, path, alg string, h hash.Hash) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return alg + ":" + hex.EncodeToString(h.Sum(nil))
}

// TestChecksum verifies the source's digest while streaming (raw, compressed) and while
// converting at random (qcow2), and refuses a mismatch leaving nothing behind.
func TestChecksum(t *testing.T) {
	dir := t.TempDir()
	raw := makeRaw(t, dir)
	qcow := convertTo(t, raw, "qcow2")
	xzf := compress(t, raw, "xz")
	for _, src := range []string{raw, qcow, xzf} {
		t.Run(filepath.Base(src), func(t *testing.T) {
			want := sha256File(t, src)
			url := serve(t, &fileServer{path: src})
			target, res := mustImport(t, t.TempDir(), Options{Source: &HTTPSource{URL: url}, Checksum: want})
			sameDisk(t, raw, target)
			if res.Digest != want {
				t.Errorf("digest %s, want %s", res.Digest, want)
			}
			if res.BytesRead < fileSize(t, src) {
				t.Errorf("read %d bytes of %d: the checksum cannot have covered the whole source", res.BytesRead, fileSize(t, src))
			}

			bad := "sha256:" + hex.EncodeToString(make([]byte, 32))
			target, _, err := importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: url}, Checksum: bad})
			wantFailure(t, target, err, transfer.ReasonChecksumMismatch, false, "checksum mismatch")
		})
	}
	t.Run("other algorithms", func(t *testing.T) {
		url := serve(t, &fileServer{path: raw})
		for alg, h := range map[string]hash.Hash{"sha512": sha512.New(), "sha1": sha1.New(), "md5": md5.New()} {
			want := digestFile(t, raw, alg, h)
			_, res := mustImport(t, t.TempDir(), Options{Source: &HTTPSource{URL: url}, Checksum: want})
			if res.Digest != want {
				t.Errorf("%s digest %s, want %s", alg, res.Digest, want)
			}
		}
	})
	t.Run("malformed", func(t *testing.T) {
		url := serve(t, &fileServer{path: raw})
		target, _, err := importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: url}, Checksum: "sha256:abc"})
		wantFailure(t, target, err, transfer.ReasonInvalidArgument, false, "sha256 takes 64 hex digits")
	})
}

func fileSize(t *testing.T, p string) int64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestTLS refuses a certificate the client does not trust, and accepts it with its CA.
func TestTLS(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	srv := httptest.NewTLSServer(&fileServer{path: raw})
	t.Cleanup(srv.Close)
	url := srv.URL + "/disk.raw"

	target, _, err := importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: url}})
	wantFailure(t, target, err, transfer.ReasonTLSError, false, "certificate")

	ca := filepath.Join(t.TempDir(), "ca.crt")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(ca, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	target, _ = mustImport(t, t.TempDir(), Options{Source: &HTTPSource{URL: url, CAFile: ca}})
	sameDisk(t, raw, target)
	target, _ = mustImport(t, t.TempDir(), Options{Source: &HTTPSource{URL: url, Insecure: true}})
	sameDisk(t, raw, target)
}

// TestBadImages refuses what cannot be imported safely, each with its own reason.
func TestBadImages(t *testing.T) {
	dir := t.TempDir()
	raw := makeRaw(t, dir)
	qcow := convertTo(t, raw, "qcow2")

	backed := filepath.Join(dir, "backed.qcow2")
	runTool(t, "qemu-img", "create", "-f", "qcow2", "-b", qcow, "-F", "qcow2", backed)

	external := filepath.Join(dir, "external.qcow2")
	runTool(t, "qemu-img", "create", "-f", "qcow2", "-o", "data_file="+filepath.Join(dir, "external.data"), external, "64M")

	encrypted := filepath.Join(dir, "encrypted.qcow2")
	// LUKS key setup times the CPU and now and then fails on a busy VM ("Unable to get
	// accurate CPU usage"): try a few times.
	for attempt := 1; ; attempt++ {
		out, err := qemuImgOutput("create", "--object", "secret,id=sec0,data=123456", "-f", "qcow2",
			"-o", "encrypt.format=luks,encrypt.key-secret=sec0,encrypt.iter-time=10", encrypted, "64M")
		if err == nil {
			break
		}
		if attempt == 5 {
			t.Fatalf("qemu-img create (encrypted): %v\n%s", err, out)
		}
	}

	truncated := filepath.Join(dir, "truncated.qcow2")
	b, _ := os.ReadFile(qcow)
	writeFile(t, truncated, b[:len(b)/2])

	headerOnly := filepath.Join(dir, "header-only.qcow2")
	writeFile(t, headerOnly, b[:50])

	garbage := filepath.Join(dir, "garbage.qcow2")
	g := append([]byte(nil), b[:4096]...)
	g[20], g[21], g[22], g[23] = 0, 0, 0, 40 // cluster bits 40
	writeFile(t, garbage, g)

	xzf := compress(t, raw, "xz")
	xb, _ := os.ReadFile(xzf)
	truncatedXz := filepath.Join(dir, "truncated.raw.xz")
	writeFile(t, truncatedXz, xb[:len(xb)/2])

	vmdkBase := convertTo(t, raw, "vmdk")
	vmdkChild := filepath.Join(dir, "child.vmdk")
	runTool(t, "qemu-img", "create", "-f", "vmdk", "-b", vmdkBase, "-F", "vmdk", vmdkChild)
	vmdkFlat := filepath.Join(dir, "flat.vmdk")
	runTool(t, "qemu-img", "create", "-f", "vmdk", "-o", "subformat=monolithicFlat", vmdkFlat, "64M")
	vdi := convertTo(t, raw, "vdi")
	vb, _ := os.ReadFile(vdi)
	truncatedVDI := filepath.Join(dir, "truncated.vdi")
	writeFile(t, truncatedVDI, vb[:300])
	hb, _ := os.ReadFile(convertTo(t, raw, "vhdx"))
	truncatedVHDX := filepath.Join(dir, "truncated.vhdx")
	writeFile(t, truncatedVHDX, hb[:200<<10])

	for _, c := range []struct {
		name, path string
		reason     transfer.Reason
		msg        string
	}{
		{"backing file", backed, transfer.ReasonBackingFile, "has a backing file"},
		{"external data file", external, transfer.ReasonUnsupportedFormat, "external data file"},
		{"encrypted", encrypted, transfer.ReasonEncrypted, "encrypted"},
		{"truncated qcow2", truncated, transfer.ReasonTruncatedImage, "truncated"},
		{"qcow2 header cut short", headerOnly, transfer.ReasonTruncatedImage, "the header needs 72 bytes"},
		{"malformed qcow2 header", garbage, transfer.ReasonMalformedImage, "cluster bits 40"},
		{"truncated xz", truncatedXz, transfer.ReasonMalformedImage, "xz"},
		{"vmdk with a parent", vmdkChild, transfer.ReasonBackingFile, "the vmdk image has a parent"},
		{"vmdk descriptor only", vmdkFlat, transfer.ReasonUnsupportedFormat, "a descriptor whose data lies in other files"},
		{"truncated vdi", truncatedVDI, transfer.ReasonTruncatedImage, "the header needs"},
		{"truncated vhdx", truncatedVHDX, transfer.ReasonTruncatedImage, "truncated vhdx image"},
	} {
		t.Run(c.name, func(t *testing.T) {
			url := serve(t, &fileServer{path: c.path})
			target, _, err := importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: url}})
			wantFailure(t, target, err, c.reason, false, c.msg)
		})
	}
}

func writeFile(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestTooLarge refuses an image whose virtual size exceeds the volume less its filesystem
// overhead, before writing anything.
func TestTooLarge(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	url := serve(t, &fileServer{path: convertTo(t, raw, "qcow2")})
	// 66 MiB less 6 % is 62 MiB: too small for 64 MiB.
	target, _, err := importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: url}, Capacity: 66 << 20})
	wantFailure(t, target, err, transfer.ReasonTooLarge, false, "is larger than the volume")
	// 69 MiB less 6 % is 64.9 MiB: enough.
	target, _ = mustImport(t, t.TempDir(), Options{Source: &HTTPSource{URL: url}, Capacity: 69 << 20})
	sameDisk(t, raw, target)
	// A compressed stream's size shows only while streaming.
	url = serve(t, &fileServer{path: compress(t, raw, "zstd")})
	target, _, err = importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: url}, Capacity: 66 << 20})
	wantFailure(t, target, err, transfer.ReasonTooLarge, false, "is larger than the volume")
}

// TestInvalidURL refuses what is not an http(s) URL.
func TestInvalidURL(t *testing.T) {
	target, _, err := importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: "ftp://example.com/disk.img"}})
	wantFailure(t, target, err, transfer.ReasonInvalidArgument, false, "is not an http:// or https:// URL")
}

// TestPresignedURLRedacted: a presigned URL's query is a credential; an unreachable source's
// error, which ends in logs and in the object's status, names the URL without it. (The chaos
// suite found the store's presigned URLs in importer logs while the store was down.)
func TestPresignedURLRedacted(t *testing.T) {
	addr, err := freeport.Addr("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://user:pw@" + addr + "/bucket/disk.raw?X-Amz-Credential=AKID&X-Amz-Signature=0123456789abcdef"
	_, _, err = importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: url}, Retry: fastRetry})
	if err == nil {
		t.Fatal("an import from a closed port succeeded")
	}
	for _, secret := range []string{"0123456789abcdef", "AKID", "pw@"} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("the error shows %q: %v", secret, err)
		}
	}
	if !strings.Contains(err.Error(), addr+"/bucket/disk.raw") {
		t.Errorf("the error does not name the source: %v", err)
	}
}
