package importer

import (
	"encoding/binary"
	"errors"
	"io"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// A streamOptimized vmdk is made to be read front to back: each compressed grain follows a
// marker naming its guest sector, so grains are written as they arrive and nothing is held.
// Two layouts exist. qemu-img writes the grain directory and tables before the grains (in the
// header's overhead) and ends at the last grain; the tables say how many grains must come and
// where each lies. VMware writes the tables after the grains, each behind a metadata marker,
// then a footer and an end-of-stream marker, which must come.
const (
	vmdkMarkerEOS    = 0
	vmdkMarkerGT     = 1
	vmdkMarkerGD     = 2
	vmdkMarkerFooter = 3

	// maxStreamTables is the most of a qemu-img layout's overhead kept to check grains
	// against: its tables for a disk of 1 TiB with 64 KiB grains. A larger one is streamed
	// on the markers alone.
	maxStreamTables = 64 << 20
)

// vmdkStream converts a streamOptimized vmdk read front to back.
type vmdkStream struct {
	r     io.Reader
	h     vmdkHeader
	t     *Target
	pos   int64 // bytes read
	grain []byte
	// tables, when the layout puts them first: the overhead bytes, and how many grains they
	// map that have not come yet.
	overhead []byte
	gd       []byte
	missing  int64
}

// importVMDKStream converts the streamOptimized vmdk read from r. Progress is the caller's.
func importVMDKStream(r io.Reader, t *Target) (int64, error) {
	s := &vmdkStream{r: r, t: t}
	h := make([]byte, 512)
	if err := s.read(h, "its header"); err != nil {
		return 0, err
	}
	var err error
	if s.h, err = parseStreamHeader(h); err != nil {
		return 0, err
	}
	if err := s.readOverhead(); err != nil {
		return 0, err
	}
	if err := t.Prepare(s.h.size); err != nil {
		return 0, err
	}
	s.grain = make([]byte, s.h.grain)
	for {
		done, err := s.next()
		if err != nil {
			return 0, err
		}
		if done {
			return s.h.size, nil
		}
	}
}

// parseStreamHeader reads the header of a vmdk read front to back, and refuses one that
// cannot be: a descriptor naming other files, or a sparse extent whose grains carry no markers.
func parseStreamHeader(h []byte) (vmdkHeader, error) {
	if len(h) < 512 || string(h[:4]) != "KDMV" {
		return vmdkHeader{}, transfer.Permanent(transfer.ReasonNeedsRandomAccess,
			"the vmdk image is a descriptor whose data lies in other files (or an old COWD extent), which diskpipe reads only at random: "+
				"convert it to one file with 'qemu-img convert -O qcow2'")
	}
	vh, err := parseVMDKHeader(h)
	if err != nil {
		return vh, err
	}
	if vh.flags&vmdkFlagCompressed == 0 || vh.flags&vmdkFlagMarkers == 0 {
		return vh, transfer.Permanent(transfer.ReasonNeedsRandomAccess,
			"the vmdk image is monolithicSparse, whose grains can only be placed by reading it at random: serve it uncompressed from a server that supports Range, "+
				"or make it streamable with 'qemu-img convert -O vmdk -o subformat=streamOptimized' (or convert it to qcow2)")
	}
	return vh, nil
}

// read fills p from the stream; what the stream ends before is named by what.
func (s *vmdkStream) read(p []byte, what string) error {
	n, err := io.ReadFull(s.r, p)
	s.pos += int64(n)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return s.truncated(what)
	}
	return err
}

func (s *vmdkStream) truncated(what string) error {
	return transfer.Permanent(transfer.ReasonTruncatedImage, "truncated vmdk image: it ends at byte %d, in %s", s.pos, what)
}

func (s *vmdkStream) skip(n int64, what string) error {
	got, err := io.CopyN(io.Discard, s.r, n)
	s.pos += got
	if errors.Is(err, io.EOF) {
		return s.truncated(what)
	}
	return err
}

// readOverhead reads what lies between the header and the first grain: the descriptor, and
// in qemu-img's layout the grain directory and tables.
func (s *vmdkStream) readOverhead() error {
	size := s.h.overhead - 512
	if size < 0 {
		return transfer.Permanent(transfer.ReasonMalformedImage, "malformed vmdk image: its grains start at byte %d, inside the header", s.h.overhead)
	}
	if size > maxStreamTables {
		return s.skip(size, "the metadata before the first grain")
	}
	s.overhead = make([]byte, size)
	if err := s.read(s.overhead, "the metadata before the first grain"); err != nil {
		return err
	}
	if desc, ok := s.at(s.h.descOff, s.h.descLen); ok {
		if err := checkVMDKDescriptor(desc); err != nil {
			return err
		}
	}
	if s.h.gdSector == vmdkGDAtEnd {
		return nil
	}
	gtCount := s.h.gdEntries()
	gd, ok := s.at(int64(s.h.gdSector)*512, gtCount*4) //nolint:gosec // bounded by at
	if !ok {
		return transfer.Permanent(transfer.ReasonNeedsRandomAccess,
			"the vmdk image's grain directory lies after its grains, where a stream cannot go back to: serve it from a server that supports Range")
	}
	s.gd = gd
	for t := range gtCount {
		gt, err := s.table(t)
		if err != nil {
			return err
		}
		for i := 0; i < len(gt); i += 4 {
			if binary.LittleEndian.Uint32(gt[i:]) > 1 {
				s.missing++
			}
		}
	}
	return nil
}

