package importer

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// xzFile compresses raw with the real xz and these options.
func xzFile(t *testing.T, raw string, opts ...string) []byte {
	t.Helper()
	out, err := exec.Command("xz", append([]string{"-c"}, append(opts, raw)...)...).Output()
	if err != nil {
		t.Fatalf("xz %v: %v", opts, err)
	}
	return out
}

// The guard passes every layout the real xz writes through unchanged, byte for byte, and the
// import of each is the disk.
func TestXzGuardPassesRealStreams(t *testing.T) {
	dir := t.TempDir()
	raw := makeRaw(t, dir)
	one := xzFile(t, raw, "-1")
	cases := map[string][]byte{
		"preset 1":                                  one,
		"preset 9 (64 MiB dictionary)":              xzFile(t, raw, "-9"),
		"blocks of 256 KiB, sizes in their headers": xzFile(t, raw, "-T2", "--block-size=262144"),
		"x86 filter before LZMA2":                   xzFile(t, raw, "--x86", "--lzma2=preset=1"),
		"no check":                                  xzFile(t, raw, "-1", "-C", "none"),
		"sha256 check":                              xzFile(t, raw, "-1", "-C", "sha256"),
		"two streams with padding":                  append(append(append([]byte{}, one...), 0, 0, 0, 0), one...),
	}
	want, err := os.ReadFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := io.ReadAll(newXzGuard(bytes.NewReader(data)))
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("the guard changed the stream (err %v, %d of %d bytes)", err, len(got), len(data))
			}
			if name == "two streams with padding" || (strings.HasPrefix(name, "x86") && xzDecoder != "liblzma") {
				return // the disk would be the image twice (TestXzDecoder reads it); Go's decoder reads no BCJ filter
			}
			target, _ := mustImport(t, t.TempDir(), Options{Source: &memSource{data: data, sequential: true}})
			b, err := os.ReadFile(target)
			if err != nil || !bytes.Equal(b[:len(want)], want) {
				t.Fatal("the imported disk differs from the image")
			}
		})
	}
}

// The decoder gives back every layout the real xz writes, a threaded xz's blocks (decoded on
// several threads by liblzma) and concatenated streams included; an import refuses a stream
// whose compressed data, check or end is damaged, with a reason, and leaves no disk.
func TestXzDecoder(t *testing.T) {
	dir := t.TempDir()
	raw := makeRaw(t, dir)
	want, err := os.ReadFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	decode := func(data []byte) ([]byte, error) {
		d, err := decompress(CompressionXz, bytes.NewReader(data))
		if err != nil {
			return nil, err
		}
		defer d.Close()
		return io.ReadAll(d)
	}
	one := xzFile(t, raw, "-1")
	threaded := xzFile(t, raw, "-T2", "--block-size=1048576")
	cases := map[string]struct {
		data []byte
		want []byte
	}{
		"one block":             {one, want},
		"blocks of 1 MiB":       {threaded, want},
		"sha256 check":          {xzFile(t, raw, "-1", "-C", "sha256"), want},
		"two streams, padding":  {append(append(append([]byte{}, one...), 0, 0, 0, 0), threaded...), append(append([]byte{}, want...), want...)},
		"an empty stream first": {append(xzFile(t, "/dev/null"), one...), want},
	}
	if xzDecoder == "liblzma" {
		cases["x86 filter before LZMA2"] = struct{ data, want []byte }{xzFile(t, raw, "--x86", "--lzma2=preset=1"), want}
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := decode(c.data)
			if err != nil || !bytes.Equal(got, c.want) {
				t.Fatalf("decoded %d of %d bytes, differing (err %v)", len(got), len(c.want), err)
			}
		})
	}
	damaged := bytes.Clone(threaded)
	damaged[len(damaged)/2] ^= 0x40
	badCheck := bytes.Clone(one)
	// The stream's footer is 12 bytes, the index before it; the block's CRC64 check (8
	// bytes) ends just before the index.
	idx := bytes.LastIndex(badCheck[:len(badCheck)-12], []byte{0x00, 0x01})
	if idx < 8 {
		t.Fatal("no index in the stream")
	}
	badCheck[idx-1] ^= 0xff
	for _, c := range []struct {
		name string
		data []byte
	}{
		{"a byte of a block changed", damaged},
		{"the block's check changed", badCheck},
		{"cut in a block", threaded[:len(threaded)/3]},
		{"cut before its index", one[:len(one)-30]},
		{"garbage after the stream", append(bytes.Clone(one), []byte("not another xz stream")...)},
	} {
		t.Run(c.name, func(t *testing.T) {
			target, _, err := importTo(t, t.TempDir(), Options{Source: &memSource{data: c.data, sequential: true}})
			wantFailure(t, target, err, transfer.ReasonMalformedImage, false, "xz stream")
			t.Logf("%s: %v", c.name, err)
		})
	}
}

