package importer

import (
	"bytes"
	"encoding/binary"
	"io"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// openVPC opens a VHD (vpc) image: fixed (raw data then a footer) or dynamic (a block
// allocation table of 2 MiB blocks). Differencing images have a parent and are refused.
func openVPC(ra io.ReaderAt, fileSize int64) (*mappedImage, error) {
	if fileSize < 512 {
		return nil, transfer.Permanent(transfer.ReasonTruncatedImage, "truncated vpc image: %d bytes", fileSize)
	}
	footer := make([]byte, 512)
	if _, err := ra.ReadAt(footer, fileSize-512); err != nil && err != io.EOF {
		return nil, err
	}
	if !bytes.HasPrefix(footer, []byte("conectix")) { // a dynamic image copies it at the start
		if _, err := ra.ReadAt(footer, 0); err != nil && err != io.EOF {
			return nil, err
		}
	}
	be := binary.BigEndian
	size, err := vpcSize(footer)
	if err != nil {
		return nil, err
	}
	switch diskType := be.Uint32(footer[60:]); diskType {
	case 2: // fixed
		if size > fileSize-512 {
			return nil, transfer.Permanent(transfer.ReasonTruncatedImage, "truncated vpc image: %d bytes of data for a %d-byte disk", fileSize-512, size)
		}
		return &mappedImage{ra: ra, typ: "vpc", size: size, blockSize: 2 << 20,
			lookup: func(b int64) (int64, bool, error) { return b * (2 << 20), true, nil }}, nil
	case 3: // dynamic
	case 4:
		return nil, transfer.Permanent(transfer.ReasonBackingFile, "the vpc image is a differencing disk with a parent: diskpipe imports only self-contained images")
	default:
		return nil, transfer.Permanent(transfer.ReasonUnsupportedFormat, "vpc disk type %d is not supported", diskType)
	}
	hdr := make([]byte, 1024)
	hdrOff := int64(be.Uint64(footer[16:])) //nolint:gosec // checked below
	if hdrOff <= 0 || hdrOff > fileSize-1024 {
		return nil, transfer.Permanent(transfer.ReasonMalformedImage, "malformed vpc image: dynamic header at %d", hdrOff)
	}
	if _, err := ra.ReadAt(hdr, hdrOff); err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(hdr, []byte("cxsparse")) {
		return nil, transfer.Permanent(transfer.ReasonMalformedImage, "malformed vpc image: no dynamic header")
	}
	batOff := int64(be.Uint64(hdr[16:])) //nolint:gosec // checked by readTable
	entries := int64(be.Uint32(hdr[28:]))
	blockSize := int64(be.Uint32(hdr[32:]))
	if blockSize < 512 || blockSize%512 != 0 || blockSize > 256<<20 || entries*blockSize < size {
		return nil, transfer.Permanent(transfer.ReasonMalformedImage, "malformed vpc image: %d blocks of %d bytes for a %d-byte disk", entries, blockSize, size)
	}
	bat, err := readTable(ra, batOff, entries, "block allocation table")
	if err != nil {
		return nil, err
	}
	bitmap := (blockSize/512/8 + 511) / 512 * 512 // each block starts with a sector bitmap
	return &mappedImage{ra: ra, typ: "vpc", size: size, blockSize: blockSize,
		lookup: func(b int64) (int64, bool, error) {
			s := be.Uint32(bat[b*4:])
			if s == 0xffffffff {
				return 0, false, nil
			}
			return int64(s)*512 + bitmap, true, nil
		}}, nil
}

// vpcSize is the disk's size as qemu reads it: the CHS geometry's, except for the creators
// that size disks by the footer's current size, and for disks at the maximum geometry.
func vpcSize(footer []byte) (int64, error) {
	be := binary.BigEndian
	chs := int64(be.Uint16(footer[56:])) * int64(footer[58]) * int64(footer[59]) * 512
	current := int64(be.Uint64(footer[48:])) //nolint:gosec // checked below
	creator := string(footer[28:32])
	useCHS := creator != "win " && creator != "qem2" && creator != "d2v " && creator != "CTXS" && creator[:3] != "tap"
	size := chs
	if !useCHS || chs == 65535*16*255*512 {
		size = current
	}
	if size <= 0 || size > 1<<44 {
		return 0, transfer.Permanent(transfer.ReasonMalformedImage, "malformed vpc image: disk size %d", size)
	}
	return size, nil
}
