package importer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// importTo imports from src into dir/disk.img and returns the target path.
func importTo(t *testing.T, dir string, o Options) (string, *transfer.Result, error) {
	t.Helper()
	if o.Target == "" {
		o.Target = filepath.Join(dir, "disk.img")
	}
	if o.Retry.Attempts == 0 {
		o.Retry = fastRetry
	}
	res, err := Import(t.Context(), o)
	return o.Target, res, err
}

func mustImport(t *testing.T, dir string, o Options) (string, *transfer.Result) {
	t.Helper()
	target, res, err := importTo(t, dir, o)
	if err != nil {
		t.Fatalf("import: %v (reason %s)", err, transfer.ReasonOf(err))
	}
	if !res.Succeeded {
		t.Fatalf("import returned no error but did not succeed: %+v", res)
	}
	return target, res
}

// wantFailure checks the error's reason and that the target was left empty.
func wantFailure(t *testing.T, target string, err error, reason transfer.Reason, transient bool, msg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("import succeeded, want %s", reason)
	}
	if got := transfer.ReasonOf(err); got != reason {
		t.Errorf("reason = %s, want %s (%v)", got, reason, err)
	}
	if got := transfer.IsTransient(err); got != transient {
		t.Errorf("transient = %v, want %v (%v)", got, transient, err)
	}
	if !strings.Contains(err.Error(), msg) {
		t.Errorf("error %q lacks %q", err, msg)
	}
	if _, serr := os.Stat(target); !errors.Is(serr, os.ErrNotExist) {
		t.Errorf("the target %s was not removed after the failure (stat: %v)", target, serr)
	}
}

// allocated is the bytes a file holds on disk, holes excluded.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestFormats imports each format qemu-img makes, served with Range support, and compares
// the result with the original.
func TestFormats(t *testing.T) {
	dir := t.TempDir()
	raw := makeRaw(t, dir)
	cases := []struct {
		name, format, compression string
		path                      func() string
	}{
		{"raw", "raw", "", func() string { return raw }},
		{"qcow2 v3", "qcow2", "", func() string { return convertTo(t, raw, "qcow2") }},
		{"qcow2 v2", "qcow2", "", func() string { return convertTo(t, raw, "qcow2", "-o", "compat=0.10") }},
		{"qcow2 zlib clusters", "qcow2", "", func() string { return convertTo(t, raw, "qcow2", "-c") }},
		{"qcow2 zstd clusters", "qcow2", "", func() string {
			return convertTo(t, raw, "qcow2", "-c", "-o", "compression_type=zstd")
		}},
		{"qcow2 4k clusters", "qcow2", "", func() string { return convertTo(t, raw, "qcow2", "-o", "cluster_size=4096") }},
		// Larger than the small buffers clusters are first decoded into (decompress.go).
		{"qcow2 zlib 2M clusters", "qcow2", "", func() string { return convertTo(t, raw, "qcow2", "-c", "-o", "cluster_size=2M") }},
		{"vmdk monolithicSparse", "vmdk", "", func() string { return convertTo(t, raw, "vmdk") }},
		{"vmdk streamOptimized", "vmdk", "", func() string { return convertTo(t, raw, "vmdk", "-o", "subformat=streamOptimized") }},
		{"vpc dynamic", "vpc", "", func() string { return convertTo(t, raw, "vpc") }},
		{"vpc fixed", "vpc", "", func() string { return convertTo(t, raw, "vpc", "-o", "subformat=fixed") }},
		{"vdi dynamic", "vdi", "", func() string { return convertTo(t, raw, "vdi") }},
		{"vdi static", "vdi", "", func() string { return convertTo(t, raw, "vdi", "-o", "static=on") }},
		{"vhdx dynamic", "vhdx", "", func() string { return convertTo(t, raw, "vhdx") }},
		{"vhdx fixed", "vhdx", "", func() string { return convertTo(t, raw, "vhdx", "-o", "subformat=fixed") }},
		{"vhdx 1 MiB blocks", "vhdx", "", func() string { return convertTo(t, raw, "vhdx", "-o", "block_size=1048576") }},
		{"raw.gz", "raw", "gzip", func() string { return compress(t, raw, "gzip") }},
		{"raw.xz", "raw", "xz", func() string { return compress(t, raw, "xz") }},
		{"raw.zst", "raw", "zstd", func() string { return compress(t, raw, "zstd") }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := c.path()
			fs := &fileServer{path: src}
			url := serve(t, fs)
			target, res := mustImport(t, t.TempDir(), Options{Source: &HTTPSource{URL: url}})
			sameDisk(t, raw, target)
			// Bytes asked for twice: the one byte of the request that learns the size; the
			// 512-byte footer that tells a fixed VHD from raw; a compressed stream's head and
			// the trailer (gzip's size, xz's index) that tells its size. The head a
			// random-access format was told by is reused.
			again := int64(1)
			switch {
			case c.compression != "":
				again += sniffLen + 64
			case c.name == "raw" || c.name == "vpc fixed":
				again += 512
			}
			if size := fileSizeOf(t, src); fs.sent.Load() > size+again {
				t.Errorf("the server sent %d bytes of a %d-byte file; at most %d may be read twice", fs.sent.Load(), size, again)
			}
			if res.Format != c.format || res.Compression != c.compression {
				t.Errorf("format %q compression %q, want %q %q", res.Format, res.Compression, c.format, c.compression)
			}
			// vpc sizes follow the CHS geometry, a little larger (qemu-img compare checked
			// that the extra is zeros).
			if res.VirtualSize < fixtureSize || res.VirtualSize > fixtureSize+1<<20 {
				t.Errorf("virtual size %d, want %d", res.VirtualSize, fixtureSize)
			}
			if a := allocated(t, target); a > allocated(t, raw)+1<<20 {
				t.Errorf("the target holds %d bytes on disk, the sparse original %d: zeros were written", a, allocated(t, raw))
			}
			if res.BytesWritten > allocated(t, raw)+1<<20 {
				t.Errorf("wrote %d bytes, the original holds %d", res.BytesWritten, allocated(t, raw))
			}
		})
	}
}

