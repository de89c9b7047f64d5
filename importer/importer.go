package importer

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	qcow2reader "github.com/lima-vm/go-qcow2reader"
	"github.com/lima-vm/go-qcow2reader/convert"
	"github.com/lima-vm/go-qcow2reader/image"
	"github.com/lima-vm/go-qcow2reader/image/qcow2"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// Options describe one import.
type Options struct {
	// Source of the image; nil with Blank.
	Source Source
	// Blank makes an empty disk of BlankSize bytes instead of importing.
	Blank     bool
	BlankSize int64
	// Target is disk.img's path on a filesystem volume, or a block device.
	Target string
	// Capacity is the volume's size in bytes (0: the filesystem's or device's own).
	Capacity int64
	// Overhead is the share of a filesystem volume kept for the filesystem (default 6 %).
	Overhead float64
	// Grow makes disk.img as large as the volume allows (rounded down to a MiB) when the
	// image is smaller: a disk requested larger than its image. A blank disk of size 0 is
	// the whole usable volume.
	Grow bool
	// Checksum is the expected digest of the source bytes, "<algorithm>:<hex>".
	Checksum string
	// Format forces a format; empty detects it. PVC copies force raw, so a guest's disk that
	// happens to start like an image header is never interpreted.
	Format Format
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

// Random-access reads go through a cache of 48 blocks of 2 MiB: 96 MiB whatever the image. Fewer
// blocks let eight workers evict what another still needs (2 % of a plain qcow2 read twice at 32).
const (
	cacheBlockSize = 2 << 20
	cacheBlocks    = 48
	readahead      = 2
	copyBufferSize = 1 << 20
)

func (o *Options) defaults() {
	if o.Overhead == 0 {
		o.Overhead = DefaultOverhead
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
	t, err := OpenTarget(o.Target, o.Capacity, o.Overhead)
	if err != nil {
		return res, err
	}
	t.grow = o.Grow
	if err = run(ctx, &o, t, res); err != nil {
		if werr := t.Wipe(); werr != nil {
			o.Log.Error("Could not empty the target after a failure", "err", werr)
		}
		return res, err
	}
	if o.Grow && !t.block {
		res.VirtualSize = max(res.VirtualSize, t.GrownSize())
	}
	res.Succeeded = true
	return res, nil
}

func run(ctx context.Context, o *Options, t *Target, res *transfer.Result) error {
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

	var obj Object
	err := o.Retry.Do(ctx, o.Log, "open "+o.Source.String(), func() (err error) {
		obj, err = o.Source.Open(ctx)
		return err
	})
	if err != nil {
		return err
	}
	defer obj.Close()
	f := &fetcher{ctx: ctx, obj: obj, name: o.Source.String(), retry: o.Retry, log: o.Log, stall: o.StallTimeout}
	defer func() { res.BytesRead = f.read.Load() }()

	cs, err := transfer.ParseChecksum(o.Checksum)
	if err != nil {
		return err
	}
	if obj.RandomAccess() && o.Format == "" && obj.Size() > 0 {
		head := make([]byte, min(sniffLen, obj.Size()))
		if _, err := f.ReadAt(head, 0); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if sniffCompression(head) == CompressionNone {
			format := sniffFormat(head)
			if format == FormatRaw && isFixedVHD(f) {
				format = FormatVPC
			}
			switch format {
			case FormatQcow2, FormatVMDK, FormatVPC, FormatVDI, FormatVHDX:
				return importRandom(ctx, o, f, format, head, cs, t, res)
			}
		}
	}
	return importStream(o, f, cs, t, res)
}

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
		img, err := qcow2.Open(ra, qcow2reader.OpenWithType)
		if err != nil {
			return nil, imageError(err)
		}
		if err := img.Readable(); err != nil {
			img.Close()
			return nil, transfer.Permanent(transfer.ReasonUnsupportedFormat, "the qcow2 image cannot be read: %w", err)
		}
		return img, nil
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

// importRandom converts an image read at random (qcow2, vmdk, vpc, vdi, vhdx), fetching only its
// allocated clusters, except when a checksum must be verified: then a hasher reads the whole
// file in order through the same cache.
func importRandom(ctx context.Context, o *Options, f *fetcher, format Format, head []byte, cs *transfer.Checksum, t *Target, res *transfer.Result) error {
	size := f.obj.Size()
	cache := newBlockCache(f, size, cacheBlockSize, cacheBlocks, o.Parallel, readahead)
	img, err := openImage(format, head, boundedReaderAt{r: cache, size: size}, size)
	if err != nil {
		return err
	}
	defer img.Close()
	res.Format, res.VirtualSize = string(format), img.Size()
	o.Progress.SetTotal(img.Size())
	if err := t.Prepare(img.Size()); err != nil {
		return err
	}

	hashed := make(chan error, 1)
	if cs.Want != "" {
		go func() { hashed <- hashAll(ctx, cache, size, cs) }()
	} else {
		hashed <- nil
	}
	err = convert.Convert(t, img, convert.Options{Workers: o.Parallel, SegmentSize: 4 * convert.BufferSize, Progress: o.Progress})
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
	return t.Finish(img.Size())
}

// hashAll hashes the whole source in order through the cache the converter also reads.
func hashAll(ctx context.Context, c *blockCache, size int64, cs *transfer.Checksum) error {
	buf := make([]byte, cacheBlockSize)
	for off := int64(0); off < size; off += cacheBlockSize {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := c.ReadAt(buf[:min(cacheBlockSize, size-off)], off)
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		cs.Hash.Write(buf[:n])
	}
	return nil
}

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
	src := bufio.NewReaderSize(io.TeeReader(&countingReader{r: s, p: o.Progress}, cs.Hash), copyBufferSize)
	head, err := src.Peek(sniffLen)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, bufio.ErrBufferFull) {
		return err
	}
	data := io.Reader(src)
	comp := CompressionNone
	if o.Format == "" {
		comp = sniffCompression(head)
	}
	if comp != CompressionNone {
		dec, err := decompress(comp, src)
		if err != nil {
			return err
		}
		defer dec.Close()
		inner := bufio.NewReaderSize(dec, copyBufferSize)
		if head, err = inner.Peek(sniffLen); err != nil && !errors.Is(err, io.EOF) {
			return transfer.Permanent(transfer.ReasonMalformedImage, "malformed %s stream: %w", comp, err)
		}
		data = inner
	}
	format := FormatRaw
	if o.Format == "" {
		format = sniffFormat(head)
	}
	switch format {
	case FormatQcow2:
		vsize, err := importQcow2Stream(data, head, t)
		if err != nil {
			return streamError(comp, err)
		}
		return finishStream(src, cs, t, res, format, comp, vsize)
	case FormatVMDK, FormatVPC, FormatVDI, FormatVHDX:
		why := "the server does not support Range requests"
		if comp != CompressionNone {
			why = fmt.Sprintf("it is wrapped in %s", comp)
		}
		return transfer.Permanent(transfer.ReasonNeedsRandomAccess,
			"the source is a %s image and %s, but %s needs random access and diskpipe keeps no scratch copy: "+
				"serve it uncompressed from a server that supports Range, or convert it to qcow2 or raw", format, why, format)
	}

	size := int64(0)
	if comp == CompressionNone && f.obj.Size() >= 0 {
		size = f.obj.Size()
	}
	if err := t.Prepare(size); err != nil {
		return err
	}
	w := &sparseWriter{t: t}
	if _, err := io.CopyBuffer(w, data, make([]byte, copyBufferSize)); err != nil {
		return streamError(comp, err)
	}
	if format == FormatISO {
		format = FormatRaw
	}
	return finishStream(src, cs, t, res, format, comp, w.off)
}

// finishStream reads what follows the image in the source, so the checksum covers all of it,
// verifies the checksum, and completes the target.
func finishStream(src io.Reader, cs *transfer.Checksum, t *Target, res *transfer.Result, format Format, comp Compression, vsize int64) error {
	if _, err := io.Copy(io.Discard, src); err != nil {
		return err
	}
	res.Format, res.Compression, res.VirtualSize = string(format), string(comp), vsize
	res.Digest = cs.Digest()
	if err := cs.Verify(); err != nil {
		return err
	}
	return t.Finish(vsize)
}

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
