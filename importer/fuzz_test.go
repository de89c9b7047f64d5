package importer

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// fuzzCapacity keeps each fuzz input's work small: the fuzzer's instrumentation makes an
// import of several MiB take about a second, and an input still running when -fuzztime ends
// fails the run.
const fuzzCapacity = 1 << 20

// memSource is an in-memory source, with random access unless sequential.
type memSource struct {
	data       []byte
	sequential bool
}

func (m *memSource) String() string { return "memory" }
func (m *memSource) Open(context.Context) (Object, error) {
	return &memObject{data: m.data, random: !m.sequential}, nil
}

type memObject struct {
	data   []byte
	random bool
}

func (o *memObject) Size() int64        { return int64(len(o.data)) }
func (o *memObject) Identity() string   { return "" }
func (o *memObject) Revision() string   { return "" }
func (o *memObject) RandomAccess() bool { return o.random }
func (o *memObject) Close() error       { return nil }
func (o *memObject) ReadRange(_ context.Context, off, n int64) (io.ReadCloser, error) {
	end := int64(len(o.data))
	if n >= 0 {
		end = min(end, off+n)
	}
	return io.NopCloser(bytes.NewReader(o.data[off:end])), nil
}

// qcow2Seeds returns small real images made by qemu-img.
func qcow2Seeds(f *testing.F) [][]byte {
	dir := f.TempDir()
	raw := filepath.Join(dir, "seed.raw")
	data := bytes.Repeat([]byte("seed"), 16<<10) // 64 KiB
	if err := os.WriteFile(raw, data, 0o600); err != nil {
		f.Fatal(err)
	}
	var seeds [][]byte
	for _, opts := range [][]string{{"-o", "compat=0.10"}, {"-c"}, {"-o", "cluster_size=512"}} {
		out := filepath.Join(dir, "seed.qcow2")
		args := append([]string{"convert", "-f", "raw", "-O", "qcow2"}, opts...)
		cmdOut, err := qemuImgOutput(append(args, raw, out)...)
		if err != nil {
			f.Fatalf("qemu-img: %v\n%s", err, cmdOut)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, b)
	}
	return seeds
}

// FuzzSniff: detection never panics, and a compressed stream is never also an image.
func FuzzSniff(f *testing.F) {
	for _, s := range [][]byte{[]byte("QFI\xfb\x00\x00\x00\x03"), {0x1f, 0x8b}, []byte("vhdxfile"), []byte("conectix"), {}} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, head []byte) {
		if sniffCompression(head) != CompressionNone && sniffFormat(head) != FormatRaw {
			t.Errorf("%x is both compressed and an image", head[:min(8, len(head))])
		}
	})
}

// FuzzQcow2Header: the header check never panics, and what it accepts is consistent.
func FuzzQcow2Header(f *testing.F) {
	for _, s := range qcow2Seeds(f) {
		f.Add(s[:min(len(s), 4096)], int64(len(s)))
	}
	f.Fuzz(func(t *testing.T, head []byte, size int64) {
		h, err := parseQcow2Header(head, size)
		if err != nil {
			if transfer.ReasonOf(err) == transfer.ReasonInternal {
				t.Errorf("unclassified error: %v", err)
			}
			return
		}
		if h.Version != 2 && h.Version != 3 || h.ClusterBits < 9 || h.ClusterBits > 21 || h.CryptMethod != 0 || h.Size == 0 {
			t.Errorf("accepted an invalid header: %+v", h)
		}
	})
}

// FuzzImportQcow2 imports arbitrary bytes that start like a qcow2 image into a small target,
// read at random and as a stream: the importer must end with success or a classified error,
// never a panic or a hang.
func FuzzImportQcow2(f *testing.F) {
	for _, s := range qcow2Seeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 4 {
			return
		}
		data = append([]byte("QFI\xfb"), data[4:]...) // spend mutations past the magic
		fuzzImport(t, data)
	})
}

// fuzzImport imports data read at random and as a stream into a small target: the import
// must end with success or a classified error, never a panic or a hang.
func fuzzImport(t *testing.T, data []byte) {
	for _, sequential := range []bool{false, true} {
		target := filepath.Join(t.TempDir(), "disk.img")
		ctx, cancel := context.WithTimeout(t.Context(), 10e9)
		res, err := Import(ctx, Options{Source: &memSource{data: data, sequential: sequential}, Target: target, Capacity: fuzzCapacity, Retry: fastRetry})
		cancel()
		if err != nil && transfer.ReasonOf(err) == transfer.ReasonInternal {
			t.Errorf("sequential %v: unclassified error: %v", sequential, err)
		}
		if err == nil && res.VirtualSize > fuzzCapacity {
			t.Errorf("sequential %v: imported %d bytes into an 8 MiB volume", sequential, res.VirtualSize)
		}
	}
}

// FuzzImportMapped imports arbitrary bytes shaped like vmdk, vpc and vdi images.
func FuzzImportMapped(f *testing.F) {
	raw := seedRaw(f, 64<<10) // 256 KiB
	for _, args := range [][]string{{"-O", "vmdk"}, {"-O", "vmdk", "-o", "subformat=streamOptimized"}, {"-O", "vpc"}, {"-O", "vdi"}, {"-O", "vhdx"}} {
		f.Add(seedImage(f, raw, args...))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzImport(t, data) // streamOptimized vmdk streams too
	})
}

