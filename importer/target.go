package importer

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// DefaultOverhead is the share of a filesystem volume kept for the filesystem itself.
const DefaultOverhead = transfer.DefaultOverhead

// Target is where an import writes: the file disk.img on a filesystem volume, or a block
// device. Zeros are never written: a file gets holes, a device is zeroed up front as cheaply
// as it allows (BLKZEROOUT) and then only non-zero data is written.
type Target struct {
	path   string
	block  bool
	f      *os.File
	usable int64
	size   int64
	// overhead is the share of a filesystem volume kept for the filesystem.
	overhead float64
	written  atomic.Int64
	// behind writes the disk out as the import goes and keeps its page cache small
	// (writeback.go); nil until the import starts writing.
	behind *writeback
	// grow makes a disk file as large as the volume allows when the image is smaller.
	grow bool
	// preallocate allocates the whole disk file when it is finished.
	preallocate bool
	// checkpointed is set when the disk has a checkpoint (this import resumed one or recorded
	// one): it is worth keeping after a transient failure.
	checkpointed bool
	// writing lets one write into the disk at a time. ext4 (and XFS) serialize buffered
	// writes to a file on its inode lock, where the waiting writers spin: with the converter's
	// eight workers writing at once, a 4 GiB import spent 13 % of its CPU spinning, and 30-40 %
	// more CPU in all than when the writers wait here, parked. (A block device's writes take
	// turns too; one writer copies into the page cache faster than a network delivers.)
	writing sync.Mutex
	// pending receives the result of the checkpoint being recorded in the background.
	pending chan error
}

// OpenTarget opens path: a block device as it is, anything else as the disk file, created if
// need be. capacity is the volume's size (0: the filesystem's or device's own); on a
// filesystem, overhead (a fraction) of it is kept free for the filesystem.
func OpenTarget(path string, capacity int64, overhead float64) (*Target, error) {
	t := &Target{path: path, overhead: overhead}
	if fi, err := os.Stat(path); err == nil && fi.Mode()&os.ModeDevice != 0 {
		t.block = true
	}
	flags := os.O_RDWR
	if !t.block {
		flags |= os.O_CREATE
	}
	f, err := os.OpenFile(path, flags, 0o644) //nolint:gosec // the disk is read by the VM's pod
	if err != nil {
		return nil, transfer.Permanent(transfer.ReasonTargetError, "opening target: %w", err)
	}
	t.f = f
	switch {
	case t.block:
		var size uint64
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size))); e != 0 {
			f.Close()
			return nil, transfer.Permanent(transfer.ReasonTargetError, "reading the size of %s: %w", path, e)
		}
		t.usable = int64(size) //nolint:gosec // a device's size fits
		if capacity > 0 {
			t.usable = min(t.usable, capacity)
		}
	default:
		if capacity <= 0 {
			var st unix.Statfs_t
			if err := unix.Statfs(filepath.Dir(path), &st); err != nil {
				f.Close()
				return nil, transfer.Permanent(transfer.ReasonTargetError, "reading the size of the target's filesystem: %w", err)
			}
			capacity = int64(st.Blocks) * st.Bsize //nolint:gosec // sizes fit
		}
		t.usable = transfer.Usable(capacity, overhead)
	}
	return t, nil
}

// GrownSize is the size a grown disk file gets: the usable size, rounded down to a MiB.
func (t *Target) GrownSize() int64 { return t.usable &^ (1<<20 - 1) }

// Grow extends an existing disk file to GrownSize, keeping what it holds; a block device
// needs nothing (the disk is the device). It serves disks cloned by the storage system into
// a volume larger than their image.
func Grow(path string, capacity int64, overhead float64, preallocate bool) (*transfer.Result, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, transfer.Permanent(transfer.ReasonTargetError, "the cloned disk: %w", err)
	}
	t, err := OpenTarget(path, capacity, overhead)
	if err != nil {
		return nil, err
	}
	t.preallocate = preallocate
	res := &transfer.Result{Succeeded: true, Format: string(FormatRaw), VirtualSize: fi.Size()}
	if t.block {
		res.VirtualSize = t.usable
		return res, t.f.Close()
	}
	if grown := t.GrownSize(); grown > fi.Size() {
		res.VirtualSize = grown
		if err := t.f.Truncate(grown); err != nil {
			t.f.Close()
			return nil, transfer.Permanent(transfer.ReasonTargetError, "growing %s: %w", path, err)
		}
	}
	if err := t.allocate(res.VirtualSize); err != nil {
		t.f.Close()
		return nil, err
	}
	if err := t.f.Sync(); err != nil {
		t.f.Close()
		return nil, transfer.Permanent(transfer.ReasonTargetError, "flushing %s: %w", path, err)
	}
	return res, t.f.Close()
}

