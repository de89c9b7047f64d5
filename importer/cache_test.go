package importer

import (
	"bytes"
	"sync/atomic"
	"testing"
)

// countingReaderAt counts the bytes read from it.
type countingReaderAt struct {
	*bytes.Reader
	read atomic.Int64
}

func (c *countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.Reader.ReadAt(p, off)
	c.read.Add(int64(n))
	return n, err
}

// TestCacheEvictsReadBlocksFirst fills a two-block cache with a half-read block and a whole-read
// one: the third block evicts the block read whole, though the half-read one was used less
// recently, so the rest of the half-read block comes from the cache and no byte is read twice.
// With readers 2 (a hasher beside the converter) a block read once is still half read.
func TestCacheEvictsReadBlocksFirst(t *testing.T) {
	data := make([]byte, 3*16)
	for i := range data {
		data[i] = byte(i + 1)
	}
	for _, c := range []struct {
		readers   int
		readTwice int64
	}{{1, 0}, {2, 16}} {
		src := &countingReaderAt{Reader: bytes.NewReader(data)}
		cache := newBlockCache(src, int64(len(data)), 16, 2, 1, 0)
		cache.readers = c.readers
		read := func(off, n int) {
			t.Helper()
			p := make([]byte, n)
			if _, err := cache.ReadAt(p, int64(off)); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(p, data[off:off+n]) {
				t.Fatalf("read %d bytes at %d: %v, want %v", n, off, p, data[off:off+n])
			}
		}
		read(0, 8)   // block 0, half
		read(16, 16) // block 1, whole
		read(32, 16) // block 2: one of the others goes
		read(8, 8)   // the rest of block 0
		if got, want := src.read.Load(), int64(len(data))+c.readTwice; got != want {
			t.Errorf("readers %d: the source was read for %d bytes of %d, want %d", c.readers, got, len(data), want)
		}
	}
}
