package importer

import (
	"io"

	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/lima-vm/go-qcow2reader/image/qcow2"
	"github.com/ulikunitz/xz"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

func init() {
	// qcow2 compressed clusters: klauspost's inflater is faster than compress/flate, and
	// go-qcow2reader has no zstd decompressor of its own.
	qcow2.SetDecompressor(qcow2.CompressionTypeZlib, func(r io.Reader) (io.ReadCloser, error) {
		return flate.NewReader(r), nil
	})
	qcow2.SetDecompressor(qcow2.CompressionTypeZstd, func(r io.Reader) (io.ReadCloser, error) {
		d, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true))
		if err != nil {
			return nil, err
		}
		return d.IOReadCloser(), nil
	})
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
		var x *xz.Reader
		x, err = xz.NewReader(r)
		out = io.NopCloser(x)
	case CompressionZstd:
		var d *zstd.Decoder
		d, err = zstd.NewReader(r, zstd.WithDecoderMaxMemory(512<<20))
		if err == nil {
			out = d.IOReadCloser()
		}
	default:
		return io.NopCloser(r), nil
	}
	if err != nil {
		return nil, transfer.Permanent(transfer.ReasonMalformedImage, "malformed %s stream: %w", c, err)
	}
	return out, nil
}
