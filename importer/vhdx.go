package importer

import (
	"bytes"
	"encoding/binary"
	"io"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// GUIDs as VHDX stores them (the first three fields little-endian).
var (
	vhdxRegionBAT      = guid(0x2DC27766, 0xF623, 0x4200, 0x9D64, 0x115E9BFD4A08)
	vhdxRegionMetadata = guid(0x8B7CA206, 0x4790, 0x4B9A, 0xB8FE, 0x575F050F886E)
	vhdxFileParameters = guid(0xCAA16737, 0xFA36, 0x4D43, 0xB3B6, 0x33F0AA44E76B)
	vhdxVirtualSize    = guid(0x2FA54224, 0xCD1B, 0x4876, 0xB211, 0x5DBED83BF4B8)
	vhdxLogicalSector  = guid(0x8141BF1D, 0xA96F, 0x4709, 0xBA47, 0xF233A8FAAB5F)
)

func guid(a uint32, b, c, d uint16, e uint64) []byte {
	g := make([]byte, 16)
	binary.LittleEndian.PutUint32(g, a)
	binary.LittleEndian.PutUint16(g[4:], b)
	binary.LittleEndian.PutUint16(g[6:], c)
	binary.BigEndian.PutUint16(g[8:], d)
	for i := 0; i < 6; i++ {
		g[10+i] = byte(e >> (40 - 8*i))
	}
	return g
}

// openVHDX opens a Hyper-V VHDX image: headers at 64 and 128 KiB (the newer wins), a region
// table that locates the block allocation table and the metadata, and payload blocks of
// (usually) 32 MiB with sector-bitmap entries interleaved in the table. Images with a log to
// replay, or with a parent, are refused.
func openVHDX(ra io.ReaderAt, fileSize int64) (*mappedImage, error) {
	malformed := func(what string) error {
		return transfer.Permanent(transfer.ReasonMalformedImage, "malformed vhdx image: %s", what)
	}
	read := func(off, n int64) ([]byte, error) {
		if off < 0 || n < 0 || n > 64<<20 || off > fileSize-n {
			return nil, transfer.Permanent(transfer.ReasonTruncatedImage, "truncated vhdx image: %d bytes at %d lie past its end", n, off)
		}
		b := make([]byte, n)
		if _, err := ra.ReadAt(b, off); err != nil && err != io.EOF {
			return nil, err
		}
		return b, nil
	}
	le := binary.LittleEndian
	var header []byte
	for _, off := range []int64{64 << 10, 128 << 10} {
		h, err := read(off, 4096)
		if err != nil {
			return nil, err
		}
		if bytes.HasPrefix(h, []byte("head")) && (header == nil || le.Uint64(h[8:]) > le.Uint64(header[8:])) {
			header = h
		}
	}
	if header == nil {
		return nil, malformed("no valid header")
	}
	if !bytes.Equal(header[48:64], make([]byte, 16)) && le.Uint32(header[68:]) != 0 {
		return nil, transfer.Permanent(transfer.ReasonUnsupportedFormat,
			"the vhdx image has a log to replay (it was not closed cleanly): open it once with qemu-img or Hyper-V first")
	}
	regions, err := read(192<<10, 64<<10)
	if err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(regions, []byte("regi")) {
		return nil, malformed("no region table")
	}
	var batOff, batLen, metaOff, metaLen int64
	for i, n := int64(0), int64(le.Uint32(regions[8:])); i < n && 16+i*32+32 <= int64(len(regions)); i++ {
		e := regions[16+i*32:]
		off, length := int64(le.Uint64(e[16:])), int64(le.Uint32(e[24:])) //nolint:gosec // checked by read
		switch {
		case bytes.Equal(e[:16], vhdxRegionBAT):
			batOff, batLen = off, length
		case bytes.Equal(e[:16], vhdxRegionMetadata):
			metaOff, metaLen = off, length
		}
	}
	meta, err := read(metaOff, metaLen)
	if err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(meta, []byte("metadata")) {
		return nil, malformed("no metadata table")
	}
	var blockSize, size, sector int64
	for i, n := int64(0), int64(le.Uint16(meta[10:])); i < n && 32+i*32+32 <= int64(len(meta)); i++ {
		e := meta[32+i*32:]
		off := int64(le.Uint32(e[16:]))
		if off+8 > int64(len(meta)) {
			return nil, malformed("metadata item past the metadata region")
		}
		switch v := meta[off:]; {
		case bytes.Equal(e[:16], vhdxFileParameters):
			blockSize = int64(le.Uint32(v))
			if le.Uint32(v[4:])&2 != 0 {
				return nil, transfer.Permanent(transfer.ReasonBackingFile, "the vhdx image is a differencing disk with a parent: diskpipe imports only self-contained images")
			}
		case bytes.Equal(e[:16], vhdxVirtualSize):
			size = int64(le.Uint64(v)) //nolint:gosec // checked below
		case bytes.Equal(e[:16], vhdxLogicalSector):
			sector = int64(le.Uint32(v))
		}
	}
	if blockSize < 1<<20 || blockSize > 256<<20 || size <= 0 || size > 64<<40 || (sector != 512 && sector != 4096) {
		return nil, malformed("block size, disk size or sector size out of range")
	}
	chunkRatio := (int64(1) << 23) * sector / blockSize
	blocks := (size + blockSize - 1) / blockSize
	entries := blocks + (blocks-1)/chunkRatio
	if entries*8 > batLen {
		return nil, malformed("the block allocation table is too small for the disk")
	}
	bat, err := read(batOff, entries*8)
	if err != nil {
		return nil, err
	}
	return &mappedImage{ra: ra, typ: "vhdx", size: size, blockSize: blockSize,
		lookup: func(b int64) (int64, bool, error) {
			e := le.Uint64(bat[(b+b/chunkRatio)*8:])
			switch e & 7 {
			case 6, 7: // fully or partially present
				if e>>20 >= uint64(fileSize)>>20+1 { //nolint:gosec // fileSize is positive
					return 0, false, transfer.Permanent(transfer.ReasonTruncatedImage,
						"truncated vhdx image: block %d lies at MiB %d, the file has %d bytes", b, e>>20, fileSize)
				}
				return int64(e>>20) << 20, true, nil //nolint:gosec // a file offset in MiB, checked above
			default: // not present, undefined, zero, unmapped: zeros, there being no parent
				return 0, false, nil
			}
		}}, nil
}
