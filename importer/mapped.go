package importer

import (
	"io"

	"github.com/lima-vm/go-qcow2reader/image"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// mappedImage is a virtual disk cut into equal blocks, each stored at a host offset of the
// image file or not at all (reading as zeros): the shape of vpc, vdi and vmdk sparse images.
// It implements go-qcow2reader's image.Image, so the same converter writes it out.
type mappedImage struct {
	ra        io.ReaderAt
	typ       image.Type
	size      int64
	blockSize int64
	// lookup returns where block b's data starts, or ok false for a block of zeros. The
	// converter's workers call it at once: it must be safe for concurrent use.
	lookup func(b int64) (host int64, ok bool, err error)
	// readBlock, when set, reads a whole block whose data is stored in another form
	// (vmdk's compressed grains) into p; lookup still says whether it exists.
	readBlock func(host int64, p []byte) error
}

func (m *mappedImage) Type() image.Type { return m.typ }
func (m *mappedImage) Size() int64      { return m.size }
func (m *mappedImage) Readable() error  { return nil }
func (m *mappedImage) Close() error     { return nil }

// ReadAt reads the virtual disk.
func (m *mappedImage) ReadAt(p []byte, off int64) (int, error) {
	if off >= m.size {
		return 0, io.EOF
	}
	var eof error
	if rest := m.size - off; int64(len(p)) > rest {
		p, eof = p[:rest], io.EOF
	}
	var block []byte
	for done := 0; done < len(p); {
		b, within := (off+int64(done))/m.blockSize, (off+int64(done))%m.blockSize
		n := int(min(int64(len(p)-done), m.blockSize-within))
		host, ok, err := m.lookup(b)
		switch {
		case err != nil:
			return done, err
		case !ok:
			clear(p[done : done+n])
		case m.readBlock != nil:
			if block == nil {
				block = make([]byte, m.blockSize)
			}
			if err := m.readBlock(host, block); err != nil {
				return done, err
			}
			copy(p[done:done+n], block[within:])
		case host < 0:
			return done, negativeOffset(host)
		default:
			if _, err := m.ra.ReadAt(p[done:done+n], host+within); err != nil {
				return done, err
			}
		}
		done += n
	}
	return len(p), eof
}

// Extent describes the run of blocks from start that are all allocated or all zeros.
func (m *mappedImage) Extent(start, length int64) (image.Extent, error) {
	end := min(start+length, m.size)
	_, first, err := m.lookup(start / m.blockSize)
	if err != nil {
		return image.Extent{}, err
	}
	pos := (start/m.blockSize + 1) * m.blockSize
	for pos < end {
		_, ok, err := m.lookup(pos / m.blockSize)
		if err != nil {
			return image.Extent{}, err
		}
		if ok != first {
			break
		}
		pos += m.blockSize
	}
	return image.Extent{Start: start, Length: min(pos, end) - start, Allocated: first, Zero: !first,
		Compressed: first && m.readBlock != nil}, nil
}

// maxTableEntries bounds a block table (64 MiB; 16 TiB of 1 MiB blocks), so that a hostile
// header cannot make the importer allocate without limit.
const maxTableEntries = 16 << 20

// readTable reads a table of n uint32 entries at off.
func readTable(ra io.ReaderAt, off int64, n int64, what string) ([]byte, error) {
	if n < 0 || n > maxTableEntries || off < 0 {
		return nil, transfer.Permanent(transfer.ReasonMalformedImage, "malformed image: %s of %d entries", what, n)
	}
	t := make([]byte, n*4)
	if _, err := ra.ReadAt(t, off); err != nil && (err != io.EOF || len(t) > 0) {
		if err == io.EOF {
			return nil, transfer.Permanent(transfer.ReasonTruncatedImage, "truncated image: its %s ends past the file", what)
		}
		return nil, err
	}
	return t, nil
}
