package importer

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// fixtureSize is the virtual size of the test disk.
const fixtureSize = 64 << 20

// makeRaw writes a sparse raw disk with known content: random and text regions, some not
// block-aligned, between holes.
func makeRaw(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "disk.raw")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(fixtureSize); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	text := bytes.Repeat([]byte("diskpipe imports golden images without scratch space. "), 40000)
	for _, w := range []struct {
		off  int64
		data []byte
	}{
		{0, random(1 << 20)},
		{5 << 20, text},
		{17<<20 + 123, random(3<<20 + 7)},
		{40 << 20, random(64 << 10)},
		{fixtureSize - 4096, random(4096)},
	} {
		if _, err := f.WriteAt(w.data, w.off); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func runTool(t *testing.T, name string, args ...string) {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// convertTo makes an image of raw with qemu-img convert and returns its path.
func convertTo(t *testing.T, raw, format string, opts ...string) string {
	t.Helper()
	out := filepath.Join(filepath.Dir(raw), fmt.Sprintf("disk-%s-%s.img", format, strings.Join(opts, "")))
	out = strings.NewReplacer(" ", "", "=", "", ",", "").Replace(out)
	args := append([]string{"convert", "-f", "raw", "-O", format}, opts...)
	runTool(t, "qemu-img", append(args, raw, out)...)
	return out
}

// compress wraps a file with gzip, xz or zstd (the real tools) and returns the new path.
func compress(t *testing.T, path, tool string) string {
	t.Helper()
	ext := map[string]string{"gzip": ".gz", "xz": ".xz", "zstd": ".zst"}[tool]
	runTool(t, tool, "-k", "-f", path)
	return path + ext
}

// sameDisk checks with qemu-img compare that two raw disks hold the same bytes.
func sameDisk(t *testing.T, want, got string) {
	t.Helper()
	out, err := exec.Command("qemu-img", "compare", "-f", "raw", "-F", "raw", want, got).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-img compare %s %s: %v\n%s", want, got, err, out)
	}
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// fileServer serves one file the ways the tests need.
type fileServer struct {
	path     string
	noRange  bool          // ignore Range and answer 200 with the whole file
	dropAt   []float64     // fractions of the file at which to cut the connection, once each
	fail503  int           // answer 503 to this many requests first
	status   int           // answer every request with this status
	slow     time.Duration // pause after every 64 KiB
	stallFor time.Duration // pause this long once, at half the file
	forbidAt int64         // answer 403 to a range starting here (0: none)

	mu       sync.Mutex
	dropped  map[float64]bool
	stalled  bool
	requests atomic.Int64
	sent     atomic.Int64
	// inFlight and mostInFlight count the answers being sent at once.
	inFlight, mostInFlight atomic.Int64
}

func (s *fileServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	n := s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	for m := s.mostInFlight.Load(); n > m && !s.mostInFlight.CompareAndSwap(m, n); m = s.mostInFlight.Load() {
	}
	if s.forbidAt > 0 && strings.HasPrefix(r.Header.Get("Range"), fmt.Sprintf("bytes=%d-", s.forbidAt)) {
		http.Error(w, "not this range", http.StatusForbidden)
		return
	}
	if s.status != 0 {
		http.Error(w, http.StatusText(s.status), s.status)
		return
	}
	s.mu.Lock()
	if s.fail503 > 0 {
		s.fail503--
		s.mu.Unlock()
		http.Error(w, "try later", http.StatusServiceUnavailable)
		return
	}
	s.mu.Unlock()
	f, err := os.Open(s.path)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer f.Close()
	fi, _ := f.Stat()
	size := fi.Size()
	// As nginx does: resumed imports compare these to know the file did not change.
	w.Header().Set("Last-Modified", fi.ModTime().UTC().Format(http.TimeFormat))
	w.Header().Set("ETag", fmt.Sprintf(`"%x-%x"`, fi.ModTime().UnixNano(), size))
	start, end := int64(0), size // [start, end)
	if rng := r.Header.Get("Range"); rng != "" && !s.noRange {
		a, b, _ := strings.Cut(strings.TrimPrefix(rng, "bytes="), "-")
		start, _ = strconv.ParseInt(a, 10, 64)
		if b != "" {
			e, _ := strconv.ParseInt(b, 10, 64)
			end = min(e+1, size)
		}
		if start >= size {
			w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", size))
			w.WriteHeader(http.StatusRequestedRangeNotSatisfiable)
			return
		}
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, end-1, size))
		w.Header().Set("Content-Length", strconv.FormatInt(end-start, 10))
		w.WriteHeader(http.StatusPartialContent)
	} else {
		if !s.noRange {
			w.Header().Set("Accept-Ranges", "bytes")
		}
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		w.WriteHeader(http.StatusOK)
	}
	buf := make([]byte, 64<<10)
	for off := start; off < end; {
		n := min(int64(len(buf)), end-off)
		if cut, ok := s.cutPoint(off, off+n, size); ok {
			if cut > off {
				_, _ = f.ReadAt(buf[:cut-off], off)
				_, _ = w.Write(buf[:cut-off])
			}
			w.(http.Flusher).Flush()
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		if s.stall(off, off+n, size) {
			w.(http.Flusher).Flush()
			time.Sleep(s.stallFor)
		}
		if _, err := f.ReadAt(buf[:n], off); err != nil && err != io.EOF {
			return
		}
		if _, err := w.Write(buf[:n]); err != nil {
			return
		}
		s.sent.Add(n)
		off += n
		if s.slow > 0 {
			time.Sleep(s.slow)
		}
	}
}

// cutPoint returns the offset in [from, to) where a pending drop falls.
func (s *fileServer) cutPoint(from, to, size int64) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, frac := range s.dropAt {
		p := int64(frac * float64(size))
		if p >= from && p < to && !s.dropped[frac] {
			if s.dropped == nil {
				s.dropped = map[float64]bool{}
			}
			s.dropped[frac] = true
			return p, true
		}
	}
	return 0, false
}

func (s *fileServer) stall(from, to, size int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stallFor == 0 || s.stalled || size/2 < from || size/2 >= to {
		return false
	}
	s.stalled = true
	return true
}

// serve starts s on 127.0.0.1 and returns the file's URL.
func serve(t *testing.T, s *fileServer) string {
	t.Helper()
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return srv.URL + "/" + filepath.Base(s.path)
}

// fastRetry keeps the tests' retries quick.
var fastRetry = transfer.RetryPolicy{Attempts: 4, Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}

func qemuImgOutput(args ...string) ([]byte, error) {
	return exec.Command("qemu-img", args...).CombinedOutput()
}
