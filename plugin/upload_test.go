package plugin

import (
	"crypto/rand"
	"crypto/sha256"
	"os"
	"path/filepath"
	"testing"
)

// TestRewindHash: after bytes were sent past what the proxy stored, the hash goes back to the
// stored offset, whichever it is (on a checkpoint or between), and on from there.
func TestRewindHash(t *testing.T) {
	data := make([]byte, 3*checkpoint+12345)
	_, _ = rand.Read(data)
	path := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, tc := range []struct{ sent, stored int64 }{
		{int64(len(data)), 2 * checkpoint}, {2*checkpoint + 7, checkpoint + 3}, {100, 0}, {0, 2*checkpoint + 1}, {checkpoint, checkpoint},
	} {
		r := newRewindHash()
		for off := int64(0); off < tc.sent; off += 50000 { // the body's reads, of any size
			r.write(data[off:min(off+50000, tc.sent)])
		}
		if err := r.rewind(f, tc.stored); err != nil {
			t.Fatal(err)
		}
		r.write(data[tc.stored:])
		if got, want := r.h.Sum(nil), sha256.Sum256(data); string(got) != string(want[:]) {
			t.Errorf("sent %d, stored %d: the hash differs from the file's", tc.sent, tc.stored)
		}
	}
}
