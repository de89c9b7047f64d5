package importer

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// alignedBuffer is n bytes of data starting on a page.
func alignedBuffer(n int, fill byte) []byte {
	b := make([]byte, n+directAlign)
	skip := (directAlign - int(uintptr(unsafe.Pointer(&b[0]))%directAlign)) % directAlign
	b = b[skip : skip+n]
	for i := range b {
		b[i] = fill + byte(i%251)
	}
	return b
}

// cachedPages counts the pages of path's n bytes from off in the page cache (mincore).
func cachedPages(t *testing.T, path string, off, n int64) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), off, int(n), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem) //nolint:errcheck // a test's mapping
	vec := make([]byte, (n+directAlign-1)/directAlign)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	cached := 0
	for _, v := range vec {
		cached += int(v & 1)
	}
	return cached
}

// TestDirectWrites writes a disk in three ways: aligned pieces go around the page cache
// (none of their pages is cached after), an unaligned piece goes through it, and when the
// direct file refuses a write the piece is written through the page cache instead. The disk
// holds every piece.
func TestDirectWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "disk.img")
	tg, err := OpenTarget(path, 64<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	if tg.direct == nil {
		t.Skip("the test directory's filesystem refuses O_DIRECT: every write goes through the page cache")
	}
	if err := tg.Prepare(8 << 20); err != nil {
		t.Fatal(err)
	}
	aligned := alignedBuffer(1<<20, 1)
	if _, err := tg.WriteAt(aligned, 1<<20); err != nil {
		t.Fatal(err)
	}
	if n := cachedPages(t, path, 1<<20, 1<<20); n != 0 {
		t.Errorf("%d pages of an aligned write are in the page cache: it was not written directly", n)
	}
	unaligned := alignedBuffer(5000, 2)[100:]
	if _, err := tg.WriteAt(unaligned, 3<<20+100); err != nil {
		t.Fatal(err)
	}
	// A direct file that refuses writes (here: opened read-only) leaves the page cache to do it.
	refusing, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	direct := tg.direct
	tg.direct = refusing
	refused := alignedBuffer(64<<10, 3)
	if _, err := tg.WriteAt(refused, 5<<20); err != nil {
		t.Fatal(err)
	}
	tg.direct = direct
	refusing.Close()
	if got := tg.Written(); got != int64(len(aligned)+len(unaligned)+len(refused)) {
		t.Errorf("Written = %d, want %d", got, len(aligned)+len(unaligned)+len(refused))
	}
	if err := tg.Finish(8 << 20); err != nil {
		t.Fatal(err)
	}
	disk, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 8<<20)
	copy(want[1<<20:], aligned)
	copy(want[3<<20+100:], unaligned)
	copy(want[5<<20:], refused)
	if !bytes.Equal(disk, want) {
		t.Error("the disk does not hold what was written")
	}
}
