package exporter

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"

	"golang.org/x/sys/unix"

	"github.com/diskpipe/diskpipe/importer"
	"github.com/diskpipe/diskpipe/internal/backup"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore/objectstoretest"
)

// TestIncremental backs a disk up as a full and two incrementals while it changes between
// them — data written, a written range zeroed, a range punched into a hole, the disk grown —
// each incremental holding only the pieces that changed, over its parent's name. qemu-img
// checks every layer and finds the newest, following the backing names, identical to the
// disk then; diskpipe's importer restores each point from the layers alone, identical too.
func TestIncremental(t *testing.T) {
	for _, comp := range []Compression{CompressionNone, CompressionZstd} {
		t.Run(string(comp), func(t *testing.T) {
			src := makeDisk(t, 40<<20+12345, false)
			dir := t.TempDir()
			states := []string{}
			snapshot := func() {
				p := filepath.Join(dir, "state"+string(rune('0'+len(states)))+".raw")
				qemuImg(t, "convert", "-f", "raw", "-O", "raw", src, p)
				states = append(states, p)
			}
			var layers []string
			var prev *Pieces
			backup := func(name string) int64 {
				t.Helper()
				snapshot()
				o := Options{Source: src, Format: FormatQcow2, Compression: comp, Pieces: &Pieces{}, Since: prev}
				if len(layers) > 0 {
					o.Backing = filepath.Base(layers[len(layers)-1])
				}
				out, res := exportFile(t, o)
				p := filepath.Join(dir, name)
				if err := os.Rename(out, p); err != nil {
					t.Fatal(err)
				}
				layers = append(layers, p)
				qemuImg(t, "check", "-f", "qcow2", p)
				qemuImg(t, "compare", "-f", "raw", "-F", "qcow2", states[len(states)-1], p) // through the backing names
				got, err := ParsePieces(o.Pieces.Bytes(), o.Pieces.Size)
				if err != nil || len(got.Sums) != len(o.Pieces.Sums) {
					t.Fatalf("sums object: %v", err)
				}
				prev = o.Pieces
				return res.BytesWritten
			}
			full := backup("full.qcow2")

			f, err := os.OpenFile(src, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			write := func(off int64, b []byte) {
				t.Helper()
				if _, err := f.WriteAt(b, off); err != nil {
					t.Fatal(err)
				}
			}
			write(5<<20, bytes.Repeat([]byte("changed since the full "), 1000))
			write(0, make([]byte, 300<<10)) // written data zeroed: zero clusters over the full's
			inc1 := backup("inc1.qcow2")
			if err := f.Truncate(56 << 20); err != nil { // grown
				t.Fatal(err)
			}
			write(50<<20, bytes.Repeat([]byte{0x5a}, 1<<20))
			punch(t, f, 9<<20, 2<<20) // a hole where data was
			inc2 := backup("inc2.qcow2")
			f.Close()
			t.Logf("full %d bytes, incrementals %d and %d", full, inc1, inc2)
			if inc1 > 2*PieceSize+1<<20 || inc2 > 4*PieceSize+1<<20 {
				t.Errorf("incrementals of %d and %d bytes for a few changed pieces", inc1, inc2)
			}
			info := qemuImg(t, "info", layers[2])
			if !strings.Contains(info, "backing file: inc1.qcow2") || !strings.Contains(info, "backing file format: qcow2") {
				t.Errorf("qemu-img info of the incremental:\n%s", info)
			}
			for point := range layers {
				var chain []importer.ChainLayer
				for _, l := range layers[:point+1] {
					chain = append(chain, importer.ChainLayer{Source: &importer.FileSource{Path: l}})
				}
				target := filepath.Join(t.TempDir(), "disk.img")
				if _, err := importer.Import(t.Context(), importer.Options{Chain: chain, Target: target}); err != nil {
					t.Fatalf("restoring point %d: %v", point+1, err)
				}
				qemuImg(t, "compare", "-f", "raw", "-F", "raw", states[point], target)
			}
		})
	}
}

// punch makes [off, off+n) of f a hole.
func punch(t *testing.T, f *os.File, off, n int64) {
	t.Helper()
	if err := fallocate(f, off, n); err != nil {
		t.Fatal(err)
	}
}

func fallocate(f *os.File, off, n int64) error {
	return unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
}

// TestKeepBackups keeps five backups of a changing disk in the bundled store with the
// exporter command — a full, incrementals, a full again once maxChain is reached, the oldest
// full and its incrementals dropped by keepFulls — and restores every point the index keeps
// with the importer, each identical to the disk at that point (qemu-img compare). The chain,
// downloaded with awscli into one directory, converts with qemu-img by its backing names alone.
func TestKeepBackups(t *testing.T) {
	s := objectstoretest.Start(t)
	if out, err := s.AWS(t.Context(), s.SecretKey, "s3", "mb", "s3://backups"); err != nil {
		t.Fatalf("aws s3 mb: %v\n%s", err, out)
	}
	src := makeDisk(t, 40<<20+12345, false)
	dir := t.TempDir()
	f, err := os.OpenFile(src, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	states := map[string]string{}
	keep := func(cp string, extra ...string) *transfer.Result {
		t.Helper()
		states[cp] = filepath.Join(dir, cp+".raw")
		qemuImg(t, "convert", "-f", "raw", "-O", "raw", src, states[cp])
		code, res, log := runExporter(t, s, append([]string{"--source", src, "--bucket", "backups", "--object", "vm-root/" + cp + ".qcow2",
			"--backup-index", "vm-root/index.json", "--backup-checkpoint", cp, "--backup-max-chain", "2", "--backup-keep-fulls", "1"}, extra...)...)
		if code != 0 {
			t.Fatalf("keeping %s: exit %d\n%s", cp, code, log)
		}
		return res
	}
	keep("cp1")
	for i, cp := range []string{"cp2", "cp3", "cp4", "cp5"} {
		if _, err := f.WriteAt(bytes.Repeat([]byte{byte(0x40 + i)}, 300<<10), int64(i+1)*7<<20); err != nil {
			t.Fatal(err)
		}
		if i == 2 {
			if err := f.Truncate(48 << 20); err != nil { // grown
				t.Fatal(err)
			}
		}
		keep(cp)
	}
	raw, err := s.Client().GetObject(t.Context(), "backups", "vm-root/index.json", minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(raw)
	ix, err := backup.Parse(b)
	if err != nil {
		t.Fatalf("the index: %v\n%s", err, b)
	}
	var got []string
	for _, l := range ix.Layers {
		got = append(got, l.Checkpoint+"<"+l.Parent)
	}
	// cp1 full, cp2 and cp3 after it (maxChain 2), cp4 a full again, cp5 after it; keepFulls 1
	// dropped cp1 to cp3.
	if want := []string{"cp4<", "cp5<cp4"}; !slices.Equal(got, want) {
		t.Fatalf("the index keeps %v, want %v", got, want)
	}
	if out, err := s.AWS(t.Context(), s.SecretKey, "s3", "ls", "s3://backups/vm-root/"); err != nil || strings.Contains(out, "cp1") || strings.Contains(out, "cp2.qcow2") {
		t.Errorf("the dropped backups are still in the store (%v):\n%s", err, out)
	}
	store := s.ClientConfig()
	for _, cp := range []string{"cp4", "cp5"} {
		target := filepath.Join(t.TempDir(), "disk.img")
		res, err := importer.Import(t.Context(), importer.Options{ChainIndex: &importer.ChainIndex{
			Source: &importer.S3Source{Config: store, Bucket: "backups", Object: "vm-root/index.json"}, Point: cp}, Target: target})
		if err != nil {
			t.Fatalf("restoring %s: %v", cp, err)
		}
		qemuImg(t, "compare", "-f", "raw", "-F", "raw", states[cp], target)
		if res.Revision != cp {
			t.Errorf("restored %q, want %q", res.Revision, cp)
		}
	}
	down := t.TempDir()
	if out, err := s.AWS(t.Context(), s.SecretKey, "s3", "cp", "--recursive", "--only-show-errors", "s3://backups/vm-root/", down+"/"); err != nil {
		t.Fatalf("aws s3 cp: %v\n%s", err, out)
	}
	qemuImg(t, "compare", "-f", "raw", "-F", "qcow2", states["cp5"], filepath.Join(down, "cp5.qcow2"))

	// The attempt after one that wrote the index finds its backup kept.
	code, res, log := runExporter(t, s, "--source", src, "--bucket", "backups", "--object", "vm-root/cp5.qcow2",
		"--backup-index", "vm-root/index.json", "--backup-checkpoint", "cp5")
	if code != 0 || res.Revision != "cp5" || !strings.Contains(log, "The index already holds this backup") {
		t.Errorf("cp5 again: exit %d, %+v\n%s", code, res, log)
	}
	// An index at a bucket's root, or of a backup's own name, is refused.
	for _, tc := range []struct{ index, object, msg string }{
		{"index.json", "cp6.qcow2", "must be in a directory of its bucket"},
		{"vm-root/cp6.qcow2", "vm-root/cp6.qcow2", "has the name of the backup \"cp6\"'s own objects"},
		{"vm-root/cp6.sums", "vm-root/cp6.qcow2", "has the name of the backup \"cp6\"'s own objects"},
	} {
		code, res, _ := runExporter(t, s, "--source", src, "--bucket", "backups", "--object", tc.object, "--backup-index", tc.index, "--backup-checkpoint", "cp6")
		if code == 0 || !strings.Contains(res.Message, tc.msg) {
			t.Errorf("index %s: exit %d, %q, want %q", tc.index, code, res.Message, tc.msg)
		}
	}
	// A checkpoint the index holds is refused, and the index is left as it was.
	code, res, _ = runExporter(t, s, "--source", src, "--bucket", "backups", "--object", "vm-root/again.qcow2",
		"--backup-index", "vm-root/index.json", "--backup-checkpoint", "cp5")
	if code == 0 || !strings.Contains(res.Message, `already holds checkpoint "cp5"`) {
		t.Errorf("a second cp5: exit %d, %+v", code, res)
	}
}
