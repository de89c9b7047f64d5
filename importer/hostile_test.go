package importer

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// TestHostileImages imports seeded mutations of real images of every format — bytes flipped
// in their headers and tables, files cut short — at random and as a stream. Each import must
// end, within its time limit, in success or a classified error: no panic, no hang, no
// unbounded allocation. (The fuzz targets explore further; this runs in every test pass.)
func TestHostileImages(t *testing.T) {
	dir := t.TempDir()
	raw := filepath.Join(dir, "seed.raw")
	seed := make([]byte, 2<<20)
	for i := range seed {
		seed[i] = byte(i * 7)
	}
	writeFile(t, raw, seed)
	var images [][]byte
	for _, args := range [][]string{
		{"-O", "qcow2"}, {"-O", "qcow2", "-c"}, {"-O", "qcow2", "-o", "compat=0.10,cluster_size=4096"},
		{"-O", "vmdk"}, {"-O", "vmdk", "-o", "subformat=streamOptimized"}, {"-O", "vpc"}, {"-O", "vdi"}, {"-O", "vhdx"},
	} {
		images = append(images, seedImage(t, raw, args...))
	}
	rng := rand.New(rand.NewPCG(11, 12))
	outcomes := map[transfer.Reason]int{}
	defer func() { t.Logf("outcomes of 600 imports: %v", outcomes) }()
	for i := 0; i < 300; i++ {
		img := images[i%len(images)]
		data := append([]byte(nil), img...)
		if i%5 == 4 {
			data = data[:rng.IntN(len(data))]
		} else {
			for range 1 + rng.IntN(8) {
				at := rng.IntN(min(len(data), 128<<10)) // headers and tables
				data[at] = byte(rng.Uint32())
			}
		}
		for _, sequential := range []bool{false, true} {
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			start := time.Now()
			res, err := Import(ctx, Options{Source: &memSource{data: data, sequential: sequential},
				Target: filepath.Join(t.TempDir(), "disk.img"), Capacity: 8 << 20, Retry: fastRetry})
			cancel()
			if err == nil {
				outcomes["Succeeded"]++
			} else {
				outcomes[transfer.ReasonOf(err)]++
			}
			switch {
			case time.Since(start) > 10*time.Second:
				t.Errorf("mutation %d (sequential %v) took %v", i, sequential, time.Since(start))
			case err != nil && transfer.ReasonOf(err) == transfer.ReasonInternal:
				t.Errorf("mutation %d (sequential %v): unclassified error: %v", i, sequential, err)
			case err == nil && res.VirtualSize > 8<<20:
				t.Errorf("mutation %d: imported %d bytes into an 8 MiB volume", i, res.VirtualSize)
			}
		}
	}
}

// TestCraftedOffsets imports images whose header or table fields were set to values that
// wrap, go negative or point past the file when the reader does arithmetic on them: each is
// refused with its reason, at random and as a stream, never a panic and never a disk of
// zeros called a success.
func TestCraftedOffsets(t *testing.T) {
	dir := t.TempDir()
	raw := filepath.Join(dir, "seed.raw")
	seed := make([]byte, 1<<20+512) // a last grain that is not whole
	for i := range seed {
		seed[i] = byte(i*7 + 1)
	}
	writeFile(t, raw, seed)
	image := func(args ...string) []byte { return seedImage(t, raw, args...) }
	be, le := binary.BigEndian, binary.LittleEndian
	qcow2, vmdk, stream := image("-O", "qcow2"), image("-O", "vmdk"), image("-O", "vmdk", "-o", "subformat=streamOptimized")
	vpc, vdi, vhdx := image("-O", "vpc"), image("-O", "vdi"), image("-O", "vhdx")
	patched := func(img []byte, patch func(b []byte)) []byte {
		b := append([]byte(nil), img...)
		patch(b)
		return b
	}
	cases := []struct {
		name string
		data []byte
		want []transfer.Reason // the reasons either reader may give
	}{
		{"qcow2 backing file offset wraps", patched(qcow2, func(b []byte) {
			be.PutUint64(b[8:], 0xfffffffffffffffe)
			be.PutUint32(b[16:], 15)
		}), []transfer.Reason{transfer.ReasonBackingFile}},
		{"qcow2 L1 table offset wraps", patched(qcow2, func(b []byte) { be.PutUint64(b[40:], 0xffffffffffff0000) }),
			[]transfer.Reason{transfer.ReasonMalformedImage}},
		{"qcow2 L1 table past the end", patched(qcow2, func(b []byte) { be.PutUint64(b[40:], 1<<40) }),
			[]transfer.Reason{transfer.ReasonTruncatedImage}},
		{"vmdk descriptor offset negative", patched(vmdk, func(b []byte) { le.PutUint64(b[28:], ^uint64(0)) }),
			[]transfer.Reason{transfer.ReasonMalformedImage}},
		{"streamOptimized vmdk descriptor offset wraps", patched(stream, func(b []byte) {
			le.PutUint64(b[28:], 1<<54)
			le.PutUint64(b[36:], 1)
		}), []transfer.Reason{transfer.ReasonMalformedImage}},
		// qemu reads this one (the last grain's table is the first one's grains): so must diskpipe,
		// the same bytes.
		{"vmdk grain directory rounded down", patched(vmdk, func(b []byte) { le.PutUint32(b[44:], 1) }), nil},
		{"vpc dynamic header offset wraps", patched(vpc, func(b []byte) { be.PutUint64(b[len(b)-512+16:], 1<<63-100) }),
			[]transfer.Reason{transfer.ReasonMalformedImage}},
		{"vdi extra bytes per block", patched(vdi, func(b []byte) { le.PutUint32(b[0x17c:], 0xfffffe00) }),
			[]transfer.Reason{transfer.ReasonUnsupportedFormat}},
		{"vdi block stored past the blocks", patched(vdi, func(b []byte) {
			le.PutUint32(b[le.Uint32(b[0x154:]):], 0x80000000)
		}), []transfer.Reason{transfer.ReasonMalformedImage}},
		{"vhdx block at a negative offset", patched(vhdx, func(b []byte) {
			le.PutUint64(b[vhdxBAT(t, b):], 0x8000000000000006)
		}), []transfer.Reason{transfer.ReasonTruncatedImage}},
	}
	for _, c := range cases {
		for _, sequential := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/sequential=%v", c.name, sequential), func(t *testing.T) {
				target := filepath.Join(t.TempDir(), "disk.img")
				res, err := Import(t.Context(), Options{Source: &memSource{data: c.data, sequential: sequential},
					Target: target, Capacity: 8 << 20, Retry: fastRetry})
				// A stream of a format read only at random is refused for that first.
				if sequential && transfer.ReasonOf(err) == transfer.ReasonNeedsRandomAccess {
					return
				}
				if c.want == nil {
					if err != nil {
						t.Fatalf("qemu-img reads the image, diskpipe refused it: %v", err)
					}
					sameAsQemu(t, c.data, target, res.VirtualSize)
					return
				}
				if err == nil {
					t.Fatal("imported")
				}
				got := transfer.ReasonOf(err)
				if !slices.Contains(c.want, got) {
					t.Fatalf("reason %s, want one of %v: %v", got, c.want, err)
				}
				t.Logf("%s: %v", got, err)
			})
		}
	}
}

