package importer

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// TestProbe tells each format's virtual size without writing anything.
func TestProbe(t *testing.T) {
	dir := t.TempDir()
	raw := makeRaw(t, dir)
	for _, c := range []struct {
		name, path string
		noRange    bool
		format     string
		size       int64
	}{
		{"raw", raw, false, "raw", fixtureSize},
		{"qcow2", convertTo(t, raw, "qcow2", "-c"), false, "qcow2", fixtureSize},
		{"qcow2 without Range", convertTo(t, raw, "qcow2"), true, "qcow2", fixtureSize},
		{"qcow2.xz", compress(t, convertTo(t, raw, "qcow2"), "xz"), false, "qcow2", fixtureSize},
		{"vmdk", convertTo(t, raw, "vmdk"), false, "vmdk", fixtureSize},
		{"vhdx", convertTo(t, raw, "vhdx"), false, "vhdx", fixtureSize},
		{"raw.zst", compress(t, raw, "zstd"), false, "raw", -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &fileServer{path: c.path, noRange: c.noRange}
			res, err := Probe(t.Context(), Options{Source: &HTTPSource{URL: serve(t, s)}, Retry: fastRetry})
			if err != nil {
				t.Fatal(err)
			}
			if res.Format != c.format || res.VirtualSize != c.size {
				t.Errorf("probe: %s of %d bytes, want %s of %d", res.Format, res.VirtualSize, c.format, c.size)
			}
			if sent := s.sent.Load(); sent > 16<<20 {
				t.Errorf("the probe read %d bytes", sent)
			}
		})
	}
	_, err := Probe(t.Context(), Options{Source: &HTTPSource{URL: serve(t, &fileServer{path: "x", status: 404})}, Retry: fastRetry})
	if transfer.ReasonOf(err) != transfer.ReasonSourceNotFound {
		t.Errorf("404: %v", err)
	}
}

// TestProbeCommand: the probe command succeeds, with exit code 0 and the size in its result.
func TestProbeCommand(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	url := serve(t, &fileServer{path: convertTo(t, raw, "qcow2")})
	code, res, log := runMain(t, "--url", url, "--probe")
	if code != transfer.ExitSucceeded || !res.Succeeded || res.Format != "qcow2" || res.VirtualSize != fixtureSize {
		t.Fatalf("exit %d, result %+v\n%s", code, res, log)
	}
}

// TestCheck tells each source's revision from one small request, reading no image, and a
// new revision once the source changes.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	raw := makeRaw(t, dir)
	check := func(t *testing.T, src Source) (*transfer.Result, error) {
		t.Helper()
		return Check(t.Context(), Options{Source: src, Retry: fastRetry})
	}

	t.Run("ETag", func(t *testing.T) {
		path := convertTo(t, raw, "qcow2")
		s := &fileServer{path: path}
		url := serve(t, s)
		res, err := check(t, &HTTPSource{URL: url})
		if err != nil || !res.Succeeded {
			t.Fatal(err)
		}
		fi, _ := os.Stat(path)
		if want := fmt.Sprintf(`"%x-%x"`, fi.ModTime().UnixNano(), fi.Size()); res.Revision != want {
			t.Errorf("revision %q, want the ETag %q", res.Revision, want)
		}
		if sent := s.sent.Load(); sent > 1 {
			t.Errorf("the check read %d bytes of the image", sent)
		}
		again, _ := check(t, &HTTPSource{URL: url})
		if again.Revision != res.Revision {
			t.Errorf("an unchanged file changed revision: %q then %q", res.Revision, again.Revision)
		}
		writeFile(t, path, []byte("a new image"))
		if err := os.Chtimes(path, time.Time{}, fi.ModTime().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		changed, _ := check(t, &HTTPSource{URL: url})
		if changed.Revision == res.Revision || changed.Revision == "" {
			t.Errorf("a changed file kept revision %q", changed.Revision)
		}
	})
	t.Run("Last-Modified only", func(t *testing.T) {
		modified := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.ServeContent(w, r, "disk.raw", modified, bytes.NewReader([]byte("a raw disk")))
		}))
		t.Cleanup(srv.Close)
		res, err := check(t, &HTTPSource{URL: srv.URL + "/disk.raw"})
		if err != nil {
			t.Fatal(err)
		}
		if want := "last-modified Sun, 01 Nov 2026 10:00:00 GMT"; res.Revision != want {
			t.Errorf("revision %q, want %q", res.Revision, want)
		}
	})
	t.Run("no revision", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte("a raw disk"))
		}))
		t.Cleanup(srv.Close)
		_, err := check(t, &HTTPSource{URL: srv.URL + "/disk.raw"})
		if transfer.ReasonOf(err) != transfer.ReasonNoRevision || transfer.IsTransient(err) || !strings.Contains(err.Error(), "gives no ETag or Last-Modified") {
			t.Errorf("a source without validators: %v (%s)", err, transfer.ReasonOf(err))
		}
	})
	t.Run("404", func(t *testing.T) {
		_, err := check(t, &HTTPSource{URL: serve(t, &fileServer{path: "x", status: 404})})
		if transfer.ReasonOf(err) != transfer.ReasonSourceNotFound {
			t.Errorf("404: %v", err)
		}
	})
	t.Run("registry", func(t *testing.T) {
		addr := registry(t)
		first := containerDisk(t, convertTo(t, raw, "qcow2"), "amd64", "disk")
		push(t, addr, "containerdisks/check", "latest", first.Manifest, "application/vnd.oci.image.manifest.v1+json", first.Blobs)
		url := "docker://" + addr + "/containerdisks/check:latest"
		res, err := check(t, &RegistrySource{URL: url, Insecure: true})
		if err != nil {
			t.Fatal(err)
		}
		if res.Revision != first.Manifest.Digest {
			t.Fatalf("revision %q, want the manifest's digest %s", res.Revision, first.Manifest.Digest)
		}
		other := filepath.Join(dir, "other.raw")
		writeFile(t, other, bytes.Repeat([]byte("the next release "), 100000))
		second := containerDisk(t, other, "amd64", "disk")
		push(t, addr, "containerdisks/check", "latest", second.Manifest, "application/vnd.oci.image.manifest.v1+json", second.Blobs)
		moved, err := check(t, &RegistrySource{URL: url, Insecure: true})
		if err != nil || moved.Revision != second.Manifest.Digest {
			t.Fatalf("after a push: %q, %v; want %s", moved.Revision, err, second.Manifest.Digest)
		}
		// A scheduled image's revision is imported by digest, whatever the tag says now.
		pinned := "docker://" + addr + "/containerdisks/check@" + first.Manifest.Digest
		target, imported := mustImport(t, t.TempDir(), Options{Source: &RegistrySource{URL: pinned, Insecure: true}})
		sameDisk(t, raw, target)
		if imported.Revision != first.Manifest.Digest {
			t.Errorf("the import's revision %q, want %s", imported.Revision, first.Manifest.Digest)
		}
	})
	t.Run("command", func(t *testing.T) {
		code, res, log := runMain(t, "--url", serve(t, &fileServer{path: raw}), "--check")
		if code != transfer.ExitSucceeded || !res.Succeeded || res.Revision == "" || res.VirtualSize != 0 {
			t.Fatalf("exit %d, result %+v\n%s", code, res, log)
		}
	})
}
