package importer

import (
	"errors"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// # The copy engine
//
// Every copy of a raw disk between volumes runs here: a disk made by host-assisted copy, a
// replica sent to another node, a clone across namespaces, a snapshot copied out, and a raw
// image or ISO imported from a server with Range. The source's data is cut into chunks of
// copyChunk bytes, aligned, and Parallel workers each fetch a chunk by one ranged request
// (the fetcher's retries and stall timeout), write it (zero blocks left as holes) and take the
// next: the network, the source's disk and the target's disk all work at once, where one
// stream read, wrote and read again. Holes the source lists (a disk.img, a clone source's
// /extents) are skipped unread.
//
// The source is hashed only when its digest means something: when a checksum is to be
// verified, or when every byte of it is read from the first (a source that lists no holes),
// whose digest is then reported. The hash is of the bytes in order, so a worker that has
// written its chunk waits for its turn to hash it; the workers behind keep reading.
//
// A checkpoint (checkpoint.go) records the prefix of the disk every chunk of which is written
// (and hashed), once it has grown by checkpointAfter bytes: another pod goes on from there,
// asking the source for the rest only. Memory is Parallel chunks, whatever the disk.

// copyChunk is what one ranged request of the copy engine asks for: eight in flight are
// 8 MiB of buffers.
const copyChunk = 1 << 20

// rawCopy is one run of the copy engine.
type rawCopy struct {
	o    *Options
	f    *fetcher
	t    *Target
	cs   *transfer.Checksum
	head []byte // the source's first bytes, read already to tell the format
	size int64
	// extents is the source's data; nil: all of it.
	extents []Extent
	// hash: the chunks are hashed in order, from hashed.
	hash bool
	cp   *checkpoint

	mu   sync.Mutex
	next int64 // where the next chunk starts
	// mark: [0, mark) is written (and hashed); done holds the runs finished beyond it.
	mark       int64
	done       map[int64]int64
	checkpoint int64 // the mark at which the next checkpoint is taken
	read       int64 // bytes fetched by this run, which pace the checkpoints
	start      time.Time
	err        error

	hashing sync.Mutex
	turn    sync.Cond // hashed moved, or the copy failed
	hashed  int64

	saving sync.Mutex // a checkpoint being recorded
}

// importRaw copies a raw image (or ISO) from a source with random access through the copy
// engine. head, the first bytes already read to tell the format, is not asked for again.
func importRaw(o *Options, f *fetcher, head []byte, cs *transfer.Checksum, t *Target, res *transfer.Result) error {
	size := f.obj.Size()
	res.Format, res.VirtualSize = string(FormatRaw), size
	o.Progress.SetTotal(size)
	cp, err := startOrResume(o, f.origin(o), FormatRaw, size, t, cs)
	if err != nil {
		return err
	}
	// A checksum asks for every byte; otherwise a source that says where its data is has its
	// holes skipped: they read as zeros, which the target does not write anyway.
	var extents []Extent
	if so, ok := f.obj.(sparseObject); ok && cs.Want == "" {
		if extents, err = so.DataExtents(f.ctx); err != nil {
			return err
		}
	}
	c := &rawCopy{o: o, f: f, t: t, cs: cs, head: head, size: size, extents: extents, cp: cp,
		hash: cs.Want != "" || extents == nil && cp.Done == 0, done: map[int64]int64{}, start: time.Now()}
	c.next, c.mark = cp.Done, cp.Done
	if cs.Want != "" && cp.Hashed < cp.Done { // a checkpoint whose hash stops short: both go on from there
		c.next, c.mark = cp.Hashed, cp.Hashed
	}
	c.hashed = c.next
	c.turn.L = &c.hashing
	c.checkpoint = c.mark + checkpointAfter(0, 0)
	o.Progress.Add(c.mark - cp.Done) // startOrResume counted cp.Done
	if err := c.run(); err != nil {
		return err
	}
	if c.hash {
		res.Digest = cs.Digest()
	}
	if err := cs.Verify(); err != nil {
		return err
	}
	return t.Finish(size)
}

// run copies with Parallel workers until the disk is done or one fails.
func (c *rawCopy) run() error {
	var wg sync.WaitGroup
	for range max(c.o.Parallel, 1) {
		wg.Go(c.work)
	}
	wg.Wait()
	return c.err
}

// work copies chunks until none is left or the copy failed.
func (c *rawCopy) work() {
	buf := make([]byte, copyChunk)
	for {
		off, n, ok := c.take()
		if !ok {
			return
		}
		p := buf[:n]
		if err := c.copyChunk(p, off); err != nil {
			c.fail(err)
			return
		}
	}
}

// copyChunk fetches, writes and (in its turn) hashes the chunk p at off, and counts it done.
func (c *rawCopy) copyChunk(p []byte, off int64) error {
	k := 0
	if off < int64(len(c.head)) {
		k = copy(p, c.head[off:])
	}
	if k < len(p) {
		n, err := c.f.ReadAt(p[k:], off+int64(k))
		if err != nil && (!errors.Is(err, io.EOF) || k+n < len(p)) {
			if errors.Is(err, io.EOF) {
				return transfer.Transient(transfer.ReasonSourceUnavailable, "%s ended at byte %d of %d", c.o.Source, off+int64(k+n), c.size)
			}
			return err
		}
	}
	if _, err := c.t.WriteAt(p, off); err != nil {
		return err
	}
	c.o.Progress.Add(int64(len(p)))
	if !c.hash {
		return c.finished(off, off+int64(len(p)), int64(len(p)))
	}
	c.hashing.Lock()
	defer c.hashing.Unlock()
	for c.hashed != off {
		if c.failed() {
			return nil
		}
		c.turn.Wait()
	}
	c.cs.Hash.Write(p)
	c.hashed += int64(len(p))
	c.turn.Broadcast()
	// Still in the turn: the hash's state is that of the mark a checkpoint would record.
	return c.finished(off, c.hashed, int64(len(p)))
}

// take hands out the next chunk of data, counting the holes before it done; false when none
// is left or the copy failed.
func (c *rawCopy) take() (off, n int64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil || c.next >= c.size {
		return 0, 0, false
	}
	end := c.size // of the data run from c.next
	if c.extents != nil {
		i := sort.Search(len(c.extents), func(i int) bool { return c.extents[i].Off+c.extents[i].Len > c.next })
		data := c.size
		if i < len(c.extents) {
			data, end = max(c.extents[i].Off, c.next), c.extents[i].Off+c.extents[i].Len
		}
		if data > c.next { // a hole
			c.o.Progress.Add(data - c.next)
			c.finishedLocked(c.next, data)
			if c.next = data; data >= c.size {
				return 0, 0, false
			}
		}
	}
	off = c.next
	n = min(copyChunk-off%copyChunk, end-off)
	c.next += n
	return off, n, true
}

// finished counts [off, end) done, after fetched bytes were read for it, and records a
// checkpoint when the done prefix has grown enough: its record is taken under the lock, and
// written (which waits for the last one's flush) outside it, so the other workers go on.
func (c *rawCopy) finished(off, end, fetched int64) error {
	c.mu.Lock()
	c.read += fetched
	c.finishedLocked(off, end)
	if c.cp.Identity == "" || c.mark < c.checkpoint || c.mark >= c.size {
		c.mu.Unlock()
		return nil
	}
	cp := *c.cp
	cp.Done = c.mark
	if c.cs.Want != "" {
		state, err := c.cs.State()
		if err != nil {
			c.mu.Unlock()
			return err
		}
		cp.Hash, cp.Hashed = state, c.mark
	}
	c.checkpoint = c.mark + checkpointAfter(c.read, time.Since(c.start))
	c.mu.Unlock()
	// One record at a time; one taken later may be written first, and the earlier one after it
	// is still true (its bytes were written before either).
	c.saving.Lock()
	defer c.saving.Unlock()
	return c.t.saveCheckpoint(cp)
}

// finishedLocked counts [off, end) done and moves the mark over what is now done from it;
// c.mu is held.
func (c *rawCopy) finishedLocked(off, end int64) {
	c.done[off] = end
	for {
		e, ok := c.done[c.mark]
		if !ok {
			return
		}
		delete(c.done, c.mark)
		c.mark = e
	}
}

// fail ends the copy with err, the first failure; the other workers stop at their next chunk.
func (c *rawCopy) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.hashing.Lock()
	c.turn.Broadcast()
	c.hashing.Unlock()
}

func (c *rawCopy) failed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err != nil
}