// TestNoRangeServer streams raw, compressed raw, and qcow2 images (plain, with compressed
// clusters, inside xz and gzip) from a server that ignores Range (vmdk and the formats it
// refuses: stream_test.go).
func TestNoRangeServer(t *testing.T) {
	dir := t.TempDir()
	raw := makeRaw(t, dir)
	qcow := convertTo(t, raw, "qcow2")
	for _, c := range []struct {
		name, path string
		format     string
	}{
		{"raw", raw, "raw"},
		{"raw.xz", compress(t, raw, "xz"), "raw"},
		{"qcow2", qcow, "qcow2"},
		{"qcow2 v2", convertTo(t, raw, "qcow2", "-o", "compat=0.10"), "qcow2"},
		{"qcow2 zlib clusters", convertTo(t, raw, "qcow2", "-c"), "qcow2"},
		{"qcow2 zstd clusters", convertTo(t, raw, "qcow2", "-c", "-o", "compression_type=zstd"), "qcow2"},
		{"qcow2 4k clusters", convertTo(t, raw, "qcow2", "-o", "cluster_size=4096"), "qcow2"},
		{"qcow2 zlib 2M clusters", convertTo(t, raw, "qcow2", "-c", "-o", "cluster_size=2M"), "qcow2"},
		{"qcow2.xz", compress(t, qcow, "xz"), "qcow2"},
		{"qcow2.gz", compress(t, qcow, "gzip"), "qcow2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &fileServer{path: c.path, noRange: true}
			want := sha256File(t, c.path)
			target, res := mustImport(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, s)}, Checksum: want})
			sameDisk(t, raw, target)
			if res.Format != c.format || res.VirtualSize != fixtureSize || res.Digest != want {
				t.Errorf("result %+v", res)
			}
		})
	}
	t.Run("truncated qcow2", func(t *testing.T) {
		b, _ := os.ReadFile(qcow)
		cut := filepath.Join(t.TempDir(), "cut.qcow2")
		writeFile(t, cut, b[:len(b)/2])
		s := &fileServer{path: cut, noRange: true}
		target, _, err := importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, s)}})
		wantFailure(t, target, err, transfer.ReasonTruncatedImage, false, "missing from the stream")
	})
}

