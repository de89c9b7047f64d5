package importer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"regexp"
	"sync"

	"github.com/klauspost/compress/zlib"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

const (
	vmdkFlagCompressed = 1 << 16
	vmdkFlagMarkers    = 1 << 17
	vmdkGDAtEnd        = ^uint64(0)
)

// vmdkHeader is what diskpipe reads of a sparse extent's header (or footer).
type vmdkHeader struct {
	flags            uint32
	size, grain      int64 // bytes
	descOff, descLen int64 // bytes
	gtes             int64 // entries per grain table
	gdSector         uint64
	overhead         int64 // bytes before the first grain
}

// parseVMDKHeader reads the 512-byte header h of a KDMV extent.
func parseVMDKHeader(h []byte) (vmdkHeader, error) {
	le := binary.LittleEndian
	// Every sector count is checked before it is multiplied: a crafted one must not wrap into
	// a negative or small offset.
	fields := []struct {
		what string
		n    uint64
	}{{"capacity", le.Uint64(h[12:])}, {"grain size", le.Uint64(h[20:])}, {"descriptor offset", le.Uint64(h[28:])},
		{"descriptor size", le.Uint64(h[36:])}, {"overhead", le.Uint64(h[64:])}}
	for _, f := range fields {
		if f.n > maxVMDKSectors {
			return vmdkHeader{}, transfer.Permanent(transfer.ReasonMalformedImage, "malformed vmdk image: its %s is %d sectors", f.what, f.n)
		}
	}
	inBytes := func(i int) int64 { return int64(fields[i].n) * 512 } //nolint:gosec // at most maxVMDKSectors
	vh := vmdkHeader{
		flags: le.Uint32(h[8:]), size: inBytes(0), grain: inBytes(1), descOff: inBytes(2), descLen: inBytes(3), overhead: inBytes(4),
		gtes: int64(le.Uint32(h[44:])), gdSector: le.Uint64(h[56:]),
	}
	if vh.size <= 0 || vh.size > 1<<44 || vh.grain < 512 || vh.grain > 16<<20 || vh.gtes <= 0 || vh.gtes > 1<<16 {
		return vh, transfer.Permanent(transfer.ReasonMalformedImage, "malformed vmdk image: %d-byte disk, %d-byte grains, %d entries per table", vh.size, vh.grain, vh.gtes)
	}
	if vh.gdSector != vmdkGDAtEnd && vh.gdSector > maxVMDKSectors {
		return vh, transfer.Permanent(transfer.ReasonMalformedImage, "malformed vmdk image: its grain directory is at sector %d", vh.gdSector)
	}
	return vh, nil
}

// maxVMDKSectors bounds every sector number or count of a vmdk header: 2^40 sectors (512 TiB)
// is past any file diskpipe imports, and times 512 leaves sums of them far from wrapping.
const maxVMDKSectors = 1 << 40

// gdEntries is how many grain tables map the extent's disk: qemu rounds up, and so must a
// reader, or the last grains have no table.
func (vh vmdkHeader) gdEntries() int64 {
	grains := (vh.size + vh.grain - 1) / vh.grain
	return (grains + vh.gtes - 1) / vh.gtes
}

// checkVMDKDescriptor refuses an image whose descriptor names a parent.
func checkVMDKDescriptor(desc []byte) error {
	if m := vmdkParent.FindSubmatch(desc); m != nil && !bytes.EqualFold(m[1], []byte("ffffffff")) {
		return transfer.Permanent(transfer.ReasonBackingFile, "the vmdk image has a parent: diskpipe imports only self-contained images")
	}
	return nil
}

var vmdkParent = regexp.MustCompile(`(?m)^parentCID\s*=\s*"?([0-9a-fA-F]+)"?`)