// FuzzOVF reads arbitrary OVF descriptors: a disk or a classified error, never a panic.
func FuzzOVF(f *testing.F) {
	f.Add([]byte(ovf([4]string{"vmdisk1", "disk1.vmdk", "10", ""}, [4]string{"vmdisk2", "disk2.vmdk.gz", "20", "gzip"})), "vmdisk2")
	f.Add([]byte(`<Envelope><References><File id="f" href="d"/></References><DiskSection><Disk diskId="x" fileRef="f" capacity="1" capacityAllocationUnits="byte * 2^62"/></DiskSection></Envelope>`), "")
	f.Fuzz(func(t *testing.T, descriptor []byte, name string) {
		var env ovfEnvelope
		if xml.Unmarshal(descriptor, &env) != nil {
			return
		}
		d, err := env.pick(name)
		if err != nil && transfer.ReasonOf(err) == transfer.ReasonInternal {
			t.Errorf("unclassified error: %v", err)
		}
		if err == nil && (d.capacity < 0 || d.file == "") {
			t.Errorf("picked %+v", d)
		}
	})
}

// fuzzTarget is a small file target for the stream converters.
func fuzzTarget(t *testing.T) *Target {
	tg, err := OpenTarget(filepath.Join(t.TempDir(), "disk.img"), fuzzCapacity, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tg.Wipe() })
	return tg
}

// classified fails t for an error no reason was given to (a panic fails it by itself).
func classified(t *testing.T, what string, err error) {
	if err != nil && transfer.ReasonOf(err) == transfer.ReasonInternal && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		t.Errorf("%s: unclassified error: %v", what, err)
	}
}

// seedRaw writes a raw disk of n repetitions of "seed" for a fuzz target's seeds.
func seedRaw(f *testing.F, n int) string {
	raw := filepath.Join(f.TempDir(), "seed.raw")
	if err := os.WriteFile(raw, bytes.Repeat([]byte("seed"), n), 0o600); err != nil {
		f.Fatal(err)
	}
	return raw
}

// seedImage converts raw with qemu-img and these options and returns the image's bytes.
func seedImage(f testing.TB, raw string, args ...string) []byte {
	f.Helper()
	out := filepath.Join(f.TempDir(), "seed.img")
	if b, err := qemuImgOutput(append(append([]string{"convert", "-f", "raw"}, args...), raw, out)...); err != nil {
		f.Fatalf("qemu-img: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// FuzzQcow2Stream converts arbitrary bytes shaped like a qcow2 image front to back: success
// or a classified error, never a panic, never past the target.
func FuzzQcow2Stream(f *testing.F) {
	for _, s := range qcow2Seeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 4 {
			return
		}
		data = append([]byte("QFI\xfb"), data[4:]...)
		_, err := importQcow2Stream(bytes.NewReader(data), data[:min(len(data), sniffLen)], fuzzTarget(t))
		classified(t, "qcow2 stream", err)
	})
}

// FuzzVMDKStream converts arbitrary bytes shaped like a streamOptimized vmdk front to back.
func FuzzVMDKStream(f *testing.F) {
	f.Add(seedImage(f, seedRaw(f, 64<<10), "-O", "vmdk", "-o", "subformat=streamOptimized"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := importVMDKStream(bytes.NewReader(data), fuzzTarget(t))
		classified(t, "vmdk stream", err)
	})
}

// FuzzOVA reads arbitrary tar streams as OVA appliances: a disk, or a classified error.
func FuzzOVA(f *testing.F) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range []struct{ name, body string }{
		{"vm.ovf", ovf([4]string{"vmdisk1", "disk1.raw", "65536", ""})},
		{"disk1.raw", strings.Repeat("disk", 16<<10)},
	} {
		_ = tw.WriteHeader(&tar.Header{Name: m.name, Mode: 0o644, Size: int64(len(m.body))})
		_, _ = tw.Write([]byte(m.body))
	}
	_ = tw.Close()
	f.Add(buf.Bytes(), "")
	f.Add(buf.Bytes(), "vmdisk1")
	f.Fuzz(func(t *testing.T, data []byte, disk string) {
		_, _, err := importOVA(bytes.NewReader(data), disk, fuzzTarget(t))
		classified(t, "ova", err)
	})
}

// FuzzXzGuard passes arbitrary bytes through the xz guard: it never panics, never changes a
// byte it passes on, and never passes on a block header it refused.
func FuzzXzGuard(f *testing.F) {
	raw := seedRaw(f, 16<<10)
	for _, opts := range [][]string{{"-1"}, {"-T2", "--block-size=16384"}, {"-C", "sha256"}} {
		b, err := exec.Command("xz", append([]string{"-c"}, append(opts, raw)...)...).Output()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := io.ReadAll(newXzGuard(bytes.NewReader(data)))
		if !bytes.HasPrefix(data, got) {
			t.Fatalf("the guard passed on bytes that are not the input's (%d bytes)", len(got))
		}
		if err == nil && !bytes.Equal(got, data) {
			t.Fatalf("the guard ended early without an error (%d of %d bytes)", len(got), len(data))
		}
	})
}
