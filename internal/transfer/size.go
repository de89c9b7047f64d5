package transfer

import "github.com/diskpipe/diskpipe/internal/contract"

// DefaultOverhead is the share of a filesystem volume kept for the filesystem itself, where
// the installation does not set one for the volume's StorageClass.
const DefaultOverhead = contract.DefaultOverhead

// VolumeSizeFor is the smallest volume, in whole MiB, that holds a disk of size bytes on a
// filesystem that keeps overhead (a fraction) of it.
func VolumeSizeFor(size int64, overhead float64) int64 {
	return RoundMiB(int64(float64(size)/(1-overhead)) + 1)
}

// CopyCapacity is the size of a volume to copy a volume of claim bytes into, never less than
// claim: a block volume's disk is the whole device, which a filesystem volume holds only with
// the filesystem's overhead (to, VolumeSizeFor) besides; a filesystem volume's disk file is at
// most the volume less its own overhead (from), which a filesystem volume of another
// overhead holds with that one besides, and a block volume as large holds anyway.
func CopyCapacity(claim int64, fromBlock, toBlock bool, from, to float64) int64 {
	switch {
	case toBlock, !fromBlock && to <= from:
		return claim
	case fromBlock:
		return max(claim, VolumeSizeFor(claim, to))
	}
	return max(claim, VolumeSizeFor(Usable(claim, from), to))
}

// RoundMiB rounds n up to a whole MiB.
func RoundMiB(n int64) int64 { return (n + 1<<20 - 1) &^ (1<<20 - 1) }

// Usable is how much of a filesystem volume of capacity bytes a disk file may take, keeping
// overhead (a fraction) for the filesystem.
func Usable(capacity int64, overhead float64) int64 { return int64(float64(capacity) * (1 - overhead)) }

// GrownSize is the size a disk file grown to fill such a volume gets: Usable, rounded down to a
// whole MiB.
func GrownSize(capacity int64, overhead float64) int64 {
	return Usable(capacity, overhead) &^ (1<<20 - 1)
}

// MaxVirtualSize is the largest disk diskpipe imports, 1 PiB: a size a source claims beyond it
// (a crafted header, a server's word) is refused before a volume is sized from it, where it
// would overflow.
const MaxVirtualSize = 1 << 50

// CheckVirtualSize refuses a claimed virtual size that is negative or over MaxVirtualSize.
func CheckVirtualSize(size int64) error {
	if size < 0 || size > MaxVirtualSize {
		return Permanent(ReasonTooLarge, "the source claims a virtual size of %d bytes; diskpipe imports disks of at most %d bytes (1 PiB)", size, int64(MaxVirtualSize))
	}
	return nil
}