// Usable is how many bytes of disk the target can hold.
func (t *Target) Usable() int64 { return t.usable }

// Written is how many bytes were written (holes and skipped zeros excluded).
func (t *Target) Written() int64 { return t.written.Load() }

// Prepare makes the target an all-zero disk of size bytes (0: not known yet).
func (t *Target) Prepare(size int64) error {
	if err := t.fits(size); err != nil {
		return err
	}
	t.size = size
	if t.block {
		if err := t.zero(); err != nil {
			return err
		}
	} else {
		if err := t.f.Truncate(0); err != nil {
			return transfer.Permanent(transfer.ReasonTargetError, "emptying %s: %w", t.path, err)
		}
		if err := t.f.Truncate(size); err != nil {
			return transfer.Permanent(transfer.ReasonTargetError, "sizing %s: %w", t.path, err)
		}
	}
	t.startWriteback()
	return nil
}

// startWriteback starts writing the disk out behind the import, once.
func (t *Target) startWriteback() {
	if t.behind == nil {
		t.behind = startWriteback(t.path)
	}
}

func (t *Target) fits(size int64) error {
	if size <= t.usable {
		return nil
	}
	if t.block {
		return transfer.Permanent(transfer.ReasonTooLarge,
			"the image's virtual size %s is larger than the block device (%s): request a volume of at least %s",
			bytesString(size), bytesString(t.usable), bytesString(transfer.RoundMiB(size)))
	}
	return transfer.Permanent(transfer.ReasonTooLarge,
		"the image's virtual size %s is larger than the volume less its %g %% filesystem overhead (%s): request a volume of at least %s",
		bytesString(size), t.overhead*100, bytesString(t.usable), bytesString(transfer.VolumeSizeFor(size, t.overhead)))
}

// zero zeroes the whole device, by BLKZEROOUT where the device supports it, else by writes.
func (t *Target) zero() error {
	rng := [2]uint64{0, uint64(t.usable)} //nolint:gosec // positive
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, t.f.Fd(), unix.BLKZEROOUT, uintptr(unsafe.Pointer(&rng[0]))); e == 0 {
		return nil
	}
	buf := make([]byte, 1<<20)
	for off := int64(0); off < t.usable; off += int64(len(buf)) {
		n := min(int64(len(buf)), t.usable-off)
		if _, err := t.f.WriteAt(buf[:n], off); err != nil {
			return transfer.Permanent(transfer.ReasonTargetError, "zeroing %s: %w", t.path, err)
		}
	}
	return nil
}

// WriteAt writes p at off, skipping the 4 KiB blocks (aligned to the disk, so that they
// become holes) that hold only zeros: the target was prepared all-zero, so nothing is lost.
func (t *Target) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, negativeOffset(off)
	}
	if end := off + int64(len(p)); end > t.usable {
		return 0, t.fits(end)
	}
	for done := 0; done < len(p); {
		// The run of zero blocks, then the run of data blocks, from here.
		zeros := done
		for zeros < len(p) && isZero(p[zeros:blockEnd(p, off, zeros)]) {
			zeros = blockEnd(p, off, zeros)
		}
		data := zeros
		for data < len(p) && !isZero(p[data:blockEnd(p, off, data)]) {
			data = blockEnd(p, off, data)
		}
		if data > zeros {
			if err := t.write(p[zeros:data], off+int64(zeros)); err != nil {
				return zeros, err
			}
		}
		done = data
	}
	return len(p), nil
}

// blockEnd is the index in p where the disk block holding p[i] ends.
func blockEnd(p []byte, off int64, i int) int {
	abs := off + int64(i)
	return min(len(p), i+int(sparseBlock-abs%sparseBlock))
}

