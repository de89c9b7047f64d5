package importer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/diskpipe/diskpipe/internal/backup"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore/objectstoretest"
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
	// Each layer's cache is small; a block it let go is now and then fetched again.
	if res.BytesRead > held+held/10 {
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
		{"full in the middle", []ChainLayer{full, inc1, full, inc2}, transfer.ReasonBrokenChain, "layer 3 of 4 (full.qcow2) names no backing file, so it is a full backup"},
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

// index writes a backup index of c's layers into c.dir, checkpoints cp1 (the full) to cpN each
// the parent of the next, after edit has changed it; it returns the index's name.
func (c *backupChain) index(t *testing.T, name string, edit func(*backup.Index)) string {
	t.Helper()
	ix := backup.Index{Format: backup.Format, Disk: "default/vm-root"}
	for i, p := range c.layers {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		info, err := qemuImgOutput("info", "--output=json", "-U", p)
		if err != nil {
			t.Fatalf("qemu-img info: %v\n%s", err, info)
		}
		var vi struct {
			VirtualSize int64 `json:"virtual-size"`
		}
		if err := json.Unmarshal(info, &vi); err != nil {
			t.Fatal(err)
		}
		l := backup.Layer{Checkpoint: fmt.Sprintf("cp%d", i+1), Object: filepath.Base(p), Size: st.Size(),
			VirtualSize: vi.VirtualSize, SHA256: strings.TrimPrefix(sha256File(t, p), "sha256:")}
		if i > 0 {
			l.Parent = fmt.Sprintf("cp%d", i)
		}
		ix.Layers = append(ix.Layers, l)
	}
	if edit != nil {
		edit(&ix)
	}
	b, err := json.Marshal(ix)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.dir, name), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return name
}

// dirServer serves every file of dir by its name, each through a fileServer of its own.
type dirServer struct {
	dir   string
	files sync.Map // name → *fileServer
}

func (d *dirServer) file(name string) *fileServer {
	s, _ := d.files.LoadOrStore(name, &fileServer{path: filepath.Join(d.dir, name)})
	return s.(*fileServer)
}

func (d *dirServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimPrefix(r.URL.Path, "/")
	if strings.Contains(name, "/") {
		http.NotFound(w, r)
		return
	}
	if _, err := os.Stat(filepath.Join(d.dir, name)); err != nil {
		http.NotFound(w, r)
		return
	}
	d.file(name).ServeHTTP(w, r)
}

func serveDir(t *testing.T, dir string) (*dirServer, string) {
	t.Helper()
	d := &dirServer{dir: dir}
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close)
	return d, srv.URL + "/"
}

// indexed is the restore of point of the index name served at base.
func indexed(base, name, point string) *ChainIndex {
	return &ChainIndex{Source: &HTTPSource{URL: base + name}, Point: point, Layer: func(_, object string) (Source, error) {
		u, err := backup.ObjectURL(base+name, object)
		return &HTTPSource{URL: u}, err
	}}
}

