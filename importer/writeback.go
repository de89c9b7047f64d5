package importer

import (
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// # Writing the disk out behind the import
//
// Every range written into the disk is sent to the disk at once (sync_file_range's
// SYNC_FILE_RANGE_WRITE: the disk works while the network does, and the final fsync finds
// little left), and a behind goroutine waits, oldest range first, for each to be on the disk
// and then drops its pages from the page cache. What the import holds in the page cache, dirty
// or clean, stays under writebackWindow, where it would otherwise grow to the whole disk:
//   - the pod's memory limit counts it, and the kernel throttles a writer with too many dirty
//     pages as it pleases;
//   - the copies into the page cache reuse the few pages just dropped. On a VM that hands
//     free memory back to its host (virtio_balloon's free page reporting, as on the machine
//     the benchmarks run on), a page never touched before costs the host a fault, and the
//     kernel's copy into fresh pages was most of an import's CPU.
//
// The behind goroutine waits on its own file description, so the write errors it is told
// of stay for the target's fsync (each description keeps its own place in the file's error
// sequence): Finish and every checkpoint still see them.

// writebackWindow is how much written data may wait for the disk; a writer that gets this
// far ahead of the disk waits for it.
const writebackWindow = 64 << 20

type writeback struct {
	fd      *os.File // the behind goroutine's own description of the disk
	mu      sync.Mutex
	changed sync.Cond
	ranges  [][2]int64 // written [offset, end), oldest first; contiguous ones merged
	queued  int64      // bytes in ranges and the range being waited on
	closed  bool
	done    chan struct{}
}

// startWriteback opens path again for the behind goroutine and starts it; nil when the disk
// cannot be opened twice (then only the final fsync writes it out).
func startWriteback(path string) *writeback {
	fd, err := os.Open(path) //nolint:gosec // the target's own path
	if err != nil {
		return nil
	}
	w := &writeback{fd: fd, done: make(chan struct{})}
	w.changed.L = &w.mu
	go w.run()
	return w
}

// written starts writing [off, off+n) to the disk and queues it for the behind goroutine,
// first waiting while the window is full.
func (w *writeback) written(off, n int64) {
	if w == nil || n == 0 {
		return
	}
	// Starting writeback waits for nothing and reports no write error: the second
	// description serves.
	_ = unix.SyncFileRange(int(w.fd.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE) //nolint:gosec // an fd fits an int
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.queued >= writebackWindow && !w.closed {
		w.changed.Wait()
	}
	if w.closed {
		return
	}
	if last := len(w.ranges) - 1; last >= 0 && w.ranges[last][1] == off {
		w.ranges[last][1] += n
	} else {
		w.ranges = append(w.ranges, [2]int64{off, off + n})
	}
	w.queued += n
	w.changed.Broadcast()
}

func (w *writeback) run() {
	defer close(w.done)
	fd := int(w.fd.Fd()) //nolint:gosec // an fd fits an int
	for {
		w.mu.Lock()
		for len(w.ranges) == 0 && !w.closed {
			w.changed.Wait()
		}
		if len(w.ranges) == 0 {
			w.mu.Unlock()
			return
		}
		r := w.ranges[0]
		w.ranges = w.ranges[1:]
		w.mu.Unlock()

		// Errors are left for the target's fsync (see above).
		_ = unix.SyncFileRange(fd, r[0], r[1]-r[0],
			unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
		_ = unix.Fadvise(fd, r[0], r[1]-r[0], unix.FADV_DONTNEED)

		w.mu.Lock()
		w.queued -= r[1] - r[0]
		w.changed.Broadcast()
		w.mu.Unlock()
	}
}

// stop waits for the behind goroutine: with drain, after it has written out and dropped
// every range queued; otherwise after the range it is on.
func (w *writeback) stop(drain bool) {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.closed = true
	if !drain {
		w.ranges = nil
	}
	w.changed.Broadcast()
	w.mu.Unlock()
	<-w.done
	w.fd.Close()
}
