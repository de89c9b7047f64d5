package importer

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// randomRaw writes a raw image of size bytes of random data: every block is written.
func randomRaw(t *testing.T, size int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "random.raw")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rng := rand.NewChaCha8([32]byte{1})
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		_, _ = rng.Read(buf)
		if _, err := f.WriteAt(buf[:min(int64(len(buf)), size-off)], off); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// resident is how many bytes of path are in the page cache.
func resident(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Munmap(m) }()
	page := int64(os.Getpagesize())
	vec := make([]byte, (fi.Size()+page-1)/page)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	var n int64
	for _, v := range vec {
		n += int64(v & 1)
	}
	return n * page
}

// TestWritebackDropsWhatIsWritten imports 256 MiB of data, four times the writeback window:
// the disk is whole, and what it left in the page cache is less than the window (the pages
// written are dropped once on the disk, so the page cache does not grow with the image).
func TestWritebackDropsWhatIsWritten(t *testing.T) {
	const size = 4 * writebackWindow
	raw := randomRaw(t, size)
	for name, src := range map[string]string{"raw": raw, "qcow2": convertTo(t, raw, "qcow2")} {
		t.Run(name, func(t *testing.T) {
			target, _ := mustImport(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, &fileServer{path: src})}})
			if r := resident(t, target); r >= writebackWindow {
				t.Errorf("%d MiB of the %d MiB disk are in the page cache after the import, want less than the %d MiB window",
					r>>20, size>>20, writebackWindow>>20)
			}
			sameDisk(t, raw, target)
		})
	}
}

// failingDevice is a loop device of size bytes whose backing file lies on a tmpfs with room
// for only room bytes: writes succeed into the page cache, and the disk refuses them on
// writeback (an I/O error) once the tmpfs is full.
func failingDevice(t *testing.T, room, size int64) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", room), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v: %s): a failing disk is not tested", err, out)
	}
	// Lazily: the loop device lets go of its backing file after losetup -d returns.
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	backing := filepath.Join(dir, "backing")
	if err := os.WriteFile(backing, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(backing, size); err != nil {
		t.Fatal(err)
	}
	return attachLoop(t, backing)
}

// TestWritebackLeavesErrorsForFsync writes 32 MiB into a disk with room for 8 and lets the
// behind goroutine wait for every range (it is told of the failures first): the target's
// own fsync, with nothing written after, still reports them. Were they consumed on the
// target's file description, the fsync would succeed and a checkpoint or a finished import
// would claim data the disk never took.
func TestWritebackLeavesErrorsForFsync(t *testing.T) {
	dev := failingDevice(t, 8<<20, 64<<20)
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := startWriteback(dev)
	if w == nil {
		t.Fatal("the device could not be opened for writeback")
	}
	data, err := os.ReadFile(randomRaw(t, 32<<20))
	if err != nil {
		t.Fatal(err)
	}
	for off := int64(0); off < int64(len(data)); off += 1 << 20 {
		if _, err := f.WriteAt(data[off:off+1<<20], off); err != nil {
			t.Fatalf("a write into the page cache failed: %v", err)
		}
		w.written(off, 1<<20)
	}
	w.stop(true)
	if err := f.Sync(); err == nil {
		t.Fatal("fsync succeeded after the disk refused 24 MiB of the 32 MiB written")
	}
}

// TestWritebackErrorFailsTheImport imports 128 MiB into a disk with room for 16: the import
// fails and says why; it never reports a disk it did not write.
func TestWritebackErrorFailsTheImport(t *testing.T) {
	dev := failingDevice(t, 16<<20, 160<<20)
	raw := randomRaw(t, 128<<20)
	_, _, err := importTo(t, "", Options{Source: &HTTPSource{URL: serve(t, &fileServer{path: raw})}, Target: dev, Format: FormatRaw})
	if err == nil {
		t.Fatal("the import succeeded onto a disk that could hold 16 MiB of its 128 MiB")
	}
	t.Log(err)
	if transfer.ReasonOf(err) != transfer.ReasonTargetError || !strings.Contains(err.Error(), dev) {
		t.Errorf("err = %v (reason %s), want a target error naming %s", err, transfer.ReasonOf(err), dev)
	}
}
