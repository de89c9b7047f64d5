package importer

import (
	"bytes"
	"container/heap"
	"encoding/binary"
	"errors"
	"io"

	"github.com/lima-vm/go-qcow2reader/image/qcow2"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// A qcow2 image that can only be read front to back — from a server without Range, out of a
// gzip, xz or zstd wrapper — is converted in one pass, cluster by cluster. The L1 table says
// where the L2 tables are; each L2 table, when it passes, says which guest offset the data
// clusters after it belong to. qemu-img writes the tables before the data they map, so data
// is written as it arrives. Non-zero clusters no table has claimed yet are held, up to
// maxUnclaimed, in case a later table claims them; an image that needs more than that says
// it needs random access.
const maxUnclaimed = 8 << 20

// maxPending bounds the clusters the tables that passed map ahead of their data (about 40
// bytes of memory each, so 80 MiB at most): 128 GiB of 64 KiB clusters mapped before any of
// them arrives. A stream of tables that map clusters which never come stops there, not at the
// pod's memory limit.
const maxPending = 1 << 21

type qcow2Stream struct {
	h     *qcow2Header
	cs    int64
	vsize int64
	t     *Target

	pos        int64            // host offset of the current cluster
	cur, prev  []byte           // the current cluster and the one before
	l2         map[int64]int64  // host offset of an L2 table → its L1 index
	data       map[int64]int64  // host offset of a data cluster still to come → its guest offset
	comp       compressedHeap   // compressed clusters still to come, the lowest host offset first
	unclaimed  map[int64][]byte // passed non-zero clusters no table has claimed yet
	order      []int64          // unclaimed, oldest first
	dropped    map[int64]bool   // unclaimed clusters let go of
	decompress func(io.Reader) (io.ReadCloser, error)

	// Buffers used again, so that a stream of many GiB allocates a few clusters' worth, not
	// its size in garbage: spare is a passed cluster no one holds, gathered and inflated
	// are a compressed cluster's bytes and what they inflate to, zero is a cluster of zeros.
	spare, gathered, inflated, zero []byte
}

type compressedRef struct{ host, size, guest int64 }

// compressedHeap orders compressed clusters by host offset as the tables add them: each table
// costs O(its entries · log n), not a sort of all that are pending.
type compressedHeap []compressedRef

func (h compressedHeap) Len() int           { return len(h) }
func (h compressedHeap) Less(i, j int) bool { return h[i].host < h[j].host }
func (h compressedHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *compressedHeap) Push(x any)        { *h = append(*h, x.(compressedRef)) }
func (h *compressedHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// importQcow2Stream converts the qcow2 image read from r; head is its start.
// Progress is the caller's: it counts the source bytes as they are read.
func importQcow2Stream(r io.Reader, head []byte, t *Target) (int64, error) {
	h, err := parseQcow2Header(head, -1)
	if err != nil {
		return 0, err
	}
	if h.IncompatFeatures&qcow2IncompatExtendedL2 != 0 {
		return 0, transfer.Permanent(transfer.ReasonNeedsRandomAccess,
			"the qcow2 image has extended L2 entries, which diskpipe reads only at random: serve it from a server that supports Range")
	}
	s := &qcow2Stream{h: h, cs: 1 << h.ClusterBits, vsize: int64(h.Size), t: t, //nolint:gosec // checked by parseQcow2Header
		l2: map[int64]int64{}, data: map[int64]int64{}, unclaimed: map[int64][]byte{}, dropped: map[int64]bool{},
		decompress: inflateCluster}
	if h.CompressionType == uint8(qcow2.CompressionTypeZstd) {
		s.decompress = unzstdCluster
	}
	if err := t.Prepare(s.vsize); err != nil {
		return 0, err
	}
	l1Off := int64(h.L1TableOffset) //nolint:gosec // checked by parseQcow2Header
	l1 := make([]byte, 0, int(h.L1Size)*8)
	for s.pos = 0; ; s.pos += s.cs {
		buf := s.spare
		if s.spare = nil; buf == nil {
			buf = make([]byte, s.cs)
		}
		n, err := io.ReadFull(r, buf)
		if n == 0 && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) {
			break
		}
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, err
		}
		s.cur = buf
		if from, to := max(s.pos, l1Off), min(s.pos+s.cs, l1Off+int64(cap(l1))); from < to {
			l1 = append(l1, buf[from-s.pos:to-s.pos]...)
			if len(l1) == cap(l1) {
				if err := s.readL1(l1); err != nil {
					return 0, err
				}
			}
		}
		if err := s.cluster(buf, l1Off); err != nil {
			return 0, err
		}
		if _, held := s.unclaimed[s.pos-s.cs]; s.prev != nil && !held {
			s.spare = s.prev
		}
		s.prev = buf
		if len(l1) == cap(l1) && len(s.l2) == 0 && len(s.data) == 0 && len(s.comp) == 0 {
			break // every table has passed and every cluster they map is written: the image ends here
		}
	}
	if len(l1) < cap(l1) {
		return 0, transfer.Permanent(transfer.ReasonTruncatedImage,
			"truncated qcow2 image: the stream ended at byte %d, before its L1 table (bytes %d to %d)", s.pos, l1Off, l1Off+int64(cap(l1)))
	}
	s.pos += s.cs
	s.cur, s.prev = nil, s.cur
	if err := s.finishCompressed(); err != nil {
		return 0, err
	}
	if missing := len(s.data) + len(s.comp); missing > 0 {
		return 0, transfer.Permanent(transfer.ReasonTruncatedImage, "truncated qcow2 image: %d clusters it maps are missing from the stream", missing)
	}
	return s.vsize, nil
}

