package importer

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// loopDevice attaches a file of size bytes filled with garbage (so that zeroing shows) to a
// loop device, as a CSI driver's block volume would be; loopArgs go to losetup.
func loopDevice(t *testing.T, size int64, loopArgs ...string) string {
	t.Helper()
	backing := filepath.Join(t.TempDir(), "backing")
	f, err := os.Create(backing)
	if err != nil {
		t.Fatal(err)
	}
	garbage := bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 1<<18)
	for off := int64(0); off < size; off += int64(len(garbage)) {
		if _, err := f.WriteAt(garbage[:min(int64(len(garbage)), size-off)], off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	return attachLoop(t, backing, loopArgs...)
}

// attachLoop attaches backing to a loop device for the test (with losetup's args, such as a
// sector size); it skips the test where the machine has none.
func attachLoop(t *testing.T, backing string, args ...string) string {
	t.Helper()
	out, err := exec.Command("losetup", append(append([]string{"-f", "--show"}, args...), backing)...).CombinedOutput() //nolint:gosec // the test's own device
	if err != nil {
		t.Skipf("no loop device on this machine (losetup: %v: %s): block volumes are not tested", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	return dev
}

// allZero reads path and reports whether every byte is zero.
func allZero(t *testing.T, path string) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		n, err := f.Read(buf)
		if !isZeroBlocks(buf[:n]) {
			return false
		}
		if err == io.EOF {
			return true
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestBlockTarget imports into a block device: the image's bytes, and zeros beyond them
// where the device held garbage.
func TestBlockTarget(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	for _, src := range []string{convertTo(t, raw, "qcow2", "-c"), compress(t, raw, "zstd")} {
		t.Run(filepath.Base(src), func(t *testing.T) {
			dev := loopDevice(t, 80<<20)
			_, res := mustImport(t, "", Options{Source: &HTTPSource{URL: serve(t, &fileServer{path: src})}, Target: dev})
			// qemu-img compare accepts the larger device only if its extra 16 MiB are zeros.
			sameDisk(t, raw, dev)
			if res.VirtualSize != fixtureSize {
				t.Errorf("virtual size %d, want %d", res.VirtualSize, fixtureSize)
			}
		})
	}
	t.Run("checksum mismatch zeroes the device", func(t *testing.T) {
		dev := loopDevice(t, 80<<20)
		url := serve(t, &fileServer{path: raw})
		_, _, err := importTo(t, "", Options{Source: &HTTPSource{URL: url}, Target: dev, Checksum: "md5:00000000000000000000000000000000"})
		if transfer.ReasonOf(err) != transfer.ReasonChecksumMismatch {
			t.Fatalf("err = %v, want a checksum mismatch", err)
		}
		if !allZero(t, dev) {
			t.Error("the device holds data after a failed import")
		}
	})
	t.Run("too small", func(t *testing.T) {
		dev := loopDevice(t, 32<<20)
		url := serve(t, &fileServer{path: convertTo(t, raw, "qcow2")})
		_, _, err := importTo(t, "", Options{Source: &HTTPSource{URL: url}, Target: dev})
		if transfer.ReasonOf(err) != transfer.ReasonTooLarge || !strings.Contains(err.Error(), "larger than the block device") {
			t.Fatalf("err = %v, want TooLarge naming the block device", err)
		}
	})
}

// TestBlock4Kn imports into a block device of 4096-byte logical sectors (4Kn: DRBD, LINSTOR, many
// NVMe drives), whose imports CDI broke in v1.65 until v1.66.1: a qcow2 read at random, a raw
// image through the copy engine, a compressed one streamed, a disk copied from another 4Kn
// device, each identical to its image (qemu-img); a failed one leaves
// the device zeroed, which a 4Kn device takes in whole sectors only.
func TestBlock4Kn(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	dev4k := func(t *testing.T) string {
		dev := loopDevice(t, 80<<20, "--sector-size", "4096")
		out, err := exec.Command("blockdev", "--getss", dev).Output()
		if err != nil || strings.TrimSpace(string(out)) != "4096" {
			t.Skipf("no loop device of 4096-byte sectors here (blockdev --getss %s: %q %v)", dev, out, err)
		}
		return dev
	}
	for _, src := range []string{convertTo(t, raw, "qcow2"), raw, compress(t, raw, "zstd")} {
		t.Run(filepath.Base(src), func(t *testing.T) {
			dev := dev4k(t)
			mustImport(t, "", Options{Source: &HTTPSource{URL: serve(t, &fileServer{path: src})}, Target: dev, Format: map[bool]Format{true: FormatRaw}[src == raw]})
			sameDisk(t, raw, dev)
		})
	}
	t.Run("a 4Kn device copied", func(t *testing.T) {
		from := dev4k(t)
		mustImport(t, "", Options{Source: &HTTPSource{URL: serve(t, &fileServer{path: raw})}, Target: from, Format: FormatRaw})
		dev := dev4k(t)
		mustImport(t, "", Options{Source: &FileSource{Path: from}, Target: dev, Format: FormatRaw})
		sameDisk(t, from, dev)
	})
	t.Run("checksum mismatch zeroes it", func(t *testing.T) {
		dev := dev4k(t)
		_, _, err := importTo(t, "", Options{Source: &HTTPSource{URL: serve(t, &fileServer{path: raw})}, Target: dev, Format: FormatRaw,
			Checksum: "md5:00000000000000000000000000000000"})
		if transfer.ReasonOf(err) != transfer.ReasonChecksumMismatch {
			t.Fatalf("err = %v, want a checksum mismatch", err)
		}
		if !allZero(t, dev) {
			t.Error("the device holds data after a failed import")
		}
	})
}

// TestBlank makes an empty disk: a sparse file, or a zeroed device.
func TestBlank(t *testing.T) {
	target, res := mustImport(t, t.TempDir(), Options{Blank: true, BlankSize: 1 << 30})
	if fi, err := os.Stat(target); err != nil || fi.Size() != 1<<30 {
		t.Fatalf("blank disk: %v, size %v", err, fi)
	}
	if a := allocated(t, target); a != 0 {
		t.Errorf("a blank 1 GiB disk holds %d bytes on disk, want a hole", a)
	}
	if res.BytesWritten != 0 {
		t.Errorf("wrote %d bytes for a blank disk", res.BytesWritten)
	}
	dev := loopDevice(t, 16<<20)
	mustImport(t, "", Options{Blank: true, BlankSize: 16 << 20, Target: dev})
	if !allZero(t, dev) {
		t.Error("the blank device still holds its old data")
	}
	target, _, err := importTo(t, t.TempDir(), Options{Blank: true, BlankSize: 1 << 30, Capacity: 1 << 29})
	wantFailure(t, target, err, transfer.ReasonTooLarge, false, "larger than the volume")
}

// TestFileSource copies another volume's disk (a host-assisted clone): from a file and from a
// block device, sparsely, and never interprets a guest's bytes as an image header.
func TestFileSource(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	target, _ := mustImport(t, t.TempDir(), Options{Source: &FileSource{Path: raw}, Format: FormatRaw})
	sameDisk(t, raw, target)
	if a := allocated(t, target); a > allocated(t, raw)+1<<20 {
		t.Errorf("the copy holds %d bytes on disk, the original %d", a, allocated(t, raw))
	}

	dev := loopDevice(t, fixtureSize)
	mustImport(t, "", Options{Source: &FileSource{Path: raw}, Format: FormatRaw, Target: dev})
	target, _ = mustImport(t, t.TempDir(), Options{Source: &FileSource{Path: dev}, Format: FormatRaw})
	sameDisk(t, raw, target)

	// A guest disk whose first sector looks like a qcow2 header is copied as it is.
	qcow := convertTo(t, raw, "qcow2")
	target, res := mustImport(t, t.TempDir(), Options{Source: &FileSource{Path: qcow}, Format: FormatRaw})
	if res.Format != string(FormatRaw) {
		t.Errorf("format %s, want raw", res.Format)
	}
	sameBytes(t, qcow, target)

	target, _, err := importTo(t, t.TempDir(), Options{Source: &FileSource{Path: "/nonexistent/disk.img"}, Format: FormatRaw})
	wantFailure(t, target, err, transfer.ReasonSourceNotFound, false, "does not exist")
}

func sameBytes(t *testing.T, a, b string) {
	t.Helper()
	x, _ := os.ReadFile(a)
	y, _ := os.ReadFile(b)
	if !bytes.Equal(x, y) {
		t.Errorf("%s and %s differ", a, b)
	}
}
