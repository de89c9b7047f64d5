package importer

import (
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// TestCopyEngine: a raw copy fetches its chunks by ranged requests in parallel, not one
// stream, reads every byte once, reports the digest of a disk read whole, and comes out
// identical through dropped connections; a chunk refused mid-copy fails the copy with the
// source's reason while the workers behind it wait for their turn to hash, and leaves nothing.
func TestCopyEngine(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	want := sha256File(t, raw)

	t.Run("parallel", func(t *testing.T) {
		s := &fileServer{path: raw, slow: time.Millisecond}
		target, res := mustImport(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, s)}, Format: FormatRaw})
		sameDisk(t, raw, target)
		if got := s.mostInFlight.Load(); got < 4 {
			t.Errorf("at most %d requests at once, want the engine's 8 in flight (>= 4)", got)
		}
		if res.BytesRead != fixtureSize {
			t.Errorf("%d bytes read for a disk of %d: a chunk read twice, or one skipped", res.BytesRead, fixtureSize)
		}
		if res.Digest != want {
			t.Errorf("digest %q of a disk read whole, want %s", res.Digest, want)
		}
		if !(0 < res.FirstByteSeconds && res.FirstByteSeconds < res.LastByteSeconds && res.LastByteSeconds <= res.FlushedSeconds) {
			t.Errorf("timeline: first byte %.3f s, last byte %.3f s, flushed %.3f s", res.FirstByteSeconds, res.LastByteSeconds, res.FlushedSeconds)
		}
	})

	t.Run("dropped connections", func(t *testing.T) {
		s := &fileServer{path: raw, dropAt: []float64{0.1, 0.35, 0.5, 0.9}}
		target, res := mustImport(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, s)}, Format: FormatRaw, Retry: fastRetry, Checksum: want})
		sameDisk(t, raw, target)
		if res.Digest != want {
			t.Errorf("digest %q, want %s", res.Digest, want)
		}
	})

	t.Run("a chunk refused", func(t *testing.T) {
		s := &fileServer{path: raw, forbidAt: 21 << 20, slow: time.Millisecond}
		done := make(chan struct{})
		var target string
		var err error
		go func() {
			defer close(done)
			target, _, err = importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, s)}, Format: FormatRaw, Retry: fastRetry})
		}()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Fatal("the copy did not end after a chunk was refused")
		}
		wantFailure(t, target, err, transfer.ReasonSourceForbidden, false, "403")
	})
}

// TestCopyOfAChangingSource: a source replaced while it is copied (its Last-Modified moves) is
// not put together from two versions: every ranged request carries If-Range, the server
// answers the changed object whole, and the copy fails saying so, leaving nothing.
func TestCopyOfAChangingSource(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 10 { // mid-copy, the file is replaced
			later := time.Now().Add(time.Hour)
			if err := os.Chtimes(raw, later, later); err != nil {
				t.Error(err)
			}
		}
		http.ServeFile(w, r, raw)
	}))
	defer srv.Close()
	target, _, err := importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: srv.URL + "/disk.raw"}, Format: FormatRaw, Retry: fastRetry})
	wantFailure(t, target, err, transfer.ReasonSourceUnavailable, true, "it changed since the copy began (If-Range")
	if !strings.Contains(err.Error(), "200 OK") {
		t.Errorf("error %v", err)
	}
}
