package exporter

import (
	"encoding/binary"
)

// The qcow2 images diskpipe writes: version 3, 64 KiB clusters, 16-bit refcounts, laid out
// in one forward pass: header, L1 table, refcount table, refcount blocks, L2 tables, then the
// data clusters in guest order. Compressed clusters are packed byte by byte as qemu packs
// them; a cluster that does not compress is stored whole, cluster-aligned.
const (
	clusterBits       = 16
	clusterSize       = 1 << clusterBits
	l2Entries         = clusterSize / 8
	refcountOrder     = 4 // 16-bit refcounts
	refcountsPerBlock = clusterSize * 8 / (1 << refcountOrder)

	oflagCopied     = uint64(1) << 63
	oflagCompressed = uint64(1) << 62
	// oflagZero marks a cluster that reads as zeros (qcow2 version 3).
	oflagZero = uint64(1)
	// A compressed cluster's L2 entry keeps the host offset below bit csizeShift and the
	// number of additional 512-byte sectors from there up to bit 61.
	csizeShift = 62 - (clusterBits - 8)
)

// planned is a non-zero guest cluster: its index and, when stored compressed, its size.
type planned struct {
	idx   uint32
	csize uint32 // 0: stored uncompressed
}

// layout is where everything goes in the image.
type layout struct {
	vsize       int64
	compression Compression
	plan        []planned
	// zeros are guest clusters that read as zeros whatever an older layer holds there (an
	// incremental's clusters zeroed since its parent): their L2 entries carry the zero flag and
	// point at no data. Ascending.
	zeros []uint32
	// backing names the image this one holds the changes since (an incremental's parent), as
	// its header's backing file, format qcow2; empty for a whole disk.
	backing    string
	l1Size     int
	l2Tables   []uint32 // the L1 indices that have an L2 table, ascending
	l1Clusters int
	rtClusters int
	rbClusters int
	l1Off      int64
	rtOff      int64
	rbOff      int64
	l2Off      int64
	dataOff    int64
	dataLen    int64 // bytes of the data region, from dataOff
	fileSize   int64
	refcounts  []uint16 // per host cluster
}

func divUp(a, b int64) int64 { return (a + b - 1) / b }

// placer walks the plan and gives each cluster its offset in the data region, the same way
// every time it is walked: compressed clusters packed, uncompressed ones cluster-aligned.
type placer struct{ pos int64 }

func (p *placer) place(c planned) int64 {
	if c.csize == 0 {
		p.pos = divUp(p.pos, clusterSize) * clusterSize
		off := p.pos
		p.pos += clusterSize
		return off
	}
	off := p.pos
	p.pos += int64(c.csize)
	return off
}

// newLayout lays out an image of vsize bytes holding the planned clusters and the zeroed ones.
func newLayout(vsize int64, compression Compression, plan []planned, zeros []uint32) *layout {
	l := &layout{vsize: vsize, compression: compression, plan: plan, zeros: zeros}
	l.l1Size = int(divUp(vsize, clusterSize*l2Entries))
	l.entries(func(idx uint32, _ int) {
		if t := idx / l2Entries; len(l.l2Tables) == 0 || l.l2Tables[len(l.l2Tables)-1] != t {
			l.l2Tables = append(l.l2Tables, t)
		}
	})
	var p placer
	for _, c := range plan {
		p.place(c)
	}
	l.dataLen = divUp(p.pos, 512) * 512 // readers read compressed clusters in whole sectors
	l.l1Clusters = int(divUp(int64(l.l1Size)*8, clusterSize))
	dataClusters := divUp(l.dataLen, clusterSize)

	// The refcount blocks count every cluster, themselves and the table too: grow them
	// until they cover the image.
	for rb := int64(1); ; {
		rt := divUp(rb*8, clusterSize)
		total := 1 + int64(l.l1Clusters) + rt + rb + int64(len(l.l2Tables)) + dataClusters
		need := divUp(total, refcountsPerBlock)
		if need <= rb {
			l.rbClusters, l.rtClusters = int(rb), int(rt)
			break
		}
		rb = need
	}
	l.l1Off = clusterSize
	l.rtOff = l.l1Off + int64(l.l1Clusters)*clusterSize
	l.rbOff = l.rtOff + int64(l.rtClusters)*clusterSize
	l.l2Off = l.rbOff + int64(l.rbClusters)*clusterSize
	l.dataOff = l.l2Off + int64(len(l.l2Tables))*clusterSize
	l.fileSize = l.dataOff + l.dataLen

	l.refcounts = make([]uint16, divUp(l.fileSize, clusterSize))
	for i := int64(0); i < l.dataOff/clusterSize; i++ {
		l.refcounts[i] = 1
	}
	p = placer{}
	for _, c := range l.plan {
		off := l.dataOff + p.place(c)
		size := int64(clusterSize)
		if c.csize != 0 {
			size = int64(c.csize)
		}
		for h := off / clusterSize; h <= (off+size-1)/clusterSize; h++ {
			l.refcounts[h]++
		}
	}
	return l
}

