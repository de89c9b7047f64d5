package importer

import (
	"container/list"
	"errors"
	"io"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// blockCache makes many small random reads (a qcow2 reader asks for one cluster at a time)
// into few large ranged requests: it reads the source in aligned blocks, several at once,
// reads ahead of sequential access, and keeps the most recently used blocks, so memory stays
// bounded (maxBlocks × blockSize) whatever the image's size. A full cache evicts the block
// most read (see victim), not the least recently used one: eight workers converting
// neighbouring parts of the disk leave a block half read for a while, and evicting it made
// nginx send a plain 4 GiB qcow2's 2-8 MiB twice in 2 of 4 runs. A block's buffer is reused once
// it has left the cache and no reader holds it, so a long import allocates (and the kernel
// zeroes) only the first maxBlocks buffers.
type blockCache struct {
	src io.ReaderAt
	// prefix is the source's first bytes, already read (the head the format was told by):
	// block 0 is completed from the source, not read again.
	prefix    []byte
	size      int64
	blockSize int64
	maxBlocks int
	readahead int
	// readers is how many times each byte is read: 2 when a hasher reads the file beside
	// the converter. A block has been read whole when its reads add up to readers × its size.
	readers int
	sem     chan struct{}

	mu     sync.Mutex
	blocks map[int64]*block
	lru    *list.List // front: most recently used
	free   [][]byte   // buffers of blocks gone from the cache
	// whole marks the blocks read whole (a set of indexes, one per block read): read-ahead skips them, as no
	// reader is to come back for them. Without it, a worker starting on a block behind
	// the others fetched its next block again after a worker ahead had read it whole and the
	// cache had let it go (nginx sent 1-2 of 814 blocks twice in 5 imports of 30).
	whole map[int64]bool
}

type block struct {
	idx   int64
	ready chan struct{}
	data  []byte
	err   error
	elem  *list.Element
	// refs counts the readers using data, and the fetch while it runs; evicted is set when
	// the block leaves the cache. Both are guarded by blockCache.mu.
	refs    int
	evicted bool
	// read counts the bytes copied out of data (guarded by blockCache.mu).
	read int
}

func newBlockCache(src io.ReaderAt, size, blockSize int64, maxBlocks, parallel, readahead int) *blockCache {
	return &blockCache{
		src: src, size: size, blockSize: blockSize, maxBlocks: maxBlocks, readahead: readahead, readers: 1,
		sem: make(chan struct{}, parallel), blocks: map[int64]*block{}, lru: list.New(),
		free:  hugeBuffers(min(int64(maxBlocks), (size+blockSize-1)/blockSize), blockSize),
		whole: map[int64]bool{}, // a set, not a bitmap: its size is not the source's to choose
	}
}

// hugePage is the size of a transparent huge page on the platforms diskpipe runs on.
const hugePage = 2 << 20

// hugeBuffers cuts n buffers of size bytes from one allocation and asks the kernel to back it
// with transparent huge pages (madvise; nothing changes where THP is off). The cache's
// buffers are written once each as they first fill, and a 4 KiB page fault for every page
// of them took a third of a 4 GiB import's first half-second on a paravirtualized node,
// where a fault is dear; with huge pages it is one fault per 2 MiB. The
// memory stays the Go heap's: a fetch still running after the import ended keeps its buffer.
func hugeBuffers(n, size int64) [][]byte {
	if n <= 0 {
		return nil
	}
	if n*size < 4*hugePage { // a small cache (a chain's layer's): not worth a huge page's slack
		bufs := make([][]byte, n)
		for i := range bufs {
			bufs[i] = make([]byte, size)
		}
		return bufs
	}
	mem := make([]byte, n*size+hugePage)
	skip := (hugePage - int(uintptr(unsafe.Pointer(&mem[0]))%hugePage)) % hugePage //nolint:gosec // an address, for its alignment only
	mem = mem[skip : skip+int(n*size)]
	_ = unix.Madvise(mem, unix.MADV_HUGEPAGE) // advice: a kernel without THP ignores or refuses it
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = mem[int64(i)*size : int64(i+1)*size : int64(i+1)*size]
	}
	return bufs
}

