package importer

import (
	"bytes"
	"sync/atomic"
	"testing"
	"time"
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

// TestCacheEvictsReadBlocksFirst fills a two-block cache with two blocks read in part, the
// less recently used one less: the third block evicts the one read more (whole, or three
// quarters), so the rest of the other comes from the cache and no byte is read twice. With
// readers 2 (a hasher beside the converter) a block read once is only half read, and the
// least recently used of two such blocks goes.
func TestCacheEvictsReadBlocksFirst(t *testing.T) {
	data := make([]byte, 3*16)
	for i := range data {
		data[i] = byte(i + 1)
	}
	for _, c := range []struct {
		name      string
		readers   int
		first     int // bytes of block 0 read before the others, the rest after
		second    int // bytes of block 1 read
		readTwice int64
	}{
		{"half read, whole read", 1, 8, 16, 0},
		{"a quarter read, three quarters read", 1, 4, 12, 0},
		{"a hasher beside the converter", 2, 16, 16, 16},
	} {
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
		read(0, c.first)
		read(16, c.second)
		read(32, 16) // block 2: one of the others goes
		read(c.first%16, 16-c.first%16)
		if got, want := src.read.Load(), int64(len(data))+c.readTwice; got != want {
			t.Errorf("%s: the source was read for %d bytes of %d, want %d", c.name, got, len(data), want)
		}
	}
}

// TestCacheReadaheadSkipsBlocksReadWhole: a worker starting on a block behind the others does
// not make the read-ahead fetch again the next block, which a worker ahead read whole and the
// cache let go.
func TestCacheReadaheadSkipsBlocksReadWhole(t *testing.T) {
	data := make([]byte, 4*16)
	for i := range data {
		data[i] = byte(i + 1)
	}
	src := &countingReaderAt{Reader: bytes.NewReader(data)}
	cache := newBlockCache(src, int64(len(data)), 16, 2, 1, 1)
	for _, off := range []int{16, 48, 0} { // block 1 (and block 2 read ahead), block 3, block 0
		p := make([]byte, 16)
		if _, err := cache.ReadAt(p, int64(off)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(p, data[off:off+16]) {
			t.Fatalf("read 16 bytes at %d: %v, want %v", off, p, data[off:off+16])
		}
	}
	// The defect started block 1's fetch again as block 0's read-ahead.
	cache.mu.Lock()
	_, refetched := cache.blocks[1]
	cache.mu.Unlock()
	if refetched {
		t.Error("the read-ahead fetches block 1 again, which was read whole")
	}
	// Block 2, read ahead, finishes in the background: then the source has been read once.
	deadline := time.Now().Add(10 * time.Second)
	for src.read.Load() < int64(len(data)) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := src.read.Load(); got != int64(len(data)) {
		t.Errorf("the source was read for %d bytes of %d: a block read whole was fetched again", got, len(data))
	}
}
