package importer

import (
	"container/list"
	"errors"
	"io"
	"sync"
)

// blockCache makes many small random reads (a qcow2 reader asks for one cluster at a time)
// into few large ranged requests: it reads the source in aligned blocks, several at once,
// reads ahead of sequential access, and keeps the most recently used blocks, so memory stays
// bounded (maxBlocks × blockSize) whatever the image's size. A block's buffer is reused once
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
	sem       chan struct{}

	mu     sync.Mutex
	blocks map[int64]*block
	lru    *list.List // front: most recently used
	free   [][]byte   // buffers of blocks gone from the cache
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
}

func newBlockCache(src io.ReaderAt, size, blockSize int64, maxBlocks, parallel, readahead int) *blockCache {
	return &blockCache{
		src: src, size: size, blockSize: blockSize, maxBlocks: maxBlocks, readahead: readahead,
		sem: make(chan struct{}, parallel), blocks: map[int64]*block{}, lru: list.New(),
	}
}

// ReadAt copies from the cached blocks, fetching those it lacks.
func (c *blockCache) ReadAt(p []byte, off int64) (int, error) {
	if off >= c.size {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) && off < c.size {
		b := c.get(off / c.blockSize)
		<-b.ready
		if err := b.err; err != nil {
			c.release(b)
			return n, err
		}
		m := copy(p[n:], b.data[off-b.idx*c.blockSize:])
		c.release(b)
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
		if _, ok := c.blocks[i]; !ok {
			c.fetch(i)
		}
	}
	return b
}

// release lets go of a block get returned; c.mu is not held.
func (c *blockCache) release(b *block) {
	c.mu.Lock()
	defer c.mu.Unlock()
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

// fetch adds block idx and reads it in the background; c.mu is held.
func (c *blockCache) fetch(idx int64) *block {
	b := &block{idx: idx, ready: make(chan struct{}), refs: 1}
	b.elem = c.lru.PushFront(b)
	c.blocks[idx] = b
	for c.lru.Len() > c.maxBlocks {
		c.evict(c.lru.Back().Value.(*block)) // readers holding it still finish with its data
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