func (t *Target) write(p []byte, off int64) error {
	t.writing.Lock()
	n, err := t.f.WriteAt(p, off)
	t.writing.Unlock()
	t.written.Add(int64(n))
	t.behind.written(off, int64(n))
	if err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			return transfer.Permanent(transfer.ReasonTargetError, "the target volume is full after %s: %w", bytesString(t.Written()), err)
		}
		return transfer.Permanent(transfer.ReasonTargetError, "writing %s: %w", t.path, err)
	}
	return nil
}

// Resume takes the disk as a checkpointed import left it: nothing is emptied.
func (t *Target) Resume(size int64) error {
	if err := t.fits(size); err != nil {
		return err
	}
	t.size, t.checkpointed = size, true
	t.startWriteback()
	return nil
}

// Finish sets the disk's final size (a file is truncated to it, or grown to the usable size
// with grow), removes any checkpoint and flushes it to stable storage.
func (t *Target) Finish(size int64) error {
	t.behind.stop(true)
	if err := t.settle(); err != nil {
		return err
	}
	if err := t.removeCheckpoint(size); err != nil {
		return err
	}
	if !t.block {
		if t.grow {
			size = max(size, t.GrownSize())
		}
		if err := t.f.Truncate(size); err != nil {
			return transfer.Permanent(transfer.ReasonTargetError, "sizing %s: %w", t.path, err)
		}
		if err := t.allocate(size); err != nil {
			return err
		}
	}
	if err := t.syncData(); err != nil {
		return err
	}
	return t.f.Close()
}

// allocate allocates the disk file's holes, up to size, when it is to be preallocated: what
// it holds stays, the holes read as zeros still.
func (t *Target) allocate(size int64) error {
	if !t.preallocate || size == 0 {
		return nil
	}
	err := unix.Fallocate(int(t.f.Fd()), 0, 0, size) //nolint:gosec // an fd fits an int
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.ENOSPC):
		return transfer.Permanent(transfer.ReasonTargetError, "the volume has no room to preallocate the %s disk: %w", bytesString(size), err)
	case errors.Is(err, syscall.EOPNOTSUPP):
		return transfer.Permanent(transfer.ReasonTargetError, "the volume's filesystem cannot preallocate (fallocate): import without preallocation: %w", err)
	}
	return transfer.Permanent(transfer.ReasonTargetError, "preallocating %s: %w", t.path, err)
}

// Wipe leaves the target empty after a failure, so no half-written disk looks valid: the
// file is removed, the device zeroed.
func (t *Target) Wipe() error {
	defer t.f.Close()
	t.behind.stop(false)
	_ = t.settle() // the disk goes with its checkpoint, whether or not that was recorded
	if t.block {
		return t.zero()
	}
	_ = os.Remove(t.checkpointPath())
	return os.Remove(t.path)
}

// Keep closes the target after a transient failure, leaving the disk and its checkpoint for
// the next attempt.
func (t *Target) Keep() error {
	t.behind.stop(false)
	_ = t.settle() // a checkpoint that could not be recorded leaves the one before it
	return t.f.Close()
}

// sparseWriter writes a stream at increasing offsets; the target skips its zeros.
type sparseWriter struct {
	t   *Target
	off int64
}

const sparseBlock = 4096

var zeroBlock [sparseBlock]byte

func (w *sparseWriter) Write(p []byte) (int, error) {
	if _, err := w.t.WriteAt(p, w.off); err != nil {
		return 0, err
	}
	w.off += int64(len(p))
	return len(p), nil
}

func isZero(b []byte) bool { return bytes.Equal(b, zeroBlock[:len(b)]) }

// isZeroBlocks reports whether b, of any length, holds only zeros.
func isZeroBlocks(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), sparseBlock)
		if !isZero(b[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}

// bytesString prints n bytes for a human, e.g. "4.0 GiB (4294967296 bytes)".
func bytesString(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d bytes", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB (%d bytes)", float64(n)/float64(div), "KMGTPE"[exp], n)
}

// syncData flushes what was written to stable storage.
func (t *Target) syncData() error {
	if err := t.f.Sync(); err != nil {
		return transfer.Permanent(transfer.ReasonTargetError, "flushing %s: %w", t.path, err)
	}
	return nil
}
