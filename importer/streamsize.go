package importer

import (
	"bytes"
	"encoding/binary"
)

// declaredSize is what a compressed stream says of the size of what it holds before it is
// decompressed: a lower bound, or 0 when it says nothing. It lets an image too large for its
// volume be refused before its bytes are downloaded. A zstd frame header carries its content
// size (the zstd tool writes it); with random access, a gzip trailer's ISIZE (the last
// member's size modulo 4 GiB) and an xz index (the last stream's blocks) are read from the end.
func declaredSize(comp Compression, head []byte, f *fetcher) int64 {
	switch comp {
	case CompressionZstd:
		return zstdContentSize(head)
	case CompressionGzip:
		if tail := readTail(f, 4); tail != nil {
			return int64(binary.LittleEndian.Uint32(tail))
		}
	case CompressionXz:
		return xzIndexSize(f)
	}
	return 0
}

// readTail reads the source's last n bytes, or returns nil.
func readTail(f *fetcher, n int64) []byte {
	size := f.obj.Size()
	if !f.obj.RandomAccess() || size < n {
		return nil
	}
	b := make([]byte, n)
	if _, err := f.ReadAt(b, size-n); err != nil {
		return nil
	}
	return b
}

// zstdContentSize reads the Frame_Content_Size of the first zstd frame (RFC 8878, 3.1.1.1).
func zstdContentSize(head []byte) int64 {
	if len(head) < 6 || !bytes.HasPrefix(head, []byte{0x28, 0xb5, 0x2f, 0xfd}) {
		return 0
	}
	fhd := head[4]
	single := fhd>>5&1 == 1
	at := 5
	if !single {
		at++ // the window descriptor
	}
	at += []int{0, 1, 2, 4}[fhd&3] // the dictionary id
	n := []int{0, 2, 4, 8}[fhd>>6]
	if fhd>>6 == 0 && single {
		n = 1
	}
	if n == 0 || len(head) < at+n {
		return 0
	}
	var v uint64
	for i := n - 1; i >= 0; i-- {
		v = v<<8 | uint64(head[at+i])
	}
	if n == 2 {
		v += 256
	}
	if v > 1<<62 {
		return 0
	}
	return int64(v) //nolint:gosec // bounded above
}

// xzIndexSize sums the uncompressed sizes the last xz stream's index records.
func xzIndexSize(f *fetcher) int64 {
	footer := readTail(f, 12)
	if footer == nil || !bytes.Equal(footer[10:], []byte("YZ")) {
		return 0
	}
	indexSize := (int64(binary.LittleEndian.Uint32(footer[4:])) + 1) * 4
	if indexSize > 16<<20 || indexSize+12 > f.obj.Size() {
		return 0
	}
	index := make([]byte, indexSize)
	if _, err := f.ReadAt(index, f.obj.Size()-12-indexSize); err != nil || index[0] != 0 {
		return 0
	}
	r := bytes.NewReader(index[1:])
	records, err := binary.ReadUvarint(r)
	if err != nil || records > uint64(indexSize) {
		return 0
	}
	var total uint64
	for range records {
		if _, err := binary.ReadUvarint(r); err != nil { // the unpadded size
			return 0
		}
		n, err := binary.ReadUvarint(r)
		if err != nil || n > 1<<62 || total+n > 1<<62 {
			return 0
		}
		total += n
	}
	return int64(total) //nolint:gosec // bounded above
}