// TestDroppedConnections cuts the connection at 10, 50 and 90 % of the file; the import
// resumes and the result is identical.
func TestDroppedConnections(t *testing.T) {
	dir := t.TempDir()
	raw := makeRaw(t, dir)
	qcow := convertTo(t, raw, "qcow2")
	for _, c := range []struct {
		name    string
		path    string
		noRange bool
	}{
		{"qcow2 with Range", qcow, false},
		{"raw with Range", raw, false},
		{"raw without Range", raw, true},
	} {
		for _, frac := range []float64{0.1, 0.5, 0.9} {
			t.Run(fmt.Sprintf("%s at %.0f%%", c.name, frac*100), func(t *testing.T) {
				s := &fileServer{path: c.path, noRange: c.noRange, dropAt: []float64{frac}}
				target, res := mustImport(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, s)}})
				sameDisk(t, raw, target)
				if len(s.dropped) != 1 {
					t.Fatalf("the server never cut the connection at %v", frac)
				}
				if res.BytesRead <= 0 {
					t.Errorf("bytes read = %d", res.BytesRead)
				}
			})
		}
	}
}

// TestServiceUnavailableTwice: 503, 503, then the file.
func TestServiceUnavailableTwice(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	s := &fileServer{path: convertTo(t, raw, "qcow2"), fail503: 2}
	target, _ := mustImport(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, s)}})
	sameDisk(t, raw, target)
	if n := s.requests.Load(); n < 3 {
		t.Errorf("%d requests, want the two 503s and more", n)
	}
}

// TestServiceUnavailableForever gives up after the retry policy's attempts, as transient.
func TestServiceUnavailableForever(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	s := &fileServer{path: raw, fail503: 1000}
	target, _, err := importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, s)}})
	wantFailure(t, target, err, transfer.ReasonSourceUnavailable, true, "503")
	if n := s.requests.Load(); n != int64(fastRetry.Attempts) {
		t.Errorf("%d requests, want %d attempts", n, fastRetry.Attempts)
	}
}

// TestSlowServer imports from a server that trickles, and from one that stalls once for
// longer than the stall timeout.
func TestSlowServer(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	qcow := convertTo(t, raw, "qcow2")
	t.Run("trickle", func(t *testing.T) {
		s := &fileServer{path: qcow, slow: 200 * time.Microsecond} // 0.2 ms per 64 KiB
		target, _ := mustImport(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, s)}})
		sameDisk(t, raw, target)
	})
	t.Run("stall", func(t *testing.T) {
		s := &fileServer{path: raw, stallFor: time.Second}
		target, _ := mustImport(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, s)}, StallTimeout: 200 * time.Millisecond})
		sameDisk(t, raw, target)
		if n := s.requests.Load(); n < 3 {
			t.Errorf("%d requests: the stalled response was not abandoned and resumed", n)
		}
	})
}

// TestNotFound fails at once, permanently.
func TestNotFound(t *testing.T) {
	s := &fileServer{path: "missing", status: 404}
	target, _, err := importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, s)}})
	wantFailure(t, target, err, transfer.ReasonSourceNotFound, false, "404")
	if n := s.requests.Load(); n != 1 {
		t.Errorf("%d requests: a 404 must not be retried", n)
	}
	s = &fileServer{path: "secret", status: 403}
	target, _, err = importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, s)}})
	wantFailure(t, target, err, transfer.ReasonSourceForbidden, false, "403")
}
