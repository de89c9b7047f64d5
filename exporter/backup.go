package exporter

import (
	"crypto/sha256"
	"fmt"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// PieceSize is the unit an incremental backup finds changes in: a piece whose digest differs
// from its parent's is written whole (its zero clusters as zeroed ones), the others not at all.
const PieceSize = clustersPerJob * clusterSize

// Pieces is what a backup held: the disk's size and the sha256 of each of its pieces (the last
// one of the bytes the disk has). It is kept beside the backup as its sums object: the digests
// one after another.
type Pieces struct {
	Size int64
	Sums [][32]byte
}

// Bytes is the sums object.
func (p *Pieces) Bytes() []byte {
	b := make([]byte, 0, 32*len(p.Sums))
	for _, s := range p.Sums {
		b = append(b, s[:]...)
	}
	return b
}

// ParsePieces reads a sums object of a disk of size bytes.
func ParsePieces(b []byte, size int64) (*Pieces, error) {
	n := (size + PieceSize - 1) / PieceSize
	if size <= 0 || int64(len(b)) != 32*n {
		return nil, transfer.Permanent(transfer.ReasonBrokenChain, "the parent's sums object holds %d bytes, and a disk of %d bytes has %d pieces of 32", len(b), size, n)
	}
	p := &Pieces{Size: size, Sums: make([][32]byte, n)}
	for i := range p.Sums {
		copy(p.Sums[i][:], b[32*i:])
	}
	return p, nil
}

// changed says whether the piece j, bytes [start, end) of the disk, of digest sum, differs
// from what p held: always for a full backup (p nil), a piece past p's disk, or one that
// p's disk ended inside.
func (p *Pieces) changed(j int, start, end int64, sum [32]byte) bool {
	if p == nil || j >= len(p.Sums) || end > p.Size || (end < p.Size && end-start < PieceSize) {
		return true
	}
	return p.Sums[j] != sum
}

// zeroPiece is the digest of n zeros, as a piece of a hole has.
func zeroPiece(n int64) [32]byte {
	if n == PieceSize {
		return zeroPieceSum
	}
	return sha256.Sum256(make([]byte, n))
}

var zeroPieceSum = sha256.Sum256(make([]byte, PieceSize))

func (p *Pieces) String() string { return fmt.Sprintf("%d pieces of a %d-byte disk", len(p.Sums), p.Size) }
