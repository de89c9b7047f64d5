package importer

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lima-vm/go-qcow2reader/convert"
	"github.com/lima-vm/go-qcow2reader/image"
	"github.com/lima-vm/go-qcow2reader/image/qcow2"

	"k8s.io/utils/ptr"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// Options describe one import.
type Options struct {
	// Source of the image; nil with Blank.
	Source Source
	// Chain, in place of Source, is a backup chain to restore: a full backup first, then its
	// incrementals (chain.go).
	Chain []ChainLayer
	// ChainIndex, in place of Source or Chain, is a point of backups kept by their index.
	ChainIndex *ChainIndex
	// Blank makes an empty disk of BlankSize bytes instead of importing.
	Blank     bool
	BlankSize int64
	// Target is disk.img's path on a filesystem volume, or a block device.
	Target string
	// Capacity is the volume's size in bytes (0: the filesystem's or device's own).
	Capacity int64
	// Overhead is the share of a filesystem volume kept for the filesystem; nil is 6 %, and 0
	// keeps none (a CDIConfig may say so, and the claim was then sized with none).
	Overhead *float64
	// Grow makes disk.img as large as the volume allows (rounded down to a MiB) when the
	// image is smaller: a disk requested larger than its image. A blank disk of size 0 is
	// the whole usable volume.
	Grow bool
	// Preallocate allocates the whole disk file on its volume (a block device is left as it is).
	Preallocate bool
	// Checksum is the expected digest of the source bytes, "<algorithm>:<hex>".
	Checksum string
	// Format forces a format; empty detects it. PVC copies force raw, so a guest's disk that
	// happens to start like an image header is never interpreted.
	Format Format
	// OVADisk chooses the disk of an OVA appliance to import, by the OVF disk id or the
	// file's name in the archive; empty takes the first disk.
	OVADisk string
	// Retry bounds the retries of each request.
	Retry transfer.RetryPolicy
	// StallTimeout is how long a response may send nothing before it is retried (default 60s).
	StallTimeout time.Duration
	// Parallel is how many ranged requests are in flight at once (default 8).
	Parallel int
	// Progress counts the work; nil makes one.
	Progress *transfer.Progress
	// Log receives progress and retry lines; nil discards them.
	Log *slog.Logger
}

// Random-access reads go through a cache of 24 blocks of 1 MiB: 24 MiB whatever the image, so
// that an import pod stays under 64 MiB of RSS (make bench-import). The converter's eight
// workers take segments of 1 MiB of the disk and so read within a few neighbouring blocks;
// with segments of 4 MiB, or with 12 blocks of 2 MiB, a worker's half-read block was evicted
// and read again (18 % of a plain qcow2 twice; a resumed import read half its rest twice).
const (
	cacheBlockSize = 1 << 20
	cacheBlocks    = 24
	segmentSize    = convert.BufferSize
	convertBuffer  = convert.BufferSize / 4
	readahead      = 2
	copyBufferSize = 1 << 20
)

