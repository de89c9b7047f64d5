package importer

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// backupChain builds a backup chain the way qemu makes one: a full qcow2 of makeRaw's disk,
// then incrementals made with 'qemu-img create -b' and written with qemu-io. It returns the
// layers' paths, full first, and the disk they make: qemu-img convert of the newest, which
// follows the backing files (the oracle).
type backupChain struct {
	t      *testing.T
	dir    string
	layers []string
	random string // a file of random bytes, for qemu-io write -s
}

func newBackupChain(t *testing.T, fullOpts string) *backupChain {
	t.Helper()
	c := &backupChain{t: t, dir: t.TempDir()}
	raw := makeRaw(t, c.dir)
	full := filepath.Join(c.dir, "full.qcow2")
	runTool(t, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", "-o", fullOpts, raw, full)
	c.layers = []string{full}
	c.random = filepath.Join(c.dir, "random")
	rng := rand.New(rand.NewPCG(7, 8))
	b := make([]byte, 4<<20)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	if err := os.WriteFile(c.random, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return c
}

// incremental adds a layer over the newest with qemu-img create's options (cluster_size,
// a larger size) and runs the qemu-io commands in it.
func (c *backupChain) incremental(opts, size string, commands ...string) {
	c.t.Helper()
	p := filepath.Join(c.dir, fmt.Sprintf("inc%d.qcow2", len(c.layers)))
	args := []string{"create", "-q", "-f", "qcow2", "-b", filepath.Base(c.layers[len(c.layers)-1]), "-F", "qcow2"}
	if opts != "" {
		args = append(args, "-o", opts)
	}
	args = append(args, p)
	if size != "" {
		args = append(args, size)
	}
	cmd := append([]string{}, args...)
	runToolIn(c.t, c.dir, "qemu-img", cmd...)
	io := []string{"-f", "qcow2"}
	for _, command := range commands {
		io = append(io, "-c", strings.ReplaceAll(command, "RANDOM", c.random))
	}
	runToolIn(c.t, c.dir, "qemu-io", append(io, p)...)
	c.layers = append(c.layers, p)
}

// want is the chain's disk as qemu-img converts it.
func (c *backupChain) want() string {
	c.t.Helper()
	out := filepath.Join(c.dir, fmt.Sprintf("want-%d.raw", len(c.layers)))
	runToolIn(c.t, c.dir, "qemu-img", "convert", "-O", "raw", c.layers[len(c.layers)-1], out)
	return out
}

// served is the chain as layers an HTTP server with Range serves.
func (c *backupChain) served(t *testing.T) []ChainLayer {
	t.Helper()
	var layers []ChainLayer
	for _, p := range c.layers {
		layers = append(layers, ChainLayer{Source: &HTTPSource{URL: serve(t, &fileServer{path: p})}, Name: filepath.Base(p)})
	}
	return layers
}

func runToolIn(t *testing.T, dir, name string, args ...string) {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	// qemu resolves relative backing names against the image's directory, but qemu-io's
	// own paths against the working one: run both from the chain's.
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	defer os.Chdir(wd) //nolint:errcheck
	runTool(t, name, args...)
}

// TestChain restores chains of 3 to 10 layers — partial-cluster writes, zero clusters,
// discards, compressed clusters, different cluster sizes, a disk grown between backups —
// each served over HTTP with Range, and compares the disk with qemu-img convert of the same
// chain. The disk is written once, sparse: no more bytes than the layers hold.
func TestChain(t *testing.T) {
	t.Run("three layers", func(t *testing.T) {
		c := newBackupChain(t, "cluster_size=65536")
		c.incremental("", "",
			"write -s RANDOM 100000 200000", // inside clusters: qemu copies the rest up from the full
			"write -z 5M 1M",                // zero clusters over the full's text
			"write -P 0x5a 40M 4k")
		c.incremental("", "",
			"discard 17M 2M", // discarded over a backing file: zeros, not the full's bytes
			"write -P 0x11 100000 10",
			"write -s RANDOM 60M 1M")
		checkChain(t, c)
	})
	t.Run("ten layers, mixed clusters, compressed, grown", func(t *testing.T) {
		c := newBackupChain(t, "cluster_size=65536,compression_type=zlib")
		clusters := []string{"16384", "1048576", "65536", "2097152", "4096", "524288", "65536", "32768", "131072"}
		for i, cs := range clusters {
			size, commands := "", []string{
				fmt.Sprintf("write -P 0x%02x %d %d", 0x20+i, int64(i)*3<<20+int64(i)*777, 300000),
				fmt.Sprintf("write -s RANDOM %dM 512k", 8+i*5),
				fmt.Sprintf("write -z %dM 256k", 1+i*6),
			}
			if i == 1 || i == 3 || i == 6 { // compressed clusters (whole ones, as qemu writes them)
				commands = append(commands, fmt.Sprintf("write -c -P 0x%02x %dM %s", 0x70+i, 20+2*i, cs))
			}
			if i == 5 { // the disk grows: the backup after it holds data past the old end
				size = "96M"
			}
			if i >= 6 {
				commands = append(commands, fmt.Sprintf("write -s RANDOM %dM 1M", 80+i))
			}
			c.incremental("cluster_size="+cs, size, commands...)
		}
		checkChain(t, c)
	})
	t.Run("block device", func(t *testing.T) {
		c := newBackupChain(t, "cluster_size=65536")
		c.incremental("", "", "write -s RANDOM 3M 3M", "write -z 0 64k")
		c.incremental("cluster_size=131072", "", "discard 40M 1M", "write -P 0x77 63M 512k")
		dev := loopDevice(t, 80<<20)
		_, res := mustImport(t, "", Options{Chain: c.served(t), Target: dev})
		sameDisk(t, c.want(), dev)
		if res.VirtualSize != fixtureSize {
			t.Errorf("virtual size %d, want %d", res.VirtualSize, fixtureSize)
		}
	})
}

// checkChain restores c and compares it with qemu-img's disk of it.
func checkChain(t *testing.T, c *backupChain) {
	t.Helper()
	want := c.want()
	target, res := mustImport(t, t.TempDir(), Options{Chain: c.served(t)})
	sameDisk(t, want, target)
	st, err := os.Stat(want)
	if err != nil {
		t.Fatal(err)
	}
	if res.VirtualSize != st.Size() {
		t.Errorf("virtual size %d, want %d", res.VirtualSize, st.Size())
	}
	var held int64
	for _, p := range c.layers {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		held += st.Size()
	}
	if res.BytesWritten > held || allocated(t, target) > held+1<<20 {
		t.Errorf("wrote %d bytes (%d allocated) for a chain holding %d", res.BytesWritten, allocated(t, target), held)
	}
	if res.BytesRead > held {
		t.Errorf("read %d bytes of a chain of %d", res.BytesRead, held)
	}
	t.Logf("%d layers, disk %d bytes: read %d, wrote %d, chain %d", len(c.layers), res.VirtualSize, res.BytesRead, res.BytesWritten, held)
}

// TestChainBackingNeverOpened: an incremental names a backing file (KubeVirt's name the VM's
// overlay path). diskpipe never opens it: here it is a FIFO, which an open would block on
// forever, and /etc/hostname, whose bytes must not appear in the disk.
func TestChainBackingNeverOpened(t *testing.T) {
	c := newBackupChain(t, "cluster_size=65536")
	c.incremental("", "", "write -s RANDOM 1M 2M")
	c.incremental("", "", "write -P 0x42 30M 1M")
	want := c.want()
	fifo := filepath.Join(c.dir, "overlay.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	runToolIn(t, c.dir, "qemu-img", "rebase", "-u", "-f", "qcow2", "-b", fifo, "-F", "raw", c.layers[1])
	runToolIn(t, c.dir, "qemu-img", "rebase", "-u", "-f", "qcow2", "-b", "/etc/hostname", "-F", "raw", c.layers[2])
	target, _ := mustImport(t, t.TempDir(), Options{Chain: c.served(t)})
	sameDisk(t, want, target)
	// A reader still waiting on the FIFO would let a writer open it.
	f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err == nil {
		f.Close()
		t.Fatal("something opened the FIFO a layer names as its backing file")
	}
	if !errors.Is(err, syscall.ENXIO) {
		t.Fatalf("opening the FIFO to write: %v, want ENXIO (no reader)", err)
	}
}

// TestChainRefused: chains that do not fit together are refused, the disk left empty, with a
// reason that names the layer.
func TestChainRefused(t *testing.T) {
	c := newBackupChain(t, "cluster_size=65536")
	c.incremental("", "", "write -s RANDOM 1M 1M")
	c.incremental("", "", "write -P 0x42 30M 1M")
	dir := c.dir
	layer := func(p string) ChainLayer {
		return ChainLayer{Source: &HTTPSource{URL: serve(t, &fileServer{path: p})}, Name: filepath.Base(p)}
	}
	made := func(name, size string, args ...string) string {
		p := filepath.Join(dir, name)
		args = append(append([]string{"create", "-q", "-f", "qcow2"}, args...), p)
		if size != "" {
			args = append(args, size)
		}
		runToolIn(t, dir, "qemu-img", args...)
		return p
	}
	extL2 := made("extl2.qcow2", "", "-b", "inc1.qcow2", "-F", "qcow2", "-o", "extended_l2=on,cluster_size=131072")
	dataFile := made("datafile.qcow2", "64M", "-o", "data_file="+filepath.Join(dir, "data.raw"))
	huge := made("huge.qcow2", "1P", "-b", "inc2.qcow2", "-F", "qcow2")
	small := made("small.qcow2", "32M", "-b", "inc2.qcow2", "-F", "qcow2")
	raw := filepath.Join(dir, "disk.raw")
	missing := &HTTPSource{URL: serve(t, &fileServer{path: filepath.Join(dir, "gone.qcow2"), status: 404})}
	full, inc1, inc2 := layer(c.layers[0]), layer(c.layers[1]), layer(c.layers[2])
	bad := inc1
	bad.Checksum = "sha256:" + strings.Repeat("0", 64)
	good := full
	good.Checksum = sha256File(t, c.layers[0])
	for _, tc := range []struct {
		name   string
		chain  []ChainLayer
		reason transfer.Reason
		msg    string
	}{
		{"incremental first", []ChainLayer{inc1, inc2}, transfer.ReasonBackingFile, `layer 1 of 2 (inc1.qcow2) names a backing file "full.qcow2": a chain starts with a full backup`},
		{"missing layer", []ChainLayer{full, {Source: missing, Name: "cp2"}, inc2}, transfer.ReasonSourceNotFound, "layer 2 of 3 (cp2)"},
		{"checksum of a layer", []ChainLayer{good, bad, inc2}, transfer.ReasonChecksumMismatch, "layer 2 of 3 (inc1.qcow2)"},
		{"raw layer", []ChainLayer{full, layer(raw)}, transfer.ReasonUnsupportedFormat, "layer 2 of 2 (disk.raw) is raw, not qcow2"},
		{"external data file", []ChainLayer{layer(dataFile)}, transfer.ReasonUnsupportedFormat, "layer 1 of 1 (datafile.qcow2): the qcow2 image keeps its data in an external data file"},
		{"subclusters", []ChainLayer{full, inc1, layer(extL2)}, transfer.ReasonUnsupportedFormat, "layer 3 of 3 (extl2.qcow2) has subclusters"},
		{"out of order by size", []ChainLayer{full, inc1, inc2, layer(small), inc2}, transfer.ReasonBrokenChain, "layer 4 of 5 (small.qcow2) has a disk of 33554432 bytes, smaller than layer 3 of 5 (inc2.qcow2)'s 67108864: the layers are out of order"},
		{"index disagrees on size", []ChainLayer{full, {Source: inc1.Source, Name: "cp1", Size: 12345}}, transfer.ReasonBrokenChain, "layer 2 of 2 (cp1): the chain's index says its object holds 12345 bytes"},
		{"index disagrees on disk", []ChainLayer{full, {Source: inc1.Source, Name: "cp1", VirtualSize: 1 << 30}}, transfer.ReasonBrokenChain, "layer 2 of 2 (cp1): the chain's index says its disk is 1073741824 bytes, and its header says 67108864"},
		{"petabytes", []ChainLayer{full, inc1, inc2, layer(huge)}, transfer.ReasonTooLarge, ""},
		{"too many layers", make([]ChainLayer, MaxChainLayers+1), transfer.ReasonInvalidArgument, "the chain has 65 layers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target, _, err := importTo(t, t.TempDir(), Options{Chain: tc.chain})
			wantFailure(t, target, err, tc.reason, false, tc.msg)
		})
	}
}
