package exporter

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/diskpipe/diskpipe/importer"
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
