package exporter

import (
	"bytes"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// makeDisk writes a raw disk of size bytes: random data, text and 0xff runs between holes,
// and, when dense, no holes at all (every cluster written, zeros included).
func makeDisk(t *testing.T, size int64, dense bool) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if dense {
		if _, err := f.Write(make([]byte, size)); err != nil {
			t.Fatal(err)
		}
	} else if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	random := make([]byte, 3<<20+11)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	for _, w := range []struct {
		off  int64
		data []byte
	}{
		{0, random[:1<<20]},
		{2<<20 + 512, bytes.Repeat([]byte("exported by diskpipe "), 50000)},
		{9<<20 + 4000, random},
		{20 << 20, bytes.Repeat([]byte{0xff}, 70000)},
		{size - 1000, random[:1000]},
	} {
		if _, err := f.WriteAt(w.data, w.off); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func qemuImg(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("qemu-img", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-img %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// checkImage is the oracle: qemu-img check finds no error or leak, and qemu-img compare finds
// the image identical to its source.
func checkImage(t *testing.T, src, img, format string) {
	t.Helper()
	if format == "qcow2" {
		out := qemuImg(t, "check", "-f", "qcow2", img)
		if !strings.Contains(out, "No errors were found") {
			t.Errorf("qemu-img check:\n%s", out)
		}
	}
	qemuImg(t, "compare", "-f", "raw", "-F", format, src, img)
}

func exportFile(t *testing.T, o Options) (string, *transfer.Result) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "export.img")
	sink, err := NewFileSink(out)
	if err != nil {
		t.Fatal(err)
	}
	o.Sink = sink
	res, err := Export(t.Context(), o)
	if err != nil {
		t.Fatalf("export: %v (%s)", err, transfer.ReasonOf(err))
	}
	return out, res
}

// TestQcow2 exports sparse and dense disks, compressed and not, and checks each with qemu-img.
func TestQcow2(t *testing.T) {
	for _, dense := range []bool{false, true} {
		src := makeDisk(t, 40<<20+12345, dense) // not cluster-aligned
		for _, comp := range []Compression{CompressionNone, CompressionZlib, CompressionZstd} {
			t.Run(map[bool]string{false: "sparse", true: "dense"}[dense]+" "+string(comp), func(t *testing.T) {
				out, res := exportFile(t, Options{Source: src, Format: FormatQcow2, Compression: comp})
				checkImage(t, src, out, "qcow2")
				info := qemuImg(t, "info", out)
				if comp == CompressionZstd && !strings.Contains(info, "compression type: zstd") {
					t.Errorf("qemu-img info:\n%s", info)
				}
				fi, _ := os.Stat(out)
				if res.BytesWritten != fi.Size() || res.VirtualSize != 40<<20+12345 || !strings.HasPrefix(res.Digest, "sha256:") {
					t.Errorf("result %+v for a %d-byte file", res, fi.Size())
				}
				if fi.Size() > 16<<20 {
					t.Errorf("a disk with 5 MiB of data exported to %d bytes", fi.Size())
				}
			})
		}
	}
}

// TestRaw exports the disk's bytes as they are.
func TestRaw(t *testing.T) {
	src := makeDisk(t, 30<<20, false)
	out, res := exportFile(t, Options{Source: src, Format: FormatRaw})
	checkImage(t, src, out, "raw")
	if res.BytesWritten != 30<<20 {
		t.Errorf("wrote %d bytes", res.BytesWritten)
	}
}