func (s *qcow2Stream) readL1(l1 []byte) error {
	for i := 0; i < len(l1); i += 8 {
		off := int64(binary.BigEndian.Uint64(l1[i:]) & 0x00fffffffffffe00) //nolint:gosec // masked
		switch {
		case off == 0:
		case off < s.pos: // an L2 table that passed before the L1 table
			b, ok := s.unclaimed[off]
			if !ok {
				if s.dropped[off] {
					return s.tooLate()
				}
				continue // it passed as zeros: it maps nothing
			}
			s.release(off)
			if err := s.mapL2(int64(i/8), b); err != nil {
				return err
			}
		default:
			s.l2[off] = int64(i / 8)
		}
	}
	return nil
}

// cluster handles the host cluster at s.pos.
func (s *qcow2Stream) cluster(buf []byte, l1Off int64) error {
	claimed := s.pos == 0 || (s.pos >= l1Off && s.pos < l1Off+int64(s.h.L1Size)*8)
	if idx, ok := s.l2[s.pos]; ok {
		delete(s.l2, s.pos)
		if err := s.mapL2(idx, buf); err != nil {
			return err
		}
		claimed = true
	}
	if guest, ok := s.data[s.pos]; ok {
		delete(s.data, s.pos)
		if err := s.write(buf, guest); err != nil {
			return err
		}
		claimed = true
	}
	// A cluster of packed compressed data may also hold clusters that a table still to come
	// claims: keep it too.
	packed := len(s.comp) > 0 && s.comp[0].host < s.pos+s.cs
	if err := s.finishCompressed(); err != nil {
		return err
	}
	if (!claimed || packed) && !isZeroBlocks(buf) {
		s.hold(buf)
	}
	return nil
}

// hold keeps an unclaimed cluster, letting go of the oldest beyond maxUnclaimed.
func (s *qcow2Stream) hold(buf []byte) {
	s.unclaimed[s.pos] = buf
	s.order = append(s.order, s.pos)
	for int64(len(s.unclaimed))*s.cs > maxUnclaimed && len(s.order) > 0 {
		old := s.order[0]
		s.order = s.order[1:]
		if _, ok := s.unclaimed[old]; ok {
			s.release(old)
			s.dropped[old] = true
		}
	}
}

func (s *qcow2Stream) release(host int64) { delete(s.unclaimed, host) }

func (s *qcow2Stream) tooLate() error {
	return transfer.Permanent(transfer.ReasonNeedsRandomAccess,
		"the qcow2 image places data more than %d MiB before the tables that map it, so it cannot be converted as a stream: "+
			"serve it from a server that supports Range, or rewrite it with 'qemu-img convert -O qcow2'", maxUnclaimed>>20)
}