// entries calls fn with every guest cluster that has an L2 entry, in guest order: i is its
// place in plan, or -1 for a zeroed one.
func (l *layout) entries(fn func(idx uint32, i int)) {
	z := 0
	for i, c := range l.plan {
		for ; z < len(l.zeros) && l.zeros[z] < c.idx; z++ {
			fn(l.zeros[z], -1)
		}
		fn(c.idx, i)
	}
	for ; z < len(l.zeros); z++ {
		fn(l.zeros[z], -1)
	}
}

// header is the image's first cluster.
func (l *layout) header() []byte {
	h := make([]byte, clusterSize)
	be := binary.BigEndian
	copy(h, "QFI\xfb")
	be.PutUint32(h[4:], 3)
	be.PutUint32(h[20:], clusterBits)
	be.PutUint64(h[24:], uint64(l.vsize))      //nolint:gosec // positive
	be.PutUint32(h[36:], uint32(l.l1Size))     //nolint:gosec // bounded by the virtual size
	be.PutUint64(h[40:], uint64(l.l1Off))      //nolint:gosec // positive
	be.PutUint64(h[48:], uint64(l.rtOff))      //nolint:gosec // positive
	be.PutUint32(h[56:], uint32(l.rtClusters)) //nolint:gosec // small
	be.PutUint32(h[96:], refcountOrder)
	ext := 104
	if l.compression == CompressionZstd {
		be.PutUint64(h[72:], 1<<3) // incompatible feature: compression type
		be.PutUint32(h[100:], 112)
		h[104] = 1 // zstd
		ext = 112
	} else {
		be.PutUint32(h[100:], 104)
	}
	if l.backing != "" {
		// The backing file's format, as a header extension, then the end of the extensions
		// (zeros), then the name.
		be.PutUint32(h[ext:], 0xe2792aca)
		be.PutUint32(h[ext+4:], 5)
		copy(h[ext+8:], "qcow2")
		name := ext + 24
		copy(h[name:], l.backing)
		be.PutUint64(h[8:], uint64(name))            //nolint:gosec // small
		be.PutUint32(h[16:], uint32(len(l.backing))) //nolint:gosec // at most maxBackingName
	}
	// The header extensions end there: the rest of the cluster is zeros, an end marker.
	return h
}

// maxBackingName is the longest backing file name a qcow2 header holds (qemu's limit).
const maxBackingName = 1023

// metadata calls emit with each metadata cluster in file order, after the header: the L1
// table, the refcount table, the refcount blocks and the L2 tables. Only one cluster is
// built at a time, so memory does not grow with the number of L2 tables.
func (l *layout) metadata(emit func([]byte) error) error {
	be := binary.BigEndian
	buf := make([]byte, clusterSize)
	flush := func() error {
		err := emit(buf)
		clear(buf)
		return err
	}
	// L1 table.
	entry := 0
	for t := 0; t < l.l1Size; t++ {
		if entry < len(l.l2Tables) && l.l2Tables[entry] == uint32(t) { //nolint:gosec // bounded
			be.PutUint64(buf[(t%l2Entries)*8:], uint64(l.l2Off+int64(entry)*clusterSize)|oflagCopied) //nolint:gosec // positive
			entry++
		}
		if t%l2Entries == l2Entries-1 || t == l.l1Size-1 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	// Refcount table.
	for b := 0; b < l.rbClusters; b++ {
		be.PutUint64(buf[(b%l2Entries)*8:], uint64(l.rbOff+int64(b)*clusterSize)) //nolint:gosec // positive
		if b%l2Entries == l2Entries-1 || b == l.rbClusters-1 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	// Refcount blocks.
	for b := 0; b < l.rbClusters; b++ {
		for i := 0; i < refcountsPerBlock; i++ {
			if h := b*refcountsPerBlock + i; h < len(l.refcounts) {
				be.PutUint16(buf[i*2:], l.refcounts[h])
			}
		}
		if err := flush(); err != nil {
			return err
		}
	}
	// L2 tables, one flushed whenever the next entry is in another.
	var p placer
	var err error
	table, started := uint32(0), false
	l.entries(func(idx uint32, i int) {
		if err != nil {
			return
		}
		if started && idx/l2Entries != table {
			err = flush()
		}
		table, started = idx/l2Entries, true
		e := oflagZero
		if i >= 0 {
			c := l.plan[i]
			off := uint64(l.dataOff + p.place(c)) //nolint:gosec // positive
			if c.csize == 0 {
				e = off | oflagCopied
			} else {
				sectors := (off+uint64(c.csize)-1)>>9 - off>>9
				e = oflagCompressed | sectors<<csizeShift | off
			}
		}
		be.PutUint64(buf[(idx%l2Entries)*8:], e)
	})
	if err == nil && started {
		err = flush()
	}
	return err
}