// TestChainIndex restores points of a backup index — the newest, and one before it — each
// identical to qemu-img's disk of the layers up to it, every layer's digest verified; and
// refuses indexes that do not fit their objects, naming the checkpoint.
func TestChainIndex(t *testing.T) {
	c := newBackupChain(t, "cluster_size=65536")
	c.incremental("", "", "write -s RANDOM 1M 2M", "write -z 5M 1M")
	middle := c.want()
	c.incremental("", "", "write -s RANDOM 30M 3M", "discard 1M 64k")
	c.incremental("cluster_size=131072", "80M", "write -P 0x66 70M 1M")
	newest := c.want()
	_, base := serveDir(t, c.dir)
	name := c.index(t, "index.json", nil)

	for _, tc := range []struct{ point, want, revision string }{{"", newest, "cp4"}, {"cp2", middle, "cp2"}} {
		t.Run("point "+tc.revision, func(t *testing.T) {
			target, res := mustImport(t, t.TempDir(), Options{ChainIndex: indexed(base, name, tc.point)})
			sameDisk(t, tc.want, target)
			if res.Revision != tc.revision {
				t.Errorf("revision %q, want the checkpoint %q", res.Revision, tc.revision)
			}
		})
	}
	t.Run("index as the image", func(t *testing.T) {
		target, res := mustImport(t, t.TempDir(), Options{Source: &HTTPSource{URL: base + name}})
		sameDisk(t, newest, target)
		if res.Revision != "cp4" {
			t.Errorf("revision %q, want cp4", res.Revision)
		}
	})
	t.Run("index where the checksum pins an image", func(t *testing.T) {
		// A server answering an index where a pinned image was asked for is refused: the
		// layers it names would be checked only by the digests it chose.
		target, _, err := importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: base + name}, Checksum: "sha256:" + strings.Repeat("1", 64)})
		wantFailure(t, target, err, transfer.ReasonUnsupportedFormat, false, "is a backup index, not the image the checksum pins")
	})
	t.Run("index by a presigned URL", func(t *testing.T) {
		target, _, err := importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: base + name + "?X-Amz-Signature=abc&X-Amz-Expires=60"}})
		wantFailure(t, target, err, transfer.ReasonInvalidArgument, false, "the backup index was given by a presigned URL, which signs the index alone")
	})
	t.Run("probe", func(t *testing.T) {
		res, err := Probe(t.Context(), Options{ChainIndex: indexed(base, name, ""), Retry: fastRetry})
		if err != nil || res.VirtualSize != 80<<20 {
			t.Fatalf("probe: %v, virtual size %d, want %d", err, res.VirtualSize, 80<<20)
		}
	})

	for _, tc := range []struct {
		name   string
		edit   func(*backup.Index)
		point  string
		reason transfer.Reason
		msg    string
	}{
		{"unknown point", nil, "cp9", transfer.ReasonBrokenChain, `the backup index has no checkpoint "cp9" (its newest is "cp4")`},
		{"missing parent", func(ix *backup.Index) { ix.Layers = slices.Delete(ix.Layers, 1, 2) }, "", transfer.ReasonBrokenChain,
			`backup "cp3" holds the changes since checkpoint "cp2", which the backup index does not list`},
		{"parent listed after", func(ix *backup.Index) { ix.Layers[1], ix.Layers[2] = ix.Layers[2], ix.Layers[1] }, "cp3", transfer.ReasonBrokenChain,
			`backup "cp3" names checkpoint "cp2" as its parent, which the backup index lists after it`},
		{"loop", func(ix *backup.Index) { ix.Layers[0].Parent = "cp1" }, "", transfer.ReasonBrokenChain, `loops back to checkpoint "cp1"`},
		{"twice", func(ix *backup.Index) { ix.Layers[3].Checkpoint = "cp2" }, "", transfer.ReasonBrokenChain, `lists checkpoint "cp2" twice`},
		{"digest", func(ix *backup.Index) { ix.Layers[1].SHA256 = strings.Repeat("ab", 32) }, "", transfer.ReasonChecksumMismatch, "layer 2 of 4 (cp2)"},
		{"object size", func(ix *backup.Index) { ix.Layers[2].Size++ }, "", transfer.ReasonBrokenChain, "layer 3 of 4 (cp3): the chain's index says its object holds"},
		{"disk size", func(ix *backup.Index) { ix.Layers[3].VirtualSize = 1 << 50 }, "", transfer.ReasonBrokenChain, "layer 4 of 4 (cp4): the chain's index says its disk is 1125899906842624 bytes"},
		{"object outside", func(ix *backup.Index) { ix.Layers[0].Object = "../etc/passwd" }, "", transfer.ReasonBrokenChain, `whose object "../etc/passwd" is not a plain name`},
		{"absolute object", func(ix *backup.Index) { ix.Layers[0].Object = "http://169.254.169.254/latest" }, "", transfer.ReasonBrokenChain, "is not a plain name"},
		{"escaped object", func(ix *backup.Index) { ix.Layers[0].Object = "%2e%2e/x.qcow2" }, "", transfer.ReasonBrokenChain, "is not a plain name"},
		{"missing object", func(ix *backup.Index) { ix.Layers[1].Object = "gone.qcow2" }, "", transfer.ReasonSourceNotFound, "layer 2 of 4 (cp2)"},
		{"format", func(ix *backup.Index) { ix.Format = "other/v9" }, "", transfer.ReasonBrokenChain, `the backup index is of format "other/v9"`},
		{"no layers", func(ix *backup.Index) { ix.Layers = nil }, "", transfer.ReasonBrokenChain, "the backup index lists no backups"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := c.index(t, "bad-"+strings.ReplaceAll(tc.name, " ", "-")+".json", tc.edit)
			target, _, err := importTo(t, t.TempDir(), Options{ChainIndex: indexed(base, bad, tc.point)})
			wantFailure(t, target, err, tc.reason, false, tc.msg)
		})
	}
	t.Run("index too large", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(c.dir, "huge.json"), bytes.Repeat([]byte(" "), backup.MaxIndexBytes+1), 0o600); err != nil {
			t.Fatal(err)
		}
		target, _, err := importTo(t, t.TempDir(), Options{ChainIndex: indexed(base, "huge.json", "")})
		wantFailure(t, target, err, transfer.ReasonBrokenChain, false, "more than the 4194304 an index may be")
	})
}

