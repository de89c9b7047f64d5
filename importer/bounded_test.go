package importer

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// maxImporterRSS is the documented bound: whatever the input, an importer stays under it.
const maxImporterRSS = 256 << 20

// craftedServer serves data; claim, when set, is the size its 206 answers claim (the bytes past
// data read as zeros); noRange ignores Range; endless follows data with zeros forever, with no
// Content-Length.
type craftedServer struct {
	data    []byte
	claim   int64
	noRange bool
	endless bool
}

func (s *craftedServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.endless {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(s.data)
		zeros := make([]byte, 1<<20)
		for r.Context().Err() == nil {
			if _, err := w.Write(zeros); err != nil {
				return
			}
		}
		return
	}
	var from, to int64
	if _, err := fmt.Sscanf(r.Header.Get("Range"), "bytes=%d-%d", &from, &to); err != nil || s.noRange {
		w.Header().Set("Content-Length", strconv.Itoa(len(s.data)))
		_, _ = w.Write(s.data)
		return
	}
	total := max(s.claim, int64(len(s.data)))
	to = min(to, total-1)
	w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", from, to, total))
	w.Header().Set("Content-Length", strconv.FormatInt(to-from+1, 10))
	w.WriteHeader(http.StatusPartialContent)
	part := make([]byte, to-from+1)
	if from < int64(len(s.data)) {
		copy(part, s.data[from:])
	}
	_, _ = w.Write(part)
}

// qcow2Header writes a version 3 qcow2 header into a cluster of 2^bits bytes.
func qcow2HeaderBytes(size uint64, bits, l1Size uint32, l1Off uint64) []byte {
	be := binary.BigEndian
	h := make([]byte, 1<<bits)
	copy(h, "QFI\xfb")
	be.PutUint32(h[4:], 3)
	be.PutUint32(h[20:], bits)
	be.PutUint64(h[24:], size)
	be.PutUint32(h[36:], l1Size)
	be.PutUint64(h[40:], l1Off)
	be.PutUint64(h[48:], 1<<bits) // refcount table, never read
	be.PutUint32(h[96:], 4)
	be.PutUint32(h[100:], 104)
	return h
}

// tablesMappingNothing is a qcow2 stream whose L2 tables map clusters far past its end, which
// never arrive: 300 tables of 8192 entries, 2.4 million clusters promised.
func tablesMappingNothing() []byte {
	const bits, tables = 16, 300
	cs := uint64(1) << bits
	size := uint64(tables) * (cs / 8) * cs // every entry of every table maps a guest cluster
	l1Size := uint32(tables)
	img := qcow2HeaderBytes(size, bits, l1Size, 2*cs)
	img = append(img, make([]byte, cs)...) // the refcount table's cluster
	l1 := make([]byte, cs)
	for i := range tables {
		binary.BigEndian.PutUint64(l1[i*8:], (3+uint64(i))*cs|1<<63)
	}
	img = append(img, l1...)
	far := uint64(1) << 40
	for i := range tables {
		l2 := make([]byte, cs)
		for j := range int(cs / 8) {
			binary.BigEndian.PutUint64(l2[j*8:], (far+uint64(i*int(cs/8)+j)*cs)|1<<63)
		}
		img = append(img, l2...)
	}
	return img
}

// compressedTablesFirst is a qcow2 stream of 512-byte clusters whose 32,000 L2 tables come
// first, each naming 64 compressed clusters far ahead that never come: 2.05 million clusters
// to track in host order, which sorting them again after every table made quadratic.
func compressedTablesFirst() []byte {
	const bits, tables = 9, 32000
	cs := uint64(1) << bits
	entries := cs / 8
	l1Clusters := (tables*8 + cs - 1) / cs
	img := qcow2HeaderBytes(tables*entries*cs, bits, tables, 2*cs)
	img = append(img, make([]byte, cs)...) // the refcount table's cluster
	l1 := make([]byte, l1Clusters*cs)
	first := 2 + l1Clusters // the first table's cluster
	for i := range uint64(tables) {
		binary.BigEndian.PutUint64(l1[i*8:], (first+i)*cs|1<<63)
	}
	img = append(img, l1...)
	x := 62 - (bits - 8)
	for i := range uint64(tables) {
		l2 := make([]byte, cs)
		for j := range entries {
			host := uint64(1)<<40 + (i*entries+j)*cs
			binary.BigEndian.PutUint64(l2[j*8:], 1<<62|host&(1<<x-1))
		}
		img = append(img, l2...)
	}
	return img
}

