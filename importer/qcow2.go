package importer

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/lima-vm/go-qcow2reader/image"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// qcow2Header is the part of a qcow2 header diskpipe checks before reading an image, so that
// what it cannot import safely is refused with a clear reason rather than half-read.
type qcow2Header struct {
	Version          uint32
	BackingFile      string
	ClusterBits      uint32
	Size             uint64
	CryptMethod      uint32
	L1Size           uint32
	L1TableOffset    uint64
	RefcountOffset   uint64
	IncompatFeatures uint64
	CompressionType  uint8
}

// Where the header names its backing file: bytes 8 to 20 (the name's offset and length).
const qcow2BackingFields, qcow2BackingFieldsEnd = 8, 20

const (
	qcow2IncompatDirty        = 1 << 0
	qcow2IncompatCorrupt      = 1 << 1
	qcow2IncompatExternalData = 1 << 2
	qcow2IncompatCompression  = 1 << 3
	qcow2IncompatExtendedL2   = 1 << 4
	qcow2IncompatKnown        = qcow2IncompatDirty | qcow2IncompatCorrupt | qcow2IncompatExternalData |
		qcow2IncompatCompression | qcow2IncompatExtendedL2
)

// parseQcow2Header parses and checks the header in head against the image's file size
// (-1 when unknown). Every refusal is a permanent transfer error; an image that names a
// backing file is refused.
func parseQcow2Header(head []byte, fileSize int64) (*qcow2Header, error) {
	return parseQcow2(head, fileSize, false)
}

// parseQcow2 is parseQcow2Header; with layer, an image that names a backing file is a layer of
// a chain and is not refused for it: the name is kept in BackingFile (as %q-quoted text, or
// "(unreadable)") and never opened.
func parseQcow2(head []byte, fileSize int64, layer bool) (*qcow2Header, error) {
	malformed := func(format string, args ...any) error {
		return transfer.Permanent(transfer.ReasonMalformedImage, "malformed qcow2 image: "+format, args...)
	}
	if len(head) < 72 {
		return nil, transfer.Permanent(transfer.ReasonTruncatedImage, "truncated qcow2 image: the header needs 72 bytes, the image has %d", len(head))
	}
	be := binary.BigEndian
	h := &qcow2Header{
		Version:        be.Uint32(head[4:]),
		ClusterBits:    be.Uint32(head[20:]),
		Size:           be.Uint64(head[24:]),
		CryptMethod:    be.Uint32(head[32:]),
		L1Size:         be.Uint32(head[36:]),
		L1TableOffset:  be.Uint64(head[40:]),
		RefcountOffset: be.Uint64(head[48:]),
	}
	backingOff, backingLen := be.Uint64(head[8:]), be.Uint32(head[16:])
	if h.Version != 2 && h.Version != 3 {
		return nil, transfer.Permanent(transfer.ReasonUnsupportedFormat, "qcow2 version %d is not supported (2 and 3 are)", h.Version)
	}
	if h.Version == 3 {
		if len(head) < 104 {
			return nil, transfer.Permanent(transfer.ReasonTruncatedImage, "truncated qcow2 image: a version 3 header needs 104 bytes, the image has %d", len(head))
		}
		h.IncompatFeatures = be.Uint64(head[72:])
		headerLen := be.Uint32(head[100:])
		if headerLen < 104 || headerLen%8 != 0 {
			return nil, malformed("header length %d", headerLen)
		}
		if headerLen > 104 && len(head) > 104 {
			h.CompressionType = head[104]
		}
	}
	if backingOff != 0 {
		name := "(unreadable)"
		// Both numbers are the image's: compare without adding them, so that no sum wraps.
		if n := uint64(backingLen); n > 0 && n <= 1023 && backingOff < uint64(len(head)) && n <= uint64(len(head))-backingOff {
			name = fmt.Sprintf("%q", head[backingOff:backingOff+n])
		}
		h.BackingFile = name
	}
	if h.BackingFile != "" && !layer {
		name := h.BackingFile
		return nil, transfer.Permanent(transfer.ReasonBackingFile,
			"the qcow2 image has a backing file %s: diskpipe imports only self-contained images (flatten it with 'qemu-img convert -O qcow2')", name)
	}
	if h.CryptMethod != 0 {
		return nil, transfer.Permanent(transfer.ReasonEncrypted, "the qcow2 image is encrypted (method %d): diskpipe does not import encrypted images", h.CryptMethod)
	}
	if h.IncompatFeatures&qcow2IncompatExternalData != 0 {
		return nil, transfer.Permanent(transfer.ReasonUnsupportedFormat, "the qcow2 image keeps its data in an external data file: diskpipe imports only self-contained images")
	}
	if h.IncompatFeatures&qcow2IncompatCorrupt != 0 {
		return nil, transfer.Permanent(transfer.ReasonMalformedImage, "the qcow2 image is marked corrupt: repair it with 'qemu-img check -r all'")
	}
	if unknown := h.IncompatFeatures &^ qcow2IncompatKnown; unknown != 0 {
		return nil, transfer.Permanent(transfer.ReasonUnsupportedFormat, "the qcow2 image uses incompatible features diskpipe does not know (bits %#x)", unknown)
	}
	if h.CompressionType > 1 {
		return nil, transfer.Permanent(transfer.ReasonUnsupportedFormat, "qcow2 compression type %d is not supported (zlib and zstd are)", h.CompressionType)
	}
	if h.ClusterBits < 9 || h.ClusterBits > 21 {
		return nil, malformed("cluster bits %d (9 to 21 are valid)", h.ClusterBits)
	}
	if h.Size == 0 || h.Size > 1<<56 {
		return nil, malformed("virtual size %d", h.Size)
	}
	clusterSize := uint64(1) << h.ClusterBits
	l2Entries := clusterSize / 8
	if need := (h.Size + clusterSize*l2Entries - 1) / (clusterSize * l2Entries); uint64(h.L1Size) < need {
		return nil, malformed("L1 table of %d entries cannot map %d bytes", h.L1Size, h.Size)
	}
	// The L1 table is read whole before any cluster: qemu refuses one over 32 MiB (4 Mi entries,
	// 2 PiB of 64 KiB clusters), and so does diskpipe, before a byte of it is allocated.
	if uint64(h.L1Size)*8 > maxL1Bytes {
		return nil, malformed("its L1 table claims %d entries (%d MiB); images have at most %d MiB of L1 table", h.L1Size, uint64(h.L1Size)*8>>20, maxL1Bytes>>20)
	}
	if h.L1TableOffset == 0 || h.L1TableOffset%clusterSize != 0 {
		return nil, malformed("L1 table offset %#x is not cluster-aligned", h.L1TableOffset)
	}
	// Offsets past qcow2's 56 bits are refused before they are added to anything.
	if h.L1TableOffset > 1<<56 {
		return nil, malformed("L1 table offset %#x is past the largest image qcow2 can describe", h.L1TableOffset)
	}
	if fileSize >= 0 {
		if end := h.L1TableOffset + uint64(h.L1Size)*8; end > uint64(fileSize) {
			return nil, transfer.Permanent(transfer.ReasonTruncatedImage,
				"truncated qcow2 image: its L1 table ends at byte %d, the file has %d", end, fileSize)
		}
	}
	return h, nil
}