// sameAsQemu checks that the first size bytes of the disk diskpipe wrote are what qemu-img
// converts the image to.
func sameAsQemu(t *testing.T, img []byte, disk string, size int64) {
	t.Helper()
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.img"), filepath.Join(dir, "out.raw")
	writeFile(t, in, img)
	if b, err := qemuImgOutput("convert", "-O", "raw", in, out); err != nil {
		t.Fatalf("qemu-img: %v\n%s", err, b)
	}
	want, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(want)) != size || int64(len(got)) < size || !bytes.Equal(got[:size], want) {
		t.Fatalf("the disk (%d bytes, virtual size %d) differs from qemu-img's conversion (%d bytes)", len(got), size, len(want))
	}
}

// vhdxBAT is the file offset of a vhdx image's block allocation table, from its region table.
func vhdxBAT(t *testing.T, b []byte) int {
	t.Helper()
	batGUID := []byte{0x66, 0x77, 0xc2, 0x2d, 0x23, 0xf6, 0x00, 0x42, 0x9d, 0x64, 0x11, 0x5e, 0x9b, 0xfd, 0x4a, 0x08}
	table := b[192<<10:]
	for i := range int(binary.LittleEndian.Uint32(table[8:])) {
		e := table[16+32*i:]
		if bytes.Equal(e[:16], batGUID) {
			return int(binary.LittleEndian.Uint64(e[16:])) //nolint:gosec // qemu-img's own image
		}
	}
	t.Fatal("no BAT region in the vhdx image")
	return 0
}

// TestCheckpointNumbers: a checkpoint lies on a volume a VM may write, so a sealed one whose
// numbers are out of range is not resumed from.
func TestCheckpointNumbers(t *testing.T) {
	for _, c := range []struct {
		hashed, done int64
		want         bool
	}{{0, 50, true}, {80, 50, true}, {100, 100, true}, {-1, 50, false}, {101, 50, false}, {0, 0, false}, {0, 101, false}} {
		cp := &checkpoint{Source: "s", Identity: "i", Format: "raw", VirtualSize: 100, Done: c.done, Hashed: c.hashed}
		if got := cp.matches("s", "i", "raw", 100, 100); got != c.want {
			t.Errorf("hashed %d, done %d: matches %v, want %v", c.hashed, c.done, got, c.want)
		}
	}
}

// TestNegativeOffsets: the cache every random-access import reads through, and the target
// every import writes, refuse an offset before the start, whoever computed it.
func TestNegativeOffsets(t *testing.T) {
	src := bytes.NewReader(make([]byte, 4<<20))
	c := newBlockCache(src, 4<<20, 1<<20, 4, 2, 1)
	if _, err := c.ReadAt(make([]byte, 512), -512); transfer.ReasonOf(err) != transfer.ReasonMalformedImage {
		t.Errorf("cache: %v", err)
	}
	target := fuzzTarget(t)
	if _, err := target.WriteAt(make([]byte, 512), -512); transfer.ReasonOf(err) != transfer.ReasonMalformedImage {
		t.Errorf("target: %v", err)
	}
}
