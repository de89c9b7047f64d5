package importer

import (
	"bytes"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/klauspost/compress/flate"
)

// compressible makes n bytes that deflate well but not trivially: runs of text-like bytes.
func compressible(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := 0; i < n; {
		run := min(n-i, 1+r.IntN(64))
		c := byte('a' + r.IntN(8))
		for j := range run {
			b[i+j] = c + byte(j%3)
		}
		i += run
	}
	return b
}

func deflate(t *testing.T, p []byte, level int) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := flate.NewWriter(&buf, level)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(p); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestInflateCluster checks that compressed clusters decode to their bytes through whichever
// decoder takes them, that the fast decoder (libdeflate in a cgo build) takes every
// well-formed cluster, and that what it refuses — cut, corrupt or oversized streams — gets the
// streaming decoder's answer instead of a wrong one.
func TestInflateCluster(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, size := range []int{512, 64 << 10, maxClusterSize} {
		for _, level := range []int{flate.BestSpeed, flate.DefaultCompression, flate.BestCompression, flate.HuffmanOnly} {
			want := compressible(r, size)
			z := deflate(t, want, level)
			// qcow2 rounds a compressed cluster up to whole sectors: bytes of the next one follow.
			in := append(append([]byte{}, z...), compressible(r, 511)...)
			if n, ok := inflateInto(in, make([]byte, maxClusterSize)); inflater != "go" && (!ok || n != size) {
				t.Errorf("size %d level %d: the %s decoder refused a well-formed cluster (ok %v, %d bytes)", size, level, inflater, ok, n)
			}
			got := readAllCluster(t, in)
			if !bytes.Equal(got, want) {
				t.Errorf("size %d level %d: decoded %d bytes that differ from the %d compressed", size, level, len(got), len(want))
			}
		}
	}

	want := compressible(r, 64<<10)
	z := deflate(t, want, flate.DefaultCompression)
	if _, ok := inflateInto(z[:len(z)/2], make([]byte, maxClusterSize)); ok {
		t.Error("a stream cut in half decoded whole")
	}
	cut, _ := io.ReadAll(mustInflate(t, z[:len(z)/2]))
	if len(cut) == 0 || !bytes.Equal(cut, want[:len(cut)]) {
		t.Errorf("a cut stream: the fallback gave %d bytes that are not the cluster's start", len(cut))
	}
	if _, ok := inflateInto(z, make([]byte, 1<<10)); ok {
		t.Error("a stream longer than the output buffer decoded whole")
	}
	garbage := compressible(r, 4096)
	if _, ok := inflateInto(garbage, make([]byte, maxClusterSize)); ok {
		t.Error("garbage decoded")
	}
	if _, err := io.ReadAll(mustInflate(t, garbage)); err == nil {
		t.Error("garbage decoded without an error")
	}
}

func mustInflate(t *testing.T, in []byte) io.Reader {
	t.Helper()
	rc, err := inflateCluster(io.NewSectionReader(bytes.NewReader(in), 0, int64(len(in))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	return rc
}

func readAllCluster(t *testing.T, in []byte) []byte {
	t.Helper()
	got, err := io.ReadAll(mustInflate(t, in))
	if err != nil {
		t.Fatal(err)
	}
	return got
}