// openVMDK opens a hosted sparse extent (KDMV) — monolithicSparse, or streamOptimized with
// compressed grains. A bare descriptor names extents in other files and is refused, as are
// images with a parent.
func openVMDK(ra io.ReaderAt, fileSize int64) (*mappedImage, error) {
	h := make([]byte, 512)
	if n, err := ra.ReadAt(h, 0); n < 80 {
		return nil, transfer.Permanent(transfer.ReasonTruncatedImage, "truncated vmdk image: %v", err)
	}
	if !bytes.HasPrefix(h, []byte("KDMV")) {
		return nil, transfer.Permanent(transfer.ReasonUnsupportedFormat,
			"the vmdk image is a descriptor whose data lies in other files (or an old COWD extent): convert it to one file with 'qemu-img convert -O qcow2'")
	}
	le := binary.LittleEndian
	if le.Uint64(h[56:]) == vmdkGDAtEnd { // streamOptimized: the real header is the footer
		if fileSize < 1536 {
			return nil, transfer.Permanent(transfer.ReasonTruncatedImage, "truncated vmdk image: no footer")
		}
		if _, err := ra.ReadAt(h, fileSize-1024); err != nil && err != io.EOF {
			return nil, err
		}
		if !bytes.HasPrefix(h, []byte("KDMV")) {
			return nil, transfer.Permanent(transfer.ReasonTruncatedImage, "truncated vmdk image: the footer is missing")
		}
	}
	vh, err := parseVMDKHeader(h)
	if err != nil {
		return nil, err
	}
	size, grain, gtes := vh.size, vh.grain, vh.gtes
	if vh.descLen > 0 && vh.descLen <= 1<<20 {
		desc := make([]byte, vh.descLen)
		if _, err := ra.ReadAt(desc, vh.descOff); err == nil || err == io.EOF {
			if err := checkVMDKDescriptor(desc); err != nil {
				return nil, err
			}
		}
	}
	gdOff := int64(vh.gdSector) * 512 //nolint:gosec // checked by readTable
	gd, err := readTable(ra, gdOff, vh.gdEntries(), "grain directory")
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex            // lookup runs on the converter's workers at once
	tables := map[int64][]byte{} // grain tables, read once each while the cache has room
	cached := int64(0)
	m := &mappedImage{ra: ra, typ: "vmdk", size: size, blockSize: grain}
	m.lookup = func(b int64) (int64, bool, error) {
		mu.Lock()
		defer mu.Unlock()
		t := b / gtes
		gt, ok := tables[t]
		if !ok {
			at := int64(le.Uint32(gd[t*4:])) * 512
			if at == 0 {
				return 0, false, nil
			}
			if gt, err = readTable(ra, at, gtes, "grain table"); err != nil {
				return 0, false, err
			}
			if cached += int64(len(gt)); cached > maxGrainTableCache {
				// The converter walks the disk in order: the tables behind it are done with.
				clear(tables)
				cached = int64(len(gt))
			}
			tables[t] = gt
		}
		s := int64(le.Uint32(gt[(b%gtes)*4:]))
		if s <= 1 { // 0: unallocated, 1: a zero grain
			return 0, false, nil
		}
		return s * 512, true, nil
	}
	if vh.flags&vmdkFlagCompressed != 0 {
		m.readBlock = func(host int64, p []byte) error { return readVMDKGrain(ra, host, p) }
	}
	return m, nil
}

// maxGrainTableCache bounds the grain tables kept in memory (a table is up to 256 KiB; a 2 TiB
// disk of 64 KiB grains has 128 MiB of them).
const maxGrainTableCache = 16 << 20

// readVMDKGrain inflates a streamOptimized grain: a 12-byte marker (LBA, size), then zlib data.
func readVMDKGrain(ra io.ReaderAt, host int64, p []byte) error {
	marker := make([]byte, 12)
	if _, err := ra.ReadAt(marker, host); err != nil {
		return transfer.Permanent(transfer.ReasonTruncatedImage, "truncated vmdk image: grain at %d: %v", host, err)
	}
	n := int64(binary.LittleEndian.Uint32(marker[8:]))
	if n == 0 || n > maxGrainData(int64(len(p))) {
		return transfer.Permanent(transfer.ReasonMalformedImage, "malformed vmdk image: a %d-byte grain at %d", n, host)
	}
	z := make([]byte, n)
	if _, err := ra.ReadAt(z, host+12); err != nil && err != io.EOF {
		return err
	}
	return inflateGrain(z, p, host)
}

// maxGrainData bounds a compressed grain of grain bytes: zlib adds at most a few bytes per
// 16 KiB to data it cannot compress.
func maxGrainData(grain int64) int64 { return grain + grain/1024 + 4096 }

// zlibReaders are reset for each grain.
var zlibReaders sync.Pool

// inflateGrain decodes the zlib stream z into p, zero-filling what it does not cover (the
// last grain of a disk may be short). host names the grain in errors.
func inflateGrain(z, p []byte, host int64) error {
	var zr io.ReadCloser
	if r, ok := zlibReaders.Get().(io.ReadCloser); ok && r.(zlib.Resetter).Reset(bytes.NewReader(z), nil) == nil {
		zr = r
	} else {
		var err error
		if zr, err = zlib.NewReader(bytes.NewReader(z)); err != nil {
			return transfer.Permanent(transfer.ReasonMalformedImage, "malformed vmdk grain at %d: %w", host, err)
		}
	}
	defer zlibReaders.Put(zr)
	got := 0
	for got < len(p) {
		n, err := zr.Read(p[got:])
		got += n
		if errors.Is(err, io.EOF) { // the stream ended, its checksum intact
			break
		}
		if err != nil {
			return transfer.Permanent(transfer.ReasonMalformedImage, "malformed vmdk grain at %d: %w", host, err)
		}
	}
	if got == len(p) { // a full grain: the stream must end here
		if n, err := zr.Read(make([]byte, 1)); n > 0 || !errors.Is(err, io.EOF) {
			return transfer.Permanent(transfer.ReasonMalformedImage, "malformed vmdk grain at %d: it does not end after its %d bytes (%v)", host, len(p), err)
		}
	}
	clear(p[got:])
	return nil
}
