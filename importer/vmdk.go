package importer

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"io"
	"regexp"
	"sync"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

const (
	vmdkFlagCompressed = 1 << 16
	vmdkGDAtEnd        = ^uint64(0)
)

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
	flags := le.Uint32(h[8:])
	size := int64(le.Uint64(h[12:])) * 512                                         //nolint:gosec // checked below
	grain := int64(le.Uint64(h[20:])) * 512                                        //nolint:gosec // checked below
	descOff, descLen := int64(le.Uint64(h[28:]))*512, int64(le.Uint64(h[36:]))*512 //nolint:gosec // bounded below
	gtes := int64(le.Uint32(h[44:]))
	gdOff := int64(le.Uint64(h[56:])) * 512 //nolint:gosec // checked by readTable
	if size <= 0 || size > 1<<44 || grain < 512 || grain > 16<<20 || gtes <= 0 || gtes > 1<<16 {
		return nil, transfer.Permanent(transfer.ReasonMalformedImage, "malformed vmdk image: %d-byte disk, %d-byte grains, %d entries per table", size, grain, gtes)
	}
	if descLen > 0 && descLen <= 1<<20 {
		desc := make([]byte, descLen)
		if _, err := ra.ReadAt(desc, descOff); err == nil || err == io.EOF {
			if m := vmdkParent.FindSubmatch(desc); m != nil && !bytes.EqualFold(m[1], []byte("ffffffff")) {
				return nil, transfer.Permanent(transfer.ReasonBackingFile, "the vmdk image has a parent: diskpipe imports only self-contained images")
			}
		}
	}
	gdEntries := (size/grain + gtes - 1) / gtes
	gd, err := readTable(ra, gdOff, gdEntries, "grain directory")
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex            // lookup runs on the converter's workers at once
	tables := map[int64][]byte{} // grain tables, read once each
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
			tables[t] = gt
		}
		s := int64(le.Uint32(gt[(b%gtes)*4:]))
		if s <= 1 { // 0: unallocated, 1: a zero grain
			return 0, false, nil
		}
		return s * 512, true, nil
	}
	if flags&vmdkFlagCompressed != 0 {
		m.readBlock = func(host int64, p []byte) error { return readVMDKGrain(ra, host, p) }
	}
	return m, nil
}

// readVMDKGrain inflates a streamOptimized grain: a 12-byte marker (LBA, size), then zlib data.
func readVMDKGrain(ra io.ReaderAt, host int64, p []byte) error {
	marker := make([]byte, 12)
	if _, err := ra.ReadAt(marker, host); err != nil {
		return transfer.Permanent(transfer.ReasonTruncatedImage, "truncated vmdk image: grain at %d: %v", host, err)
	}
	n := int64(binary.LittleEndian.Uint32(marker[8:]))
	if n == 0 || n > int64(len(p))+4096 {
		return transfer.Permanent(transfer.ReasonMalformedImage, "malformed vmdk image: a %d-byte grain at %d", n, host)
	}
	z := make([]byte, n)
	if _, err := ra.ReadAt(z, host+12); err != nil && err != io.EOF {
		return err
	}
	zr, err := zlib.NewReader(bytes.NewReader(z))
	if err != nil {
		return transfer.Permanent(transfer.ReasonMalformedImage, "malformed vmdk grain at %d: %w", host, err)
	}
	got, err := io.ReadFull(zr, p)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return transfer.Permanent(transfer.ReasonMalformedImage, "malformed vmdk grain at %d: %w", host, err)
	}
	clear(p[got:]) // the last grain of a disk may be short
	return nil
}
