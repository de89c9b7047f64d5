package importer

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// maxXzDict is the largest LZMA2 dictionary diskpipe decodes: xz's presets use at most 64 MiB
// (-9), and the decoder allocates what a block declares, up to 4 GiB, before it decodes a byte.
const maxXzDict = 64 << 20

// xzGuard passes an xz file through unchanged while it follows the file's structure (.xz
// format 1.2: stream header, blocks of LZMA2 chunks, index, footer, padding, more streams), so
// that it reads each block's header before the decoder does and refuses a dictionary larger
// than maxXzDict. It walks chunk headers only: no decoding, O(1) memory, one pass.
type xzGuard struct {
	r       *bufio.Reader
	pending []byte // structure bytes read by the parser, not yet returned
	skip    int64  // payload bytes to pass through before the next structure
	state   int
	check   int    // size of each block's check field
	block   int64  // bytes of the current block so far (header and data), for its padding
	records uint64 // index records still to read
	index   int64  // bytes of the index so far, for its padding
	err     error
}

const (
	xzStreamHeader = iota
	xzBlockOrIndex
	xzChunk
	xzIndex
	xzAfterStream
)

var xzCheckSizes = [16]int{0, 4, 4, 4, 8, 8, 8, 16, 16, 16, 32, 32, 32, 64, 64, 64}

func newXzGuard(r io.Reader) *xzGuard { return &xzGuard{r: bufio.NewReaderSize(r, 64<<10)} }

func (g *xzGuard) Read(p []byte) (int, error) {
	for len(g.pending) == 0 && g.skip == 0 {
		if g.err != nil {
			return 0, g.err
		}
		if g.err = g.next(); g.err != nil {
			// Refused: the decoder must not get the structure read (a block header it would
			// then act on), only the error.
			g.pending = nil
			return 0, g.err
		}
	}
	if len(g.pending) > 0 {
		n := copy(p, g.pending)
		g.pending = g.pending[n:]
		return n, nil
	}
	n, err := g.r.Read(p[:min(int64(len(p)), g.skip)])
	g.skip -= int64(n)
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// take reads n structure bytes.
func (g *xzGuard) take(n int) ([]byte, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(g.r, b); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	g.pending = append(g.pending, b...)
	return b, nil
}

// vli reads an xz variable-length integer from b at *i.
func readVLI(b []byte, i *int) (uint64, bool) {
	var v uint64
	for k := 0; k < 9 && *i < len(b); k++ {
		c := b[*i]
		*i++
		v |= uint64(c&0x7f) << (7 * k)
		if c&0x80 == 0 {
			return v, true
		}
	}
	return 0, false
}

func (g *xzGuard) malformed(format string, args ...any) error {
	return transfer.Permanent(transfer.ReasonMalformedImage, "malformed xz stream: "+format, args...)
}

// next reads the next structure and says how many payload bytes follow it.
func (g *xzGuard) next() error {
	switch g.state {
	case xzStreamHeader:
		h, err := g.take(12)
		if err != nil {
			return err
		}
		if string(h[:6]) != "\xfd7zXZ\x00" {
			return g.malformed("no stream header")
		}
		g.check, g.state = xzCheckSizes[h[7]&0x0f], xzBlockOrIndex
	case xzBlockOrIndex:
		b, err := g.take(1)
		if err != nil {
			return err
		}
		if b[0] == 0 {
			n, size, err := g.vli()
			g.records, g.index, g.state = n, 1+size, xzIndex
			return err
		}
		size := (int(b[0]) + 1) * 4
		h, err := g.take(size - 1)
		if err != nil {
			return err
		}
		if err := g.checkFilters(h[:len(h)-4]); err != nil {
			return err
		}
		g.block, g.state = int64(size), xzChunk
	case xzChunk:
		c, err := g.take(1)
		if err != nil {
			return err
		}
		g.block++
		switch ctl := c[0]; {
		case ctl == 0: // end of the block's data: padding and check follow
			g.skip = (4-g.block%4)%4 + int64(g.check)
			g.state = xzBlockOrIndex
		case ctl == 1 || ctl == 2:
			s, err := g.take(2)
			if err != nil {
				return err
			}
			g.skip = int64(binary.BigEndian.Uint16(s)) + 1
			g.block += 2 + g.skip
		case ctl >= 0x80:
			n := 4
			if ctl >= 0xc0 {
				n = 5
			}
			s, err := g.take(n)
			if err != nil {
				return err
			}
			g.skip = int64(binary.BigEndian.Uint16(s[2:4])) + 1
			g.block += int64(n) + g.skip
		default:
			return g.malformed("LZMA2 control byte %#x", ctl)
		}
	case xzIndex: // a record at a time, so that a long index is passed on as it is read
		if g.records > 0 {
			_, a, err := g.vli()
			if err != nil {
				return err
			}
			_, b, err := g.vli()
			g.records--
			g.index += a + b
			return err
		}
		if _, err := g.take(int((4-g.index%4)%4) + 4 + 12); err != nil { // padding, CRC32, stream footer
			return err
		}
		if tail := g.pending[len(g.pending)-2:]; string(tail) != "YZ" {
			return g.malformed("no stream footer")
		}
		g.state = xzAfterStream
	case xzAfterStream: // stream padding, another stream, or the end
		b, err := g.r.Peek(4)
		if errors.Is(err, io.EOF) && len(b) == 0 {
			return io.EOF
		}
		if err != nil {
			return g.malformed("%d bytes after the stream", len(b))
		}
		if string(b) == "\x00\x00\x00\x00" {
			_, err := g.take(4)
			return err
		}
		g.state = xzStreamHeader
	}
	return nil
}

// checkFilters reads a block header's filter flags (after its size byte, without its CRC32).
func (g *xzGuard) checkFilters(h []byte) error {
	if len(h) < 1 {
		return g.malformed("block header of %d bytes", len(h))
	}
	flags := h[0]
	i := 1
	for _, present := range []bool{flags&0x40 != 0, flags&0x80 != 0} { // compressed and uncompressed sizes
		if present {
			if _, ok := readVLI(h, &i); !ok {
				return g.malformed("block header sizes")
			}
		}
	}
	for f := 0; f <= int(flags&3); f++ {
		id, ok1 := readVLI(h, &i)
		n, ok2 := readVLI(h, &i)
		if !ok1 || !ok2 || uint64(len(h)-i) < n {
			return g.malformed("block header filters")
		}
		props := h[i : i+int(n)]
		i += int(n)
		if id != 0x21 { // BCJ and delta filters hold no dictionary
			continue
		}
		if len(props) != 1 || props[0] > 40 {
			return g.malformed("LZMA2 filter properties %x", props)
		}
		dict := uint64(2|props[0]&1) << (props[0]/2 + 11)
		if props[0] == 40 {
			dict = 1<<32 - 1
		}
		if dict > maxXzDict {
			return transfer.Permanent(transfer.ReasonMalformedImage,
				"the xz stream declares a %d MiB dictionary, more than the %d MiB diskpipe decodes (xz -9 uses 64 MiB): recompress it with a preset, e.g. xz -9",
				dict>>20, maxXzDict>>20)
		}
	}
	return nil
}

// vli reads a variable-length integer of the index and says how many bytes it took.
func (g *xzGuard) vli() (uint64, int64, error) {
	var v uint64
	for k := 0; k < 9; k++ {
		b, err := g.take(1)
		if err != nil {
			return 0, 0, err
		}
		v |= uint64(b[0]&0x7f) << (7 * k)
		if b[0]&0x80 == 0 {
			return v, int64(k + 1), nil
		}
	}
	return 0, 0, g.malformed("index")
}