// mapL2 records where the clusters of the L2 table at L1 index idx go, and writes those that
// already passed.
func (s *qcow2Stream) mapL2(idx int64, table []byte) error {
	entries := s.cs / 8
	bits := int64(s.h.ClusterBits)
	x := 62 - (bits - 8)
	for j := int64(0); j < entries; j++ {
		guest := (idx*entries + j) * s.cs
		e := binary.BigEndian.Uint64(table[j*8:])
		if guest >= s.vsize || e == 0 {
			continue
		}
		if e&(1<<62) != 0 { // compressed
			off := int64(e & (1<<x - 1))                 //nolint:gosec // masked
			sectors := int64((e>>x)&(1<<(bits-8)-1)) + 1 //nolint:gosec // masked
			c := compressedRef{host: off, size: sectors*512 - off&511, guest: guest}
			if len(s.data)+len(s.comp) >= maxPending {
				return s.tooFarAhead()
			}
			heap.Push(&s.comp, c)
			continue
		}
		off := int64(e & 0x00fffffffffffe00) //nolint:gosec // masked
		if off == 0 || e&1 != 0 {            // unallocated or a zero cluster
			continue
		}
		switch {
		case off >= s.pos+s.cs:
			if len(s.data)+len(s.comp) >= maxPending {
				return s.tooFarAhead()
			}
			s.data[off] = guest
		case off == s.pos:
			if err := s.write(s.cur, guest); err != nil {
				return err
			}
		default: // passed already: held, dropped, or zeros
			if b, ok := s.unclaimed[off]; ok {
				s.release(off)
				if err := s.write(b, guest); err != nil {
					return err
				}
			} else if s.dropped[off] {
				return s.tooLate()
			}
		}
	}
	return nil
}

func (s *qcow2Stream) tooFarAhead() error {
	return transfer.Permanent(transfer.ReasonNeedsRandomAccess,
		"the qcow2 image's tables map more than %d clusters before their data arrives, more than a stream is followed for: "+
			"serve it from a server that supports Range, or rewrite it with 'qemu-img convert -O qcow2'", maxPending)
}

// finishCompressed decompresses the compressed clusters whose bytes have all passed.
func (s *qcow2Stream) finishCompressed() error {
	end := s.pos + s.cs
	if s.cur == nil {
		end = s.pos // after the last cluster: what remains may run past the end of the file
	}
	for len(s.comp) > 0 && (s.comp[0].host+s.comp[0].size <= end || s.cur == nil) {
		c := s.comp[0]
		src, err := s.bytesAt(c.host, c.size)
		if err != nil {
			return err
		}
		rc, err := s.decompress(bytes.NewReader(src))
		if err != nil {
			return transfer.Permanent(transfer.ReasonMalformedImage, "malformed qcow2 image: compressed cluster at %d: %w", c.host, err)
		}
		if s.inflated == nil {
			s.inflated = make([]byte, s.cs)
		}
		out := s.inflated
		_, err = io.ReadFull(rc, out)
		rc.Close()
		if err != nil {
			return transfer.Permanent(transfer.ReasonMalformedImage, "malformed qcow2 image: compressed cluster at %d: %w", c.host, err)
		}
		if err := s.write(out, c.guest); err != nil {
			return err
		}
		heap.Pop(&s.comp)
	}
	return nil
}

// bytesAt gathers [host, host+n) from the clusters at hand; past the end of the stream, zeros.
// The bytes are valid until the next call.
func (s *qcow2Stream) bytesAt(host, n int64) ([]byte, error) {
	if s.zero == nil {
		s.zero = make([]byte, s.cs)
	}
	out := s.gathered[:0]
	defer func() { s.gathered = out[:0] }()
	for h := host; h < host+n; {
		base := h / s.cs * s.cs
		var b []byte
		switch {
		case base == s.pos && s.cur != nil:
			b = s.cur
		case base == s.pos-s.cs && s.prev != nil:
			b = s.prev
		case base >= s.pos:
			b = s.zero // past the end of the file
		default:
			var ok bool
			if b, ok = s.unclaimed[base]; !ok {
				if s.dropped[base] {
					return nil, s.tooLate()
				}
				b = s.zero
			}
		}
		take := min(host+n, base+s.cs) - h
		out = append(out, b[h-base:h-base+take]...)
		h += take
	}
	return out, nil
}

func (s *qcow2Stream) write(buf []byte, guest int64) error {
	n := min(int64(len(buf)), s.vsize-guest)
	if n <= 0 {
		return nil
	}
	_, err := s.t.WriteAt(buf[:n], guest)
	return err
}