// ReadAt copies from the cached blocks, fetching those it lacks.
func (c *blockCache) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, negativeOffset(off)
	}
	if off >= c.size {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) && off < c.size {
		b := c.get(off / c.blockSize)
		<-b.ready
		if err := b.err; err != nil {
			c.release(b, 0)
			return n, err
		}
		m := copy(p[n:], b.data[off-b.idx*c.blockSize:])
		c.release(b, m)
		n += m
		off += int64(m)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// get returns block idx, held for the caller until release, starting its fetch (and the
// read-ahead after it) when missing.
func (c *blockCache) get(idx int64) *block {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.blocks[idx]
	if ok {
		c.lru.MoveToFront(b.elem)
		b.refs++
		return b
	}
	b = c.fetch(idx)
	b.refs++
	for i := idx + 1; i <= idx+int64(c.readahead) && i*c.blockSize < c.size; i++ {
		if _, ok := c.blocks[i]; !ok && !c.whole[i] {
			c.fetch(i)
		}
	}
	return b
}

// release lets go of a block get returned, from which read bytes were copied; c.mu is not
// held.
func (c *blockCache) release(b *block, read int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b.read += read
	if b.err == nil && b.read >= c.readers*len(b.data) {
		c.whole[b.idx] = true
	}
	c.unref(b)
}

// unref drops one hold on b and keeps its buffer for reuse once b is out of the cache and
// unused; c.mu is held.
func (c *blockCache) unref(b *block) {
	if b.refs--; b.refs == 0 && b.evicted && b.data != nil {
		if len(c.free) < c.maxBlocks {
			c.free = append(c.free, b.data[:cap(b.data)])
		}
		b.data = nil
	}
}

// evict takes b out of the cache; c.mu is held.
func (c *blockCache) evict(b *block) {
	c.lru.Remove(b.elem)
	delete(c.blocks, b.idx)
	b.evicted = true
	b.refs++
	c.unref(b)
}

// victim is the block to evict: the least recently used one that was read whole, or else
// the one with the largest share read (what is left of it is the least likely to be wanted:
// often a qcow2 table never read), the least recently used of those; c.mu is held.
func (c *blockCache) victim() *block {
	var best *block
	bestShare := -1.0
	for e := c.lru.Back(); e != nil; e = e.Prev() {
		b := e.Value.(*block)
		if b.data == nil {
			continue // still being fetched
		}
		share := float64(b.read) / float64(c.readers*len(b.data))
		if share >= 1 {
			return b
		}
		if share > bestShare {
			best, bestShare = b, share
		}
	}
	if best == nil {
		return c.lru.Back().Value.(*block)
	}
	return best
}

// fetch adds block idx and reads it in the background; c.mu is held.
func (c *blockCache) fetch(idx int64) *block {
	b := &block{idx: idx, ready: make(chan struct{}), refs: 1}
	b.elem = c.lru.PushFront(b)
	c.blocks[idx] = b
	for c.lru.Len() > c.maxBlocks {
		c.evict(c.victim()) // readers holding it still finish with its data
	}
	var buf []byte
	if k := len(c.free); k > 0 {
		buf, c.free = c.free[k-1], c.free[:k-1]
	}
	go func() {
		c.sem <- struct{}{}
		defer func() { <-c.sem }()
		off := idx * c.blockSize
		n := int(min(c.blockSize, c.size-off))
		if cap(buf) < n {
			buf = make([]byte, c.blockSize)
		}
		buf = buf[:n]
		k := 0
		if off < int64(len(c.prefix)) {
			k = copy(buf, c.prefix[off:])
		}
		n, err := c.src.ReadAt(buf[k:], off+int64(k))
		if n += k; errors.Is(err, io.EOF) && n == len(buf) {
			err = nil
		}
		c.mu.Lock()
		b.data, b.err = buf[:n], err
		if err != nil && c.blocks[idx] == b { // let a later read try again
			c.evict(b)
		}
		c.unref(b)
		c.mu.Unlock()
		close(b.ready)
	}()
	return b
}
