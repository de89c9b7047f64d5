package exporter

import (
	"bytes"
	"fmt"
	"sync"

	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/zstd"
)

// Compression of qcow2 clusters.
type Compression string

// Compressions an export can use.
const (
	CompressionNone Compression = "none"
	CompressionZlib Compression = "zlib"
	CompressionZstd Compression = "zstd"
)

// qemuDeflateWindow: qemu inflates qcow2 clusters with a 4 KiB window (inflateInit2 with
// -12), so a cluster's deflate stream must never refer further back than 4 KiB.
const qemuDeflateWindow = 4096

// compressor compresses one cluster at a time; each worker owns one.
type compressor struct {
	kind Compression
	buf  bytes.Buffer
	out  []byte
	fw   *flate.Writer
	zw   *zstd.Encoder
}

var zstdEncoders = sync.Pool{New: func() any {
	e, _ := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithEncoderLevel(zstd.SpeedDefault),
		zstd.WithLowerEncoderMem(true))
	return e
}}

func newCompressor(kind Compression) (*compressor, error) {
	c := &compressor{kind: kind}
	switch kind {
	case CompressionZlib:
		fw, err := flate.NewWriterWindow(&c.buf, qemuDeflateWindow)
		if err != nil {
			return nil, err
		}
		c.fw = fw
	case CompressionZstd:
		c.zw = zstdEncoders.Get().(*zstd.Encoder)
	case CompressionNone:
	default:
		return nil, fmt.Errorf("unknown compression %q", kind)
	}
	return c, nil
}

// compress returns the compressed cluster, valid until the next call.
func (c *compressor) compress(cluster []byte) ([]byte, error) {
	c.buf.Reset()
	switch c.kind {
	case CompressionZlib:
		c.fw.Reset(&c.buf)
		if _, err := c.fw.Write(cluster); err != nil {
			return nil, err
		}
		if err := c.fw.Close(); err != nil {
			return nil, err
		}
		return c.buf.Bytes(), nil
	case CompressionZstd:
		c.out = c.zw.EncodeAll(cluster, c.out[:0])
		return c.out, nil
	}
	return cluster, nil
}

func (c *compressor) release() {
	if c.zw != nil {
		zstdEncoders.Put(c.zw)
		c.zw = nil
	}
}
