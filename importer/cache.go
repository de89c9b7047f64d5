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
// bounded (maxBlocks × blockSize) whatever the image's size.
type blockCache struct {
	src       io.ReaderAt
	size      int64
	blockSize int64
	maxBlocks int
	readahead int
	sem       chan struct{}

	mu     sync.Mutex
	blocks map[int64]*block
	lru    *list.List // front: most recently used
}

type block struct {
	idx   int64
	ready chan struct{}
	data  []byte
	err   error
	elem  *list.Element
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
		if b.err != nil {
			return n, b.err
		}
		m := copy(p[n:], b.data[off-b.idx*c.blockSize:])
		n += m
		off += int64(m)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// get returns block idx, starting its fetch (and the read-ahead after it) when missing.
func (c *blockCache) get(idx int64) *block {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.blocks[idx]
	if ok {
		c.lru.MoveToFront(b.elem)
		return b
	}
	b = c.fetch(idx)
	for i := idx + 1; i <= idx+int64(c.readahead) && i*c.blockSize < c.size; i++ {
		if _, ok := c.blocks[i]; !ok {
			c.fetch(i)
		}
	}
	return b
}

// fetch adds block idx and reads it in the background; c.mu is held.
func (c *blockCache) fetch(idx int64) *block {
	b := &block{idx: idx, ready: make(chan struct{})}
	b.elem = c.lru.PushFront(b)
	c.blocks[idx] = b
	for c.lru.Len() > c.maxBlocks {
		old := c.lru.Remove(c.lru.Back()).(*block)
		delete(c.blocks, old.idx) // readers holding it still finish with its data
	}
	go func() {
		c.sem <- struct{}{}
		defer func() { <-c.sem }()
		off := idx * c.blockSize
		buf := make([]byte, min(c.blockSize, c.size-off))
		n, err := c.src.ReadAt(buf, off)
		if errors.Is(err, io.EOF) && n == len(buf) {
			err = nil
		}
		b.data, b.err = buf[:n], err
		if err != nil {
			c.mu.Lock()
			if c.blocks[idx] == b { // let a later read try again
				c.lru.Remove(b.elem)
				delete(c.blocks, idx)
			}
			c.mu.Unlock()
		}
		close(b.ready)
	}()
	return b
}