// maxL1Bytes is the largest L1 table diskpipe reads, qemu's QCOW_MAX_L1_SIZE.
const maxL1Bytes = 32 << 20

// checkedHead serves the image's first bytes from head, the bytes its header was checked in,
// and the rest from r: every later decision reads the header that was checked, never a second
// copy a server may change between requests.
type checkedHead struct {
	head []byte
	r    io.ReaderAt
}

func (c checkedHead) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, negativeOffset(off)
	}
	if off < int64(len(c.head)) {
		n := copy(p, c.head[off:])
		if n == len(p) {
			return n, nil
		}
		m, err := c.r.ReadAt(p[n:], off+int64(n))
		return n + m, err
	}
	return c.r.ReadAt(p, off)
}

// negativeOffset is the error for a read an image's tables send before its start: every
// reader of an image refuses one, whatever table arithmetic made it.
func negativeOffset(off int64) error {
	return transfer.Permanent(transfer.ReasonMalformedImage, "malformed image: its tables point at offset %d, before the start of the file", off)
}

// noBackingFile is go-qcow2reader's opener of backing files: diskpipe never opens one (the
// header check refuses such images first; this is the second lock).
func noBackingFile(io.ReaderAt, image.Type) (image.Image, error) {
	return nil, transfer.Permanent(transfer.ReasonBackingFile, "the image names a backing file: diskpipe imports only self-contained images")
}

// boundedReaderAt turns a read that starts past the end of a random-access image, which a
// well-formed image never asks for, into a TruncatedImage error that names the offset. A read
// that starts inside the image and runs past its end is short, with io.EOF: the reader asks
// for a compressed cluster's largest possible span, which may pass the end of the file.
type boundedReaderAt struct {
	r    io.ReaderAt
	size int64
}

func (b boundedReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, negativeOffset(off)
	}
	if off >= b.size {
		return 0, transfer.Permanent(transfer.ReasonTruncatedImage,
			"truncated image: it refers to bytes %d to %d, the file has %d", off, off+int64(len(p)), b.size)
	}
	if off+int64(len(p)) > b.size {
		n, err := b.r.ReadAt(p[:b.size-off], off)
		if err == nil {
			err = io.EOF
		}
		return n, err
	}
	return b.r.ReadAt(p, off)
}
