package importer

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// holes makes a file of size bytes that is all hole, closed at the end of the test.
func holes(t *testing.T, size int64) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "disk.raw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return f
}

// sparseDisk writes a raw disk of 64 MiB whose data is 4 KiB at its start, 1 MiB at 8 MiB and
// its last 1 MiB, the rest holes; it returns its path and how many bytes of data it holds.
func sparseDisk(t *testing.T) (string, int64) {
	t.Helper()
	f := holes(t, 64<<20)
	p := f.Name()
	data := int64(0)
	for _, e := range []Extent{{0, 4 << 10}, {8 << 20, 1 << 20}, {63 << 20, 1 << 20}} {
		b := make([]byte, e.Len)
		for i := range b {
			b[i] = byte(e.Off>>20) + byte(i%251) + 1
		}
		if _, err := f.WriteAt(b, e.Off); err != nil {
			t.Fatal(err)
		}
		data += e.Len
	}
	if got := fileExtents(f, 64<<20); len(got) != 3 {
		t.Skipf("the file system of %s does not tell its holes (SEEK_HOLE): %v", p, got)
	}
	return p, data
}

// TestSparseCopies: a raw copy of a disk with holes reads its data only, from a local disk.img
// (a copy on the image's node) as from a clone source on another node, and the copy is the
// disk (qemu-img compare). Without the extents list, the clone source's disk is read whole.
func TestSparseCopies(t *testing.T) {
	disk, data := sparseDisk(t)
	atMost := data + sniffLen // what is read: the data, and the head the format is told by
	check := func(what string, args ...string) int64 {
		t.Helper()
		target := filepath.Join(t.TempDir(), "disk.img")
		code, res, log := runMain(t, append(args, "--format", "raw", "--target", target)...)
		if code != transfer.ExitSucceeded {
			t.Fatalf("%s: exit %d %+v\n%s", what, code, res, log)
		}
		sameDisk(t, disk, target)
		if skipped := res.BytesRead < 64<<20; skipped != (res.Digest == "") {
			t.Errorf("%s: digest %q after reading %d bytes: a digest is of the whole disk, or none", what, res.Digest, res.BytesRead)
		}
		return res.BytesRead
	}
	if read := check("a local disk", "--source", "file", "--path", disk); read > atMost {
		t.Errorf("a local disk: %d bytes read, of %d of data", read, data)
	}

	base, trust, _, stop := startServe(t, disk)
	defer stop()
	if read := check("a clone source", append([]string{"--url", base + ServePath, "--extents-url", base + ExtentsPath}, trust...)...); read > atMost {
		t.Errorf("a clone source: %d bytes read, of %d of data", read, data)
	}
	if read := check("a clone source, no list", append([]string{"--url", base + ServePath}, trust...)...); read != 64<<20 {
		t.Errorf("without the extents: %d bytes read, not the whole disk", read)
	}
	// A list of runs that touch (another server's) is followed as it is.
	list := `[{"Off":0,"Len":4096},{"Off":8388608,"Len":524288},{"Off":8912896,"Len":524288},{"Off":66060288,"Len":1048576}]`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == ExtentsPath {
			_, _ = w.Write([]byte(list))
			return
		}
		http.ServeFile(w, r, disk)
	}))
	defer srv.Close()
	if read := check("runs that touch", "--url", srv.URL+"/disk", "--extents-url", srv.URL+ExtentsPath); read > atMost {
		t.Errorf("runs that touch: %d bytes read, of %d of data", read, data)
	}
	// A checksum is of every byte: the disk is read whole.
	if read := check("a checksum", "--source", "file", "--path", disk, "--checksum", sha256File(t, disk)); read != 64<<20 {
		t.Errorf("with a checksum: %d bytes read, not the whole disk", read)
	}
}

// TestExtentsNotBelieved: a list of extents that is not one (out of order, past the disk, an
// empty run, not JSON, longer than maxExtents) is not used: the disk is read whole, and copied
// right.
func TestExtentsNotBelieved(t *testing.T) {
	disk, _ := sparseDisk(t)
	for _, body := range []string{
		`[{"Off":8388608,"Len":1048576},{"Off":0,"Len":4096}]`,
		`[{"Off":66060288,"Len":4194304}]`,
		`[{"Off":0,"Len":0}]`,
		`not json`,
		"[" + strings.Repeat(`{"Off":0,"Len":1},`, maxExtents) + `{"Off":0,"Len":1}]`,
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == ExtentsPath {
				_, _ = w.Write([]byte(body))
				return
			}
			http.ServeFile(w, r, disk)
		}))
		target := filepath.Join(t.TempDir(), "disk.img")
		code, res, log := runMain(t, "--url", srv.URL+"/disk", "--extents-url", srv.URL+ExtentsPath, "--format", "raw", "--target", target)
		srv.Close()
		what := body[:min(len(body), 60)]
		if code != transfer.ExitSucceeded {
			t.Fatalf("%s: exit %d %+v\n%s", what, code, res, log)
		}
		sameDisk(t, disk, target)
		if res.BytesRead != 64<<20 {
			t.Errorf("%s: %d bytes read, not the whole disk", what, res.BytesRead)
		}
	}
}

// TestFileExtents: holes shorter than extentGap are read with the data around them; a file
// with no data has no extents.
func TestFileExtents(t *testing.T) {
	f := holes(t, 16<<20)
	if got := fileExtents(f, 16<<20); got == nil || len(got) != 0 {
		t.Fatalf("an empty disk: %v", got)
	}
	for _, off := range []int64{1 << 20, 1<<20 + 512<<10, 10 << 20} {
		if _, err := f.WriteAt([]byte("data"), off); err != nil {
			t.Fatal(err)
		}
	}
	got := fileExtents(f, 16<<20)
	if len(got) != 2 || got[0].Off > 1<<20 || got[0].Off+got[0].Len < 1<<20+512<<10+4 || got[1].Off > 10<<20 || got[1].Off+got[1].Len < 10<<20+4 {
		t.Errorf("extents %v: want two, the first across the short hole", got)
	}
}