func (o *Options) defaults() {
	if o.Overhead == nil {
		o.Overhead = ptr.To(DefaultOverhead)
	}
	if o.Retry.Attempts == 0 {
		o.Retry = transfer.DefaultRetryPolicy
	}
	if o.StallTimeout == 0 {
		o.StallTimeout = time.Minute
	}
	if o.Parallel == 0 {
		o.Parallel = 8
	}
	if o.Progress == nil {
		o.Progress = transfer.NewProgress(0)
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
}

// Import copies the source into the target. On any failure the target is left empty.
func Import(ctx context.Context, o Options) (*transfer.Result, error) {
	o.defaults()
	res := &transfer.Result{}
	start := time.Now()
	t, err := OpenTarget(o.Target, o.Capacity, *o.Overhead)
	if err != nil {
		return res, err
	}
	t.grow, t.preallocate = o.Grow, o.Preallocate
	if err = run(ctx, &o, t, res, start); err != nil {
		_ = t.settle() // a checkpoint recorded as the import failed counts
		if t.checkpointed && resumable(err) {
			o.Log.Info("Keeping the disk and its checkpoint for the next attempt", "err", err)
			_ = t.Keep()
			return res, err
		}
		if werr := t.Wipe(); werr != nil {
			o.Log.Error("Could not empty the target after a failure", "err", werr)
		}
		return res, err
	}
	res.FlushedSeconds = time.Since(start).Seconds() // the disk is on the volume
	if o.Grow && !t.block {
		res.VirtualSize = max(res.VirtualSize, t.GrownSize())
	}
	res.Succeeded = true
	return res, nil
}

func run(ctx context.Context, o *Options, t *Target, res *transfer.Result, start time.Time) error {
	defer func() { res.BytesWritten = t.Written() }()
	if o.Blank {
		res.Format, res.VirtualSize = string(FormatRaw), o.BlankSize
		if o.BlankSize == 0 && o.Grow {
			res.VirtualSize = t.GrownSize()
			if t.block {
				res.VirtualSize = t.usable
			}
		}
		if err := t.Prepare(res.VirtualSize); err != nil {
			return err
		}
		return t.Finish(res.VirtualSize)
	}

	if len(o.Chain) > 0 || o.ChainIndex != nil {
		return importChain(ctx, o, t, res, start)
	}
	var obj Object
	err := o.Retry.Do(ctx, o.Log, "open "+o.Source.String(), func() (err error) {
		obj, err = o.Source.Open(ctx)
		return err
	})
	if err != nil {
		return err
	}
	defer obj.Close()
	res.Revision = obj.Revision()
	f := &fetcher{ctx: ctx, obj: obj, name: o.Source.String(), retry: o.Retry, log: o.Log, stall: o.StallTimeout}
	defer func() {
		res.BytesRead = f.read.Load()
		res.FirstByteSeconds, res.LastByteSeconds = since(&f.first, start), since(&f.last, start)
	}()

	cs, err := transfer.ParseChecksum(o.Checksum)
	if err != nil {
		return err
	}
	if obj.RandomAccess() && obj.Size() > 0 && (o.Format == "" || o.Format == FormatRaw) {
		head := make([]byte, min(sniffLen, obj.Size()))
		if _, err := f.ReadAt(head, 0); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if o.Format == FormatRaw {
			return importRaw(o, f, head, cs, t, res)
		}
		if isIndex(head) {
			if err := indexAllowed(o, cs); err != nil {
				return err
			}
			o.ChainIndex = &ChainIndex{Source: o.Source}
			return importChain(ctx, o, t, res, start)
		}
		if sniffCompression(head) == CompressionNone {
			format := sniffFormat(head)
			if format == FormatRaw && isFixedVHD(f) {
				format = FormatVPC
			}
			if err := checkOVADisk(o, format); err != nil {
				return err
			}
			switch format {
			case FormatQcow2, FormatVMDK, FormatVPC, FormatVDI, FormatVHDX:
				return importRandom(ctx, o, f, format, head, cs, t, res)
			case FormatRaw, FormatISO:
				return importRaw(o, f, head, cs, t, res)
			}
		}
	}
	return importStream(o, f, cs, t, res)
}

// resumable reports whether a failure leaves a disk worth going on from: a transient one, or
// the pod being stopped.
func resumable(err error) bool { return transfer.IsTransient(err) || errors.Is(err, context.Canceled) }

// isFixedVHD reports whether the image ends with the footer of a fixed VHD, the one format
// whose only mark is at its end (qemu's probing takes such images for raw and keeps the
// footer as data).
func isFixedVHD(f *fetcher) bool {
	size := f.obj.Size()
	if size < 1024 {
		return false
	}
	tail := make([]byte, 512)
	if _, err := f.ReadAt(tail, size-512); err != nil && !errors.Is(err, io.EOF) {
		return false
	}
	return string(tail[:8]) == "conectix" && binary.BigEndian.Uint32(tail[60:]) == 2
}

// openImage opens a random-access image of the given format over ra.
func openImage(format Format, head []byte, ra io.ReaderAt, size int64) (image.Image, error) {
	switch format {
	case FormatQcow2:
		if _, err := parseQcow2Header(head, size); err != nil {
			return nil, err
		}
		return openQcow2(head, ra)
	case FormatVPC:
		return openVPC(ra, size)
	case FormatVDI:
		return openVDI(ra)
	case FormatVMDK:
		return openVMDK(ra, size)
	case FormatVHDX:
		return openVHDX(ra, size)
	}
	return nil, transfer.Permanent(transfer.ReasonUnsupportedFormat, "%s images are not supported", format)
}

// openQcow2 opens a qcow2 image whose checked header is head.
func openQcow2(head []byte, ra io.ReaderAt) (image.Image, error) {
	img, err := qcow2.Open(checkedHead{head, ra}, noBackingFile)
	if err != nil {
		return nil, imageError(err)
	}
	if err := img.Readable(); err != nil {
		img.Close()
		return nil, transfer.Permanent(transfer.ReasonUnsupportedFormat, "the qcow2 image cannot be read: %w", err)
	}
	return img, nil
}

// importRandom converts an image read at random (qcow2, vmdk, vpc, vdi, vhdx), fetching only its
// allocated clusters, except when a checksum must be verified: then a hasher reads the whole
// file in order through the same cache. The disk is done in pieces of checkpointAfter bytes,
// each recorded once flushed (checkpoint.go), so another pod can go on from the last one.
func importRandom(ctx context.Context, o *Options, f *fetcher, format Format, head []byte, cs *transfer.Checksum, t *Target, res *transfer.Result) error {
	size := f.obj.Size()
	cache := newBlockCache(f, size, cacheBlockSize, cacheBlocks, o.Parallel, readahead)
	cache.prefix = head
	if cs.Want != "" {
		cache.readers = 2 // the hasher reads every byte too
	}
	img, err := openImage(format, head, checkedHead{head, boundedReaderAt{r: cache, size: size}}, size)
	if err != nil {
		return err
	}
	defer img.Close()
	vsize := img.Size()
	res.Format, res.VirtualSize = string(format), vsize
	o.Progress.SetTotal(vsize)
	cp, err := startOrResume(o, f.origin(o), format, vsize, t, cs)
	if err != nil {
		return err
	}

	h := &orderedHash{cs: cs, off: cp.Hashed}
	hashed := make(chan error, 1)
	if cs.Want != "" {
		go func() { hashed <- h.run(ctx, cache, size) }()
	} else {
		hashed <- nil
	}
	if err = convertInPieces(o, img, t, cp, func(cp *checkpoint) { cp.Hashed, cp.Hash = h.snapshot() }); err != nil {
		h.stop()
	}
	if herr := <-hashed; err == nil {
		err = herr
	}
	if err != nil {
		return imageError(err)
	}
	if cs.Want != "" {
		res.Digest = cs.Digest()
		if err := cs.Verify(); err != nil {
			return err
		}
	}
	return t.Finish(vsize)
}

// origin is what a checkpoint is matched against: the source's name, the identity of its
// version ("" when it tells none) and its size in bytes (-1 when unknown).
type origin struct {
	name, identity string
	size           int64
}

func (f *fetcher) origin(o *Options) origin {
	return origin{name: o.Source.String(), identity: f.obj.Identity(), size: f.obj.Size()}
}

// convertInPieces converts img into t from cp.Done to its end, in pieces of checkpointAfter
// bytes when the import can be checkpointed, recording each piece once it is written with
// the hash state mark adds.
func convertInPieces(o *Options, img image.Image, t *Target, cp *checkpoint, mark func(*checkpoint)) error {
	vsize := img.Size()
	start, from := time.Now(), cp.Done
	for cp.Done < vsize {
		n := vsize - cp.Done
		if cp.Identity != "" {
			n = min(n, checkpointAfter(cp.Done-from, time.Since(start)))
		}
		if err := convert.Convert(shifted{t, cp.Done}, &window{img, cp.Done, n},
			convert.Options{Workers: o.Parallel, SegmentSize: segmentSize, BufferSize: convertBuffer, Progress: o.Progress}); err != nil {
			return err
		}
		if cp.Done += n; cp.Identity != "" && cp.Done < vsize {
			mark(cp)
			if err := t.saveCheckpoint(*cp); err != nil {
				return err
			}
		}
	}
	return nil
}

// startOrResume continues the disk from a checkpoint that matches this source, or empties
// it and starts over. The returned record's Identity is empty when the import cannot be
// checkpointed (the source tells no identity, or the device has no room beside the image).
func startOrResume(o *Options, src origin, format Format, vsize int64, t *Target, cs *transfer.Checksum) (*checkpoint, error) {
	id := src.identity
	fresh := &checkpoint{Source: src.name, Format: string(format), VirtualSize: vsize}
	if id != "" && t.checkpointable(vsize) {
		fresh.Identity = id
		if cp := t.loadCheckpoint(vsize); cp.matches(fresh.Source, id, format, vsize, src.size) {
			if cp.Hashed == 0 || cs.Want == "" || cs.Restore(cp.Hash) == nil {
				if cs.Want == "" {
					cp.Hashed, cp.Hash = 0, nil
				}
				if err := t.Resume(vsize); err != nil {
					return nil, err
				}
				o.Log.Info("Resuming the import where an earlier attempt stopped", "done", cp.Done, "of", vsize, "hashed", cp.Hashed)
				o.Progress.Add(cp.Done)
				return cp, nil
			}
		} else if cp != nil {
			o.Log.Info("Starting over: the checkpoint an earlier attempt left is for another source or version", "checkpointSource", cp.Source)
		}
	}
	if err := t.Prepare(vsize); err != nil {
		return nil, err
	}
	return fresh, t.removeCheckpoint(vsize)
}

// orderedHash hashes the whole source in order through the cache the converter also reads,
// from off; snapshot gives a consistent (offset, state) pair for a checkpoint.
type orderedHash struct {
	cs *transfer.Checksum
	// chunk is how much each read asks for (default cacheBlockSize, whole cache blocks).
	chunk   int64
	mu      sync.Mutex
	off     int64
	stopped atomic.Bool
}

func (h *orderedHash) run(ctx context.Context, c io.ReaderAt, size int64) error {
	chunk := cmp.Or(h.chunk, cacheBlockSize)
	buf := make([]byte, chunk)
	for h.off < size {
		if err := ctx.Err(); err != nil {
			return err
		}
		if h.stopped.Load() {
			return nil
		}
		// Whole cache blocks, so a resumed hash reads the blocks the converter reads.
		n, err := c.ReadAt(buf[:min(chunk-h.off%chunk, size-h.off)], h.off)
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		h.mu.Lock()
		h.cs.Hash.Write(buf[:n])
		h.off += int64(n)
		h.mu.Unlock()
	}
	return nil
}

func (h *orderedHash) snapshot() (int64, []byte) {
	if h.cs.Want == "" {
		return 0, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	state, err := h.cs.State()
	if err != nil {
		return 0, nil
	}
	return h.off, state
}

func (h *orderedHash) stop() { h.stopped.Store(true) }

// window is the part [base, base+n) of an image, as an image of its own.
type window struct {
	image.Image
	base, n int64
}

func (w *window) Size() int64 { return w.n }

func (w *window) ReadAt(p []byte, off int64) (int, error) {
	if off >= w.n {
		return 0, io.EOF
	}
	if rest := w.n - off; int64(len(p)) > rest {
		n, err := w.Image.ReadAt(p[:rest], w.base+off)
		if err == nil {
			err = io.EOF
		}
		return n, err
	}
	return w.Image.ReadAt(p, w.base+off)
}

func (w *window) Extent(start, length int64) (image.Extent, error) {
	e, err := w.Image.Extent(w.base+start, min(length, w.n-start))
	e.Start -= w.base
	return e, err
}

// shifted writes at base + off.
type shifted struct {
	t    *Target
	base int64
}

func (s shifted) WriteAt(p []byte, off int64) (int, error) { return s.t.WriteAt(p, s.base+off) }

// imageError keeps a transfer error's reason, and calls any other reader error malformed.
func imageError(err error) error {
	var te *transfer.Error
	if errors.As(err, &te) || errors.Is(err, context.Canceled) {
		return err
	}
	return transfer.Permanent(transfer.ReasonMalformedImage, "malformed image: %w", err)
}

// importStream copies a raw image, or a gzip, xz or zstd compressed one, front to back: the
// source bytes are hashed as they arrive and only non-zero blocks are written.
func importStream(o *Options, f *fetcher, cs *transfer.Checksum, t *Target, res *transfer.Result) error {
	s := f.stream()
	defer s.Close()
	o.Progress.SetTotal(max(f.obj.Size(), 0))
	st, err := openStream(io.TeeReader(&countingReader{r: s, p: o.Progress}, cs.Hash), o.Format != "")
	if err != nil {
		return err
	}
	defer st.Close()
	src, data, head, comp, format := st.outer, st.data, st.head, st.comp, st.format
	size := int64(-1)
	if comp == CompressionNone {
		size = f.obj.Size()
	}
	if err := checkOVADisk(o, format); err != nil {
		return err
	}
	if comp != CompressionNone && (format == FormatRaw || format == FormatISO) {
		if err := t.fits(declaredSize(comp, st.prefix, f)); err != nil { // before the image is downloaded
			return err
		}
	}
	var vsize int64
	if format == FormatOVA {
		format, vsize, err = importOVA(data, o.OVADisk, t)
	} else {
		format, vsize, err = convertStream(data, head, format, size, t)
	}
	if err != nil {
		if errors.Is(err, errNeedsRandomAccess) {
			return needsRandomAccess(format, comp)
		}
		return streamError(comp, err)
	}
	return finishStream(src, f.obj.Size() >= 0, cs, t, res, format, comp, vsize)
}

// openedStream is a source's byte stream opened to read its image: the compression found (unless
// the format is forced) and undone, and the image's format told from its first bytes. Probe
// and import open a stream alike.
type openedStream struct {
	outer  *bufio.Reader // the stream as it came
	data   io.Reader     // the image's bytes: outer, decompressed
	head   []byte        // the image's first bytes (up to sniffLen), before data is read
	prefix []byte        // the stream's first 32 bytes as they came: a compressed stream's header
	comp   Compression
	format Format
	dec    io.Closer
}

func openStream(r io.Reader, forced bool) (*openedStream, error) {
	src := bufio.NewReaderSize(r, copyBufferSize)
	head, err := src.Peek(sniffLen)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, bufio.ErrBufferFull) {
		return nil, err
	}
	s := &openedStream{outer: src, data: src, comp: CompressionNone, format: FormatRaw,
		prefix: bytes.Clone(head[:min(len(head), 32)])} // src reuses its buffer once the decompressor reads it
	if !forced {
		s.comp = sniffCompression(head)
	}
	if s.comp != CompressionNone {
		dec, err := decompress(s.comp, src)
		if err != nil {
			return nil, err
		}
		inner := bufio.NewReaderSize(dec, copyBufferSize)
		if head, err = inner.Peek(sniffLen); err != nil && !errors.Is(err, io.EOF) {
			dec.Close()
			return nil, transfer.Permanent(transfer.ReasonMalformedImage, "malformed %s stream: %w", s.comp, err)
		}
		s.data, s.dec = inner, dec
	}
	s.head = head
	if !forced {
		s.format = sniffFormat(head)
	}
	return s, nil
}

// Close ends the decompressor, if any.
func (s *openedStream) Close() {
	if s.dec != nil {
		s.dec.Close()
	}
}

// checkOVADisk refuses a disk chosen from a source that is not an appliance.
func checkOVADisk(o *Options, format Format) error {
	if o.OVADisk != "" && format != FormatOVA {
		return transfer.Permanent(transfer.ReasonInvalidArgument, "a disk of an OVA appliance is chosen (%q), but the source is a %s image, not an OVA", o.OVADisk, format)
	}
	return nil
}

// errNeedsRandomAccess says a format cannot be read front to back.
var errNeedsRandomAccess = errors.New("needs random access")

// convertStream writes the image of the given format read front to back from data (head is
// its start, size its length or -1) to the target, and returns the format it was and its
// virtual size.
func convertStream(data io.Reader, head []byte, format Format, size int64, t *Target) (Format, int64, error) {
	switch format {
	case FormatQcow2:
		vsize, err := importQcow2Stream(data, head, t)
		return format, vsize, err
	case FormatVMDK:
		vsize, err := importVMDKStream(data, t)
		return format, vsize, err
	case FormatVPC, FormatVDI, FormatVHDX:
		return format, 0, errNeedsRandomAccess
	case FormatOVA:
		return format, 0, transfer.Permanent(transfer.ReasonUnsupportedFormat, "an OVA appliance inside an OVA appliance is not imported")
	}
	if err := t.Prepare(max(size, 0)); err != nil {
		return format, 0, err
	}
	w := &sparseWriter{t: t}
	if _, err := io.CopyBuffer(w, data, make([]byte, copyBufferSize)); err != nil {
		return format, 0, err
	}
	if format == FormatISO {
		format = FormatRaw
	}
	return format, w.off, nil
}

// needsRandomAccess explains why an image of a format read only at random was not imported,
// and the ways out.
func needsRandomAccess(format Format, comp Compression) error {
	why := "the server does not support Range requests"
	if comp != CompressionNone {
		why = fmt.Sprintf("it is wrapped in %s", comp)
	}
	return transfer.Permanent(transfer.ReasonNeedsRandomAccess,
		"the source is a %s image and %s, but %s places its blocks by tables that a stream passes before it can use them, and diskpipe keeps no scratch copy: "+
			"serve it uncompressed from a server that supports Range (the bundled object store does: 'aws s3 cp'), "+
			"or convert it first with 'qemu-img convert -O qcow2 <image> <image>.qcow2' (qcow2, streamOptimized vmdk and raw import from any stream)",
		format, why, format)
}

// finishStream reads what follows the image in the source, so the checksum covers all of it,
// verifies the checksum, and completes the target. A source of unknown length (no
// Content-Length) is read past the image up to maxTrailing(vsize) and no further: what follows
// an image is metadata it does not need (a qcow2's last refcount blocks), and a source that
// goes on and on is refused rather than read forever.
func finishStream(src io.Reader, sized bool, cs *transfer.Checksum, t *Target, res *transfer.Result, format Format, comp Compression, vsize int64) error {
	limit := maxTrailing(vsize)
	if sized {
		limit = math.MaxInt64 - 1 // the source ends where it said
	}
	n, err := io.Copy(io.Discard, io.LimitReader(src, limit+1))
	if err != nil {
		return err
	}
	if n > limit {
		return transfer.Permanent(transfer.ReasonMalformedImage,
			"the source goes on past the end of the %s image: more than %d MiB follow it, where an image keeps at most its refcount tables", format, limit>>20)
	}
	res.Format, res.Compression, res.VirtualSize = string(format), string(comp), vsize
	res.Digest = cs.Digest()
	if err := cs.Verify(); err != nil {
		return err
	}
	return t.Finish(vsize)
}

// maxTrailing is how much may follow an image of virtual size vsize in its stream: 64 MiB and
// 1/1024 of the disk, more than a qcow2's refcount blocks (2 bytes per 64 KiB cluster).
func maxTrailing(vsize int64) int64 { return 64<<20 + max(vsize, 0)/1024 }

func streamError(comp Compression, err error) error {
	var te *transfer.Error
	if errors.As(err, &te) || errors.Is(err, context.Canceled) || comp == CompressionNone {
		return err
	}
	return transfer.Permanent(transfer.ReasonMalformedImage, "malformed or truncated %s stream: %w", comp, err)
}

// countingReader counts the bytes read from the source into the progress.
type countingReader struct {
	r io.Reader
	p *transfer.Progress
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.p.Add(int64(n))
	return n, err
}