// TestChainResumeAfterKill: a restore of a backup index through the importer command, killed
// part-way through its full backup, goes on in the next process from its checkpoint, hashes
// included. The full is read twice, by the converter and by its hasher: the next process
// reads at most what the first did not, plus a checkpoint's worth.
func TestChainResumeAfterKill(t *testing.T) {
	c := &backupChain{t: t, dir: t.TempDir()}
	raw := makeBigRaw(t, c.dir, 5)
	full := filepath.Join(c.dir, "full.qcow2")
	runTool(t, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, full)
	c.layers, c.random = []string{full}, raw
	c.incremental("", "", "write -P 0x31 100M 8M", "write -z 300M 16M")
	c.incremental("", "", "write -P 0x32 1G 8M")
	want := c.want()
	d, base := serveDir(t, c.dir)
	name := c.index(t, "index.json", nil)
	srv := d.file("full.qcow2")
	size := fileSizeOf(t, full)
	target := filepath.Join(t.TempDir(), "disk.img")
	args := []string{"--source", "http", "--chain-index", base + name, "--target", target, "--capacity", strconv.FormatInt(5<<30, 10)}

	cmd, out := startImporterArgs(t, args...)
	ended := make(chan error, 1)
	go func() { ended <- cmd.Wait() }()
	for deadline := time.Now().Add(2 * time.Minute); srv.sent.Load() < size/2; time.Sleep(time.Millisecond) {
		select {
		case err := <-ended:
			t.Fatalf("the importer ended (%v) before half the full backup:\n%s", err, out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the importer did not reach half the full backup:\n%s", out)
		}
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	if err := <-ended; err == nil {
		t.Fatal("the importer finished before it was killed")
	}
	first := srv.sent.Load()
	if _, err := os.Stat(target + ".checkpoint"); err != nil {
		t.Fatalf("no checkpoint after %d of %d bytes: %v\n%s", first, size, err, out)
	}
	srv.sent.Store(0)
	cmd, out = startImporterArgs(t, args...)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the resumed importer failed: %v\n%s", err, out)
	}
	second := srv.sent.Load()
	slack, rest := int64(2*resumeEvery+32<<20), 2*size-first
	t.Logf("killed after %d bytes of the full's %d (read twice); the next importer read %d of it (at most %d allowed)", first, size, second, rest+slack)
	if !strings.Contains(out.String(), "Resuming the import") {
		t.Errorf("the next importer did not resume:\n%s", out)
	}
	if second > rest+slack {
		t.Errorf("the next importer read %d bytes of the full; the rest was %d", second, rest)
	}
	sameDisk(t, want, target)
}

// TestChainS3: a chain kept in the bundled store (uploaded with awscli) restored through its
// index by the importer command, as an s3 source names it: by --chain-index, and by naming the
// index as the image itself (what a CDI DataVolume's s3 source does).
func TestChainS3(t *testing.T) {
	c := newBackupChain(t, "cluster_size=65536")
	c.incremental("", "", "write -s RANDOM 1M 2M", "write -z 5M 1M")
	c.incremental("cluster_size=262144", "72M", "write -s RANDOM 66M 3M", "discard 17M 1M")
	want := c.want()
	name := c.index(t, "index.json", nil)
	s := objectstoretest.Start(t)
	if out, err := s.AWS(t.Context(), s.SecretKey, "s3", "mb", "s3://backups"); err != nil {
		t.Fatalf("aws s3 mb: %v\n%s", err, out)
	}
	for _, f := range append([]string{name}, c.layers...) {
		if out, err := s.AWS(t.Context(), s.SecretKey, "s3", "cp", "--only-show-errors", filepath.Join(c.dir, filepath.Base(f)), "s3://backups/vm-root/"+filepath.Base(f)); err != nil {
			t.Fatalf("aws s3 cp: %v\n%s", err, out)
		}
	}
	store := s.ClientConfig()
	for _, tc := range []struct {
		name string
		o    Options
	}{
		{"index", Options{ChainIndex: &ChainIndex{Source: &S3Source{Config: store, Bucket: "backups", Object: "vm-root/index.json"}}}},
		{"index as the image", Options{Source: &S3Source{Config: store, Bucket: "backups", Object: "vm-root/index.json"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target, res := mustImport(t, t.TempDir(), tc.o)
			sameDisk(t, want, target)
			if res.Revision != "cp3" || res.VirtualSize != 72<<20 {
				t.Errorf("revision %q, virtual size %d; want cp3 and %d", res.Revision, res.VirtualSize, 72<<20)
			}
		})
	}
}