// manyGrainTables is a monolithicSparse vmdk of 8 GiB of 512-byte grains whose 256 grain
// tables (256 KiB each, all empty) the converter reads one after another: 64 MiB of tables,
// which a cache without a bound would keep.
func manyGrainTables() []byte {
	const tables, gtes, grain = 256, 65536, 512
	le := binary.LittleEndian
	h := make([]byte, 3*512+gtes*4)
	copy(h, "KDMV")
	le.PutUint32(h[4:], 1)
	le.PutUint64(h[12:], tables*gtes*grain/512) // capacity in sectors
	le.PutUint64(h[20:], grain/512)
	le.PutUint32(h[44:], gtes)
	le.PutUint64(h[56:], 1) // the grain directory at sector 1
	le.PutUint64(h[64:], 1) // overhead
	for i := range tables {
		le.PutUint32(h[512+i*4:], 3) // every table at sector 3
	}
	return h
}

// runChild runs the importer command in a child process of this test binary and returns its
// result, its peak RSS and how long it took.
func runChild(t *testing.T, args ...string) (*transfer.Result, int64, time.Duration, string) {
	t.Helper()
	term := filepath.Join(t.TempDir(), "termination-log")
	args = append(args, "--metrics-addr", "", "--termination-message-path", term, "--progress-interval", "1h", "--retries", "2")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestImporterChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+strings.Join(args, "\x1f"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	_ = cmd.Run()
	took := time.Since(start)
	msg, err := os.ReadFile(term)
	if err != nil {
		t.Fatalf("no result after %s: %v\n%s", took, err, out.String())
	}
	res, err := transfer.ReadResult(string(msg))
	if err != nil {
		t.Fatal(err)
	}
	// The child's own high-water mark (VmHWM), which it prints as it ends: getrusage's maxrss
	// would count this process's memory, which the child shares until it execs.
	var rss int64
	if _, tail, ok := strings.Cut(out.String(), "VmHWM:"); ok {
		if kb, err := strconv.ParseInt(strings.Fields(tail)[0], 10, 64); err == nil {
			rss = kb << 10
		}
	}
	if rss == 0 {
		t.Fatalf("the child did not report its peak RSS:\n%s", out.String())
	}
	return res, rss, took, out.String()
}

// TestCraftedInputsBoundedMemory imports inputs crafted to make the importer allocate what
// they declare, each in a process of its own, and checks that each ends with its reason, in
// bounded time, under maxImporterRSS of peak RSS.
func TestCraftedInputsBoundedMemory(t *testing.T) {
	dir := t.TempDir()
	raw := makeRaw(t, dir)
	qcow, err := os.ReadFile(convertTo(t, raw, "qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	xzData := hugeDictXz(t, raw)
	zstdData := zstdStream(t, raw)
	zstdData[5] = zstdWindow512MiB

	huge := qcow2HeaderBytes(1<<56, 16, 1<<27, 1<<16) // an L1 table of 2^27 entries (1 GiB)
	widest := qcow2HeaderBytes(1<<56, 16, 1<<32-1, 1<<16)
	for _, c := range []struct {
		name   string
		srv    *craftedServer
		args   []string
		reason transfer.Reason // "" succeeds
		says   string
	}{
		{"qcow2 L1 of 2^27 entries, 2^62-byte Content-Range", &craftedServer{data: huge, claim: 1 << 62}, nil, transfer.ReasonMalformedImage, "134217728 entries"},
		{"the same, probed", &craftedServer{data: huge, claim: 1 << 62}, []string{"--probe"}, transfer.ReasonMalformedImage, "134217728 entries"},
		{"the same, without Range", &craftedServer{data: huge, noRange: true}, nil, transfer.ReasonMalformedImage, "134217728 entries"},
		{"qcow2 L1 of 2^32-1 entries", &craftedServer{data: widest, claim: 1 << 62}, nil, transfer.ReasonMalformedImage, "4294967295 entries"},
		{"xz with a 3 GiB dictionary", &craftedServer{data: xzData, noRange: true}, nil, transfer.ReasonMalformedImage, "3072 MiB dictionary"},
		{"zstd with a 512 MiB window", &craftedServer{data: zstdData, noRange: true}, nil, transfer.ReasonMalformedImage, "window larger than"},
		{"qcow2 stream whose tables map clusters that never come", &craftedServer{data: tablesMappingNothing(), noRange: true}, []string{"--capacity", strconv.FormatInt(1<<45, 10)}, transfer.ReasonNeedsRandomAccess, "more than 2097152 clusters"},
		{"a valid qcow2 followed by endless zeros, no length", &craftedServer{data: qcow, endless: true}, nil, transfer.ReasonMalformedImage, "goes on past the end"},
		{"qcow2 stream of 32,000 tables of compressed clusters first", &craftedServer{data: compressedTablesFirst(), noRange: true}, []string{"--capacity", strconv.FormatInt(2<<30, 10)}, transfer.ReasonMalformedImage, "compressed cluster at 1099511627776"},
		{"a monolithicSparse vmdk of 256 grain tables", &craftedServer{data: manyGrainTables()}, []string{"--capacity", strconv.FormatInt(16<<30, 10)}, "", ""},
		{"a valid qcow2 claiming 2^62 bytes", &craftedServer{data: qcow, claim: 1 << 62}, nil, "", ""},
		{"a valid qcow2 (the normal figure)", &craftedServer{data: qcow}, nil, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(c.srv)
			defer srv.Close()
			args := append([]string{"--url", srv.URL + "/image"}, c.args...)
			if !strings.Contains(strings.Join(c.args, " "), "--probe") {
				args = append(args, "--target", filepath.Join(t.TempDir(), "disk.img"))
			}
			if !strings.Contains(strings.Join(args, " "), "--capacity") {
				args = append(args, "--capacity", strconv.FormatInt(128<<20, 10))
			}
			res, rss, took, log := runChild(t, args...)
			t.Logf("peak RSS %d MiB, %s: %s %s", rss>>20, took.Round(time.Millisecond), res.Reason, res.Message)
			switch {
			case c.reason == "" && !res.Succeeded:
				t.Errorf("failed: %s: %s\n%s", res.Reason, res.Message, log)
			case c.reason != "" && (res.Reason != c.reason || res.Transient || !strings.Contains(res.Message, c.says)):
				t.Errorf("reason %s (transient %v): %s; want %s saying %q", res.Reason, res.Transient, res.Message, c.reason, c.says)
			}
			if took > time.Minute {
				t.Errorf("took %s: the work grows faster than the input", took)
			}
			if rss > maxImporterRSS {
				t.Errorf("peak RSS %d MiB, over the %d MiB bound", rss>>20, maxImporterRSS>>20)
			}
		})
	}
}

// swappingServer serves first, then (from request number after on) second: a server that
// changes the image under the importer between the requests it makes.
type swappingServer struct {
	first, second []byte
	after         int64
	requests      atomic.Int64
}

func (s *swappingServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	data := s.first
	if s.requests.Add(1) > s.after {
		data = s.second
	}
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
}

// The probe and the import decide from the header they checked: a server that adds a backing
// file to the header after the first requests does not make either read it (go-qcow2reader
// would open the backing file, a path on the importer's own machine, by its name).
func TestHeaderCheckedOnce(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	good, err := os.ReadFile(convertTo(t, raw, "qcow2"))
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(good)
	name := "/nonexistent/backing.img"         // opened, it fails the probe: the test sees that it was
	binary.BigEndian.PutUint64(bad[8:], 0x1f0) // the backing file's name, inside the first cluster
	binary.BigEndian.PutUint32(bad[16:], uint32(len(name)))
	copy(bad[0x1f0:], name)
	for _, after := range []int64{1, 2, 3, 4} {
		srv := &swappingServer{first: good, second: bad, after: after}
		hs := httptest.NewServer(srv)
		url := hs.URL + "/disk.qcow2"
		res, err := Probe(t.Context(), Options{Source: &HTTPSource{URL: url}, Retry: fastRetry})
		switch {
		case after == 1: // the 1-byte open, then the header read: the bad one, refused
			if transfer.ReasonOf(err) != transfer.ReasonBackingFile {
				t.Errorf("probe of a header with a backing file: %v", err)
			}
		case err != nil || res.VirtualSize != int64(len(mustRead(t, raw))):
			t.Errorf("probe with the header swapped after %d requests: %v (%+v)", after, err, res)
		}
		srv.requests.Store(0)
		target, _, err := importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: url}})
		switch {
		case after == 1:
			if transfer.ReasonOf(err) != transfer.ReasonBackingFile {
				t.Errorf("import of a header with a backing file: %v", err)
			}
		case err != nil:
			t.Errorf("import with the header swapped after %d requests: %v", after, err)
		default:
			sameDisk(t, raw, target)
		}
		hs.Close()
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
