package importer

import (
	"bytes"
	"errors"
	"io"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/lima-vm/go-qcow2reader/image/qcow2"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

func init() {
	qcow2.SetDecompressor(qcow2.CompressionTypeZlib, inflateCluster)
	qcow2.SetDecompressor(qcow2.CompressionTypeZstd, unzstdCluster)
}

// A qcow2 image with compressed clusters asks for a decompressor per cluster, handing it a
// section of the image to read. Creating an inflater and feeding it through many small reads
// per 64 KiB cluster dominated the import's CPU time, so each cluster's compressed bytes are
// read with one ReadAt into a pooled buffer and decoded whole by libdeflate where the build
// has cgo (inflate_libdeflate.go), else by a pooled, reset streaming inflater (klauspost's,
// faster than compress/flate); zstd clusters likewise get pooled decoders.
var (
	clusterBuffers = sync.Pool{New: func() any { return new([]byte) }}
	inflaters      = sync.Pool{New: func() any { return flate.NewReader(bytes.NewReader(nil)) }}
	zstdDecoders   = sync.Pool{New: func() any {
		// A cluster is at most 2 MiB, so no frame of one needs a larger window.
		d, _ := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true), zstd.WithDecoderMaxWindow(2*maxClusterSize))
		return d
	}}
)

// readCluster reads a compressed cluster's bytes (the section may run past the image's end).
func readCluster(r io.Reader) (*[]byte, error) {
	bp := clusterBuffers.Get().(*[]byte)
	sr, ok := r.(*io.SectionReader)
	if !ok {
		b, err := io.ReadAll(r)
		*bp = b
		return bp, err
	}
	if int64(cap(*bp)) < sr.Size() {
		*bp = make([]byte, sr.Size())
	}
	n, err := sr.ReadAt((*bp)[:sr.Size()], 0)
	*bp = (*bp)[:n]
	if errors.Is(err, io.EOF) {
		err = nil
	}
	return bp, err
}

// maxClusterSize is qcow2's largest cluster (cluster bits 21): one decoded cluster always fits.
const maxClusterSize = 2 << 20

// Decoded clusters go into pooled buffers of two sizes: most images have 64 KiB clusters, and
// a buffer of qcow2's largest for each of eight workers weighed 16 MiB in the heap the
// collector paces itself on. Once a cluster needs a large one, large ones are taken first.
var (
	inflatedSmall = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}
	inflatedLarge = sync.Pool{New: func() any { b := make([]byte, maxClusterSize); return &b }}
	largeClusters atomic.Bool
)

// inflateCluster decodes a compressed cluster whole with the fast decoder (inflater), or,
// for a stream it does not take, with the streaming one.
func inflateCluster(r io.Reader) (io.ReadCloser, error) {
	bp, err := readCluster(r)
	if err != nil {
		clusterBuffers.Put(bp)
		return nil, err
	}
	if inflater == "go" {
		return inflateStream(bp)
	}
	pools := []*sync.Pool{&inflatedSmall, &inflatedLarge}
	if largeClusters.Load() {
		pools = pools[1:]
	}
	for _, pool := range pools {
		out := pool.Get().(*[]byte)
		if n, ok := inflateInto(*bp, *out); ok {
			if pool == &inflatedLarge {
				largeClusters.Store(true)
			}
			clusterBuffers.Put(bp)
			return &pooledReader{Reader: bytes.NewReader((*out)[:n]), release: func() { pool.Put(out) }}, nil
		}
		pool.Put(out)
	}
	return inflateStream(bp)
}

// inflateStream decodes a cluster with klauspost's streaming inflater, which, like qemu,
// gives the bytes a cut stream decodes to before it fails.
func inflateStream(bp *[]byte) (io.ReadCloser, error) {
	fr := inflaters.Get().(io.ReadCloser)
	if err := fr.(flate.Resetter).Reset(bytes.NewReader(*bp), nil); err != nil {
		return nil, err
	}
	return &pooledReader{Reader: fr, release: func() { inflaters.Put(fr); clusterBuffers.Put(bp) }}, nil
}

func unzstdCluster(r io.Reader) (io.ReadCloser, error) {
	bp, err := readCluster(r)
	if err != nil {
		clusterBuffers.Put(bp)
		return nil, err
	}
	// The section is rounded up to whole sectors, so the next cluster's frame may follow:
	// a streaming decoder stops when the reader has its cluster, where DecodeAll would go on.
	d := zstdDecoders.Get().(*zstd.Decoder)
	if err := d.Reset(bytes.NewReader(*bp)); err != nil {
		zstdDecoders.Put(d)
		clusterBuffers.Put(bp)
		return nil, err
	}
	return &pooledReader{Reader: d, release: func() { zstdDecoders.Put(d); clusterBuffers.Put(bp) }}, nil
}

// pooledReader gives its buffers back when closed.
type pooledReader struct {
	io.Reader
	release func()
}

func (p *pooledReader) Close() error { p.release(); return nil }

// maxZstdWindow is the largest zstd window diskpipe decodes: 128 MiB, what zstd --long and
// --ultra -22 use; a frame may declare up to 3.75 TB, which the decoder would allocate.
const maxZstdWindow = 128 << 20

// zstdWindow names a frame whose window is over maxZstdWindow.
type zstdWindow struct{ io.ReadCloser }

func (z *zstdWindow) Read(p []byte) (int, error) {
	n, err := z.ReadCloser.Read(p)
	if errors.Is(err, zstd.ErrWindowSizeExceeded) {
		err = transfer.Permanent(transfer.ReasonMalformedImage,
			"the zstd stream declares a window larger than the %d MiB diskpipe decodes (zstd --long and --ultra -22 use 128 MiB): recompress it", maxZstdWindow>>20)
	}
	return n, err
}

// decompress unwraps a compressed stream.
func decompress(c Compression, r io.Reader) (io.ReadCloser, error) {
	var (
		out io.ReadCloser
		err error
	)
	switch c {
	case CompressionGzip:
		out, err = gzip.NewReader(r)
	case CompressionXz:
		out, err = newUnxz(newXzGuard(r))
	case CompressionZstd:
		var d *zstd.Decoder
		// One goroutine: klauspost's asynchronous block decoding spent more than it saved
		// on two cores, beside the importer's writes (a 4 GiB disk's stream decoded in
		// 2.26 s instead of 2.66 s, twice each).
		d, err = zstd.NewReader(r, zstd.WithDecoderMaxMemory(512<<20), zstd.WithDecoderMaxWindow(maxZstdWindow), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderConcurrency(1))
		if err == nil {
			out = &zstdWindow{d.IOReadCloser()}
		}
	default:
		return io.NopCloser(r), nil
	}
	if err != nil {
		return nil, transfer.Permanent(transfer.ReasonMalformedImage, "malformed %s stream: %w", c, err)
	}
	return out, nil
}