// hugeDictXz is raw compressed by xz with its first block header declaring a 3 GiB
// dictionary, the header's CRC32 made good.
func hugeDictXz(t *testing.T, raw string) []byte {
	t.Helper()
	data := xzFile(t, raw, "-1")
	h := data[12:]
	size := (int(h[0]) + 1) * 4
	i := bytes.Index(h[:size], []byte{0x21, 0x01})
	if i < 0 {
		t.Fatal("no LZMA2 filter in the first block header")
	}
	h[i+2] = 39 // 3 GiB
	binary.LittleEndian.PutUint32(h[size-4:], crc32.ChecksumIEEE(h[:size-4]))
	return data
}

// zstdStream is raw compressed by zstd from a pipe: no content size, so the frame has a window
// descriptor (byte 5) to change.
func zstdStream(t *testing.T, raw string) []byte {
	t.Helper()
	cmd := exec.Command("zstd", "-1", "-c", "--no-check")
	f, err := os.Open(raw)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd.Stdin = f
	data, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if data[4]&0x20 != 0 {
		t.Fatal("the frame is single-segment: no window descriptor to change")
	}
	return data
}

// zstdWindow512MiB is the window descriptor of a 2^29-byte window.
const zstdWindow512MiB = (29 - 10) << 3

// A block declaring a 3 GiB dictionary is refused before the decoder allocates it, with the
// size it claimed.
func TestXzGuardRefusesHugeDictionary(t *testing.T) {
	data := hugeDictXz(t, makeRaw(t, t.TempDir()))
	_, _, err := importTo(t, t.TempDir(), Options{Source: &memSource{data: data, sequential: true}})
	if transfer.ReasonOf(err) != transfer.ReasonMalformedImage || !strings.Contains(err.Error(), "3072 MiB dictionary") {
		t.Fatalf("reason %s: %v", transfer.ReasonOf(err), err)
	}
	if _, err := os.Stat(filepath.Join(t.TempDir(), "disk.img")); err == nil {
		t.Error("a disk was left")
	}
}

// A zstd frame declaring a 512 MiB window is refused with a reason that says so, where the
// decoder would have allocated it.
func TestZstdWindowBounded(t *testing.T) {
	data := zstdStream(t, makeRaw(t, t.TempDir()))
	if _, _, err := importTo(t, t.TempDir(), Options{Source: &memSource{data: bytes.Clone(data), sequential: true}}); err != nil {
		t.Fatalf("the unchanged frame: %v", err)
	}
	data[5] = zstdWindow512MiB
	_, _, err := importTo(t, t.TempDir(), Options{Source: &memSource{data: data, sequential: true}})
	if transfer.ReasonOf(err) != transfer.ReasonMalformedImage || !strings.Contains(err.Error(), "window larger than the 128 MiB") {
		t.Fatalf("reason %s: %v", transfer.ReasonOf(err), err)
	}
}
