package plugin

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// server serves data; it cuts the connection once at each of dropAt (byte offsets of the
// object), honours Range unless noRange, and answers 403 "Request has expired" while expired.
type server struct {
	data    []byte
	noRange bool
	dropAt  []int
	expired bool

	mu      sync.Mutex
	dropped map[int]bool
	ranges  []string
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.ranges = append(s.ranges, r.Header.Get("Range"))
	expired := s.expired
	s.mu.Unlock()
	if expired {
		http.Error(w, "<Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>", http.StatusForbidden)
		return
	}
	start := 0
	if rg := r.Header.Get("Range"); rg != "" && !s.noRange {
		_, _ = fmt.Sscanf(rg, "bytes=%d-", &start)
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, len(s.data)-1, len(s.data)))
		w.Header().Set("Content-Length", fmt.Sprint(len(s.data)-start))
		w.WriteHeader(http.StatusPartialContent)
	} else {
		w.Header().Set("Content-Length", fmt.Sprint(len(s.data)))
		w.WriteHeader(http.StatusOK)
	}
	end := len(s.data)
	s.mu.Lock()
	for _, d := range s.dropAt {
		if d > start && d < end && !s.dropped[d] {
			s.dropped[d] = true
			end = d
			break
		}
	}
	s.mu.Unlock()
	_, _ = w.Write(s.data[start:end])
	if end < len(s.data) {
		panic(http.ErrAbortHandler) // cut the connection mid-body
	}
}

func newServer(t *testing.T, s *server) string {
	t.Helper()
	s.dropped = map[int]bool{}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return srv.URL + "/object"
}

func randomData(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFetchResumes checks that a download survives connections dropped at 10, 50 and 90 %:
// with Range it goes on from where it stopped, without it starts over; the file and its hash
// are whole.
func TestFetchResumes(t *testing.T) {
	const size = 5 << 20
	data := randomData(t, size)
	want := sha256.Sum256(data)
	cuts := []int{size / 10, size / 2, size * 9 / 10}
	for _, noRange := range []bool{false, true} {
		t.Run(fmt.Sprintf("noRange=%v", noRange), func(t *testing.T) {
			s := &server{data: data, noRange: noRange, dropAt: cuts}
			url := newServer(t, s)
			part := filepath.Join(t.TempDir(), "disk.qcow2.part")
			h := sha256.New()
			var log bytes.Buffer
			if err := fetch(t.Context(), url, part, h, newBar(&log, "test")); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(part)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) || !bytes.Equal(h.Sum(nil), want[:]) {
				t.Fatalf("the file (%d bytes) or its hash differs from the object", len(got))
			}
			if !strings.Contains(log.String(), "the connection dropped at") {
				t.Errorf("the log does not say the connection dropped:\n%s", log.String())
			}
			if !noRange && !slices.Equal(s.ranges, []string{"", fmt.Sprintf("bytes=%d-", cuts[0]), fmt.Sprintf("bytes=%d-", cuts[1]), fmt.Sprintf("bytes=%d-", cuts[2])}) {
				t.Errorf("requests' ranges %q: want none, then from each drop", s.ranges)
			}
		})
	}
}

// TestFetchResumesAnEarlierRun checks that a .part an interrupted run left is resumed with a
// range request, and its bytes are part of the hash.
func TestFetchResumesAnEarlierRun(t *testing.T) {
	data := randomData(t, 3<<20)
	s := &server{data: data}
	url := newServer(t, s)
	part := filepath.Join(t.TempDir(), "disk.part")
	if err := os.WriteFile(part, data[:2<<20], 0o600); err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	if err := fetch(t.Context(), url, part, h, newBar(io.Discard, "test")); err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256(data)
	if got, _ := os.ReadFile(part); !bytes.Equal(got, data) || !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatal("the resumed file differs from the object")
	}
	if len(s.ranges) != 1 || s.ranges[0] != fmt.Sprintf("bytes=%d-", 2<<20) {
		t.Errorf("requests' ranges %q: want one from 2 MiB", s.ranges)
	}
}

// TestFetchFailures checks the failures that are not retried: an expired URL (for the caller
// to renew) and a missing object.
func TestFetchFailures(t *testing.T) {
	url := newServer(t, &server{data: []byte("x"), expired: true})
	if err := fetch(t.Context(), url, filepath.Join(t.TempDir(), "p"), sha256.New(), newBar(io.Discard, "")); !errors.Is(err, errExpired) {
		t.Errorf("an expired URL: %v", err)
	}
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	start := time.Now()
	err := fetch(t.Context(), srv.URL, filepath.Join(t.TempDir(), "p"), sha256.New(), newBar(io.Discard, ""))
	if err == nil || !strings.Contains(err.Error(), "404") || time.Since(start) > 5*time.Second {
		t.Errorf("a missing object: %v after %s, want a 404 at once", err, time.Since(start))
	}
}

// TestUsage checks the exit codes of mistakes on the command line.
func TestUsage(t *testing.T) {
	for _, args := range [][]string{{}, {"frob"}, {"wait"}, {"download", "x"}, {"wait", "vmimage/x", "-o", "yaml"}, {"--no-such-flag"}} {
		var out, errOut bytes.Buffer
		code := Main(context.Background(), args, genericiooptions.IOStreams{Out: &out, ErrOut: &errOut})
		if code != ExitUsage || !strings.Contains(errOut.String(), "kubectl diskpipe --help") {
			t.Errorf("%q: exit %d, %q; want %d and a pointer to --help", args, code, errOut.String(), ExitUsage)
		}
	}
	var out bytes.Buffer
	if code := Main(context.Background(), []string{"--help"}, genericiooptions.IOStreams{Out: &out, ErrOut: io.Discard}); code != ExitDone ||
		!strings.Contains(out.String(), "--kubeconfig") || !strings.Contains(out.String(), "download EXPORT -o FILE") {
		t.Errorf("--help: exit %d:\n%s", code, out.String())
	}
}
