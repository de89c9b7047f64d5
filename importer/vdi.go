package importer

import (
	"encoding/binary"
	"io"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// openVDI opens a VirtualBox image, dynamic or static: a block map of (usually 1 MiB) blocks.
// Differencing images have a parent and are refused.
func openVDI(ra io.ReaderAt) (*mappedImage, error) {
	h := make([]byte, 0x190)
	if n, err := ra.ReadAt(h, 0); n < len(h) {
		return nil, transfer.Permanent(transfer.ReasonTruncatedImage, "truncated vdi image: the header needs %d bytes: %v", len(h), err)
	}
	le := binary.LittleEndian
	if v := le.Uint32(h[0x44:]); v>>16 != 1 {
		return nil, transfer.Permanent(transfer.ReasonUnsupportedFormat, "vdi version %#x is not supported (1.x is)", v)
	}
	switch t := le.Uint32(h[0x4c:]); t {
	case 1, 2: // dynamic, static
	case 4:
		return nil, transfer.Permanent(transfer.ReasonBackingFile, "the vdi image is a differencing image with a parent: diskpipe imports only self-contained images")
	default:
		return nil, transfer.Permanent(transfer.ReasonUnsupportedFormat, "vdi image type %d is not supported", t)
	}
	bmapOff, dataOff := int64(le.Uint32(h[0x154:])), int64(le.Uint32(h[0x158:]))
	size := int64(le.Uint64(h[0x170:])) //nolint:gosec // checked below
	blockSize, extra := int64(le.Uint32(h[0x178:])), int64(le.Uint32(h[0x17c:]))
	blocks := int64(le.Uint32(h[0x180:]))
	if size <= 0 || size > 1<<44 || blockSize < 512 || blockSize%512 != 0 || blockSize > 64<<20 || blocks*blockSize < size {
		return nil, transfer.Permanent(transfer.ReasonMalformedImage, "malformed vdi image: %d blocks of %d bytes for a %d-byte disk", blocks, blockSize, size)
	}
	if extra != 0 { // as qemu: no image writer sets it
		return nil, transfer.Permanent(transfer.ReasonUnsupportedFormat, "vdi images with %d bytes of extra data per block are not supported", extra)
	}
	bmap, err := readTable(ra, bmapOff, blocks, "block map")
	if err != nil {
		return nil, err
	}
	return &mappedImage{ra: ra, typ: "vdi", size: size, blockSize: blockSize,
		lookup: func(b int64) (int64, bool, error) {
			e := le.Uint32(bmap[b*4:])
			if e >= 0xfffffffe { // unallocated or discarded: zeros
				return 0, false, nil
			}
			if int64(e) >= blocks {
				return 0, false, transfer.Permanent(transfer.ReasonMalformedImage, "malformed vdi image: block %d is stored as block %d of %d", b, e, blocks)
			}
			return dataOff + int64(e)*blockSize, true, nil
		}}, nil
}