// at returns the overhead bytes at file offset off, if they were kept.
func (s *vmdkStream) at(off, n int64) ([]byte, bool) {
	from := off - 512
	if n <= 0 || from < 0 || from > int64(len(s.overhead)) || n > int64(len(s.overhead))-from {
		return nil, false
	}
	return s.overhead[from : from+n], true
}

// table is grain table t of the qemu-img layout, nil if the directory maps none.
func (s *vmdkStream) table(t int64) ([]byte, error) {
	sector := int64(binary.LittleEndian.Uint32(s.gd[t*4:]))
	if sector == 0 {
		return nil, nil
	}
	gt, ok := s.at(sector*512, s.h.gtes*4)
	if !ok {
		return nil, transfer.Permanent(transfer.ReasonNeedsRandomAccess,
			"the vmdk image's grain table %d lies after its grains, where a stream cannot go back to: serve it from a server that supports Range", t)
	}
	return gt, nil
}

// next handles the marker at the stream's position; done is true at the image's end.
func (s *vmdkStream) next() (done bool, err error) {
	at := s.pos
	m := make([]byte, 12)
	n, err := io.ReadFull(s.r, m)
	s.pos += int64(n)
	if n == 0 && errors.Is(err, io.EOF) {
		return true, s.ended(at)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return false, s.truncated("a marker")
	}
	if err != nil {
		return false, err
	}
	lba, size := binary.LittleEndian.Uint64(m), int64(binary.LittleEndian.Uint32(m[8:]))
	if size == 0 {
		return s.metadata(lba, at)
	}
	return false, s.grainAt(lba, size, at)
}

// ended checks that the stream may end where it did.
func (s *vmdkStream) ended(at int64) error {
	if s.gd == nil {
		return transfer.Permanent(transfer.ReasonTruncatedImage, "truncated vmdk image: it ends at byte %d without its end-of-stream marker", at)
	}
	if s.missing > 0 {
		return transfer.Permanent(transfer.ReasonTruncatedImage, "truncated vmdk image: it ends at byte %d, %d grains its tables map still to come", at, s.missing)
	}
	return nil
}

// metadata handles a metadata marker: tables, footer and end of stream take whole sectors.
func (s *vmdkStream) metadata(sectors uint64, at int64) (bool, error) {
	rest := make([]byte, 500)
	if err := s.read(rest, "a metadata marker"); err != nil {
		return false, err
	}
	switch typ := binary.LittleEndian.Uint32(rest); typ {
	case vmdkMarkerEOS:
		if s.missing > 0 {
			return false, transfer.Permanent(transfer.ReasonMalformedImage, "malformed vmdk image: it ends at byte %d, %d grains its tables map never came", at, s.missing)
		}
		return true, nil
	case vmdkMarkerGT, vmdkMarkerGD, vmdkMarkerFooter:
		if sectors > uint64(maxTableEntries)*4/512+1 {
			return false, transfer.Permanent(transfer.ReasonMalformedImage, "malformed vmdk image: a %d-sector table at byte %d", sectors, at)
		}
		return false, s.skip(int64(sectors)*512, "a table") //nolint:gosec // bounded above
	default:
		return false, transfer.Permanent(transfer.ReasonMalformedImage, "malformed vmdk image: a marker of unknown type %d at byte %d", typ, at)
	}
}

// grainAt inflates the grain whose marker was at byte at and writes it to guest sector lba.
func (s *vmdkStream) grainAt(lba uint64, size, at int64) error {
	sectors := uint64(s.h.grain / 512) //nolint:gosec // positive
	if lba%sectors != 0 || lba >= uint64(s.h.size/512) || size > maxGrainData(s.h.grain) {
		return transfer.Permanent(transfer.ReasonMalformedImage, "malformed vmdk image: a %d-byte grain for sector %d at byte %d", size, lba, at)
	}
	index := int64(lba / sectors) //nolint:gosec // below the disk's size
	if s.gd != nil {
		gt, err := s.table(index / s.h.gtes)
		if err != nil {
			return err
		}
		if gt == nil || int64(binary.LittleEndian.Uint32(gt[(index%s.h.gtes)*4:]))*512 != at {
			return transfer.Permanent(transfer.ReasonMalformedImage, "malformed vmdk image: the grain at byte %d, for sector %d, is not where the tables map that sector", at, lba)
		}
		s.missing--
	}
	// The marker and the data take whole sectors.
	z := make([]byte, (12+size+511)/512*512-12)
	if err := s.read(z, "a grain"); err != nil {
		return err
	}
	guest := int64(lba) * 512 //nolint:gosec // below the disk's size
	p := s.grain[:min(s.h.grain, s.h.size-guest)]
	if err := inflateGrain(z[:size], p, at); err != nil {
		return err
	}
	_, err := s.t.WriteAt(p, guest)
	return err
}
