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

// CopyCapacity is the size of a volume to copy a volume of claim bytes into: as large, except
// a block volume copied into a filesystem volume, whose disk (the whole device) needs the
// filesystem's overhead besides (VolumeSizeFor): a volume as large would refuse it as too
// large by that overhead. A disk file copied out of a filesystem volume is smaller than its
// volume, and fits in one as large of either mode with the same overhead.
func CopyCapacity(claim int64, fromBlock, toBlock bool, overhead float64) int64 {
	if fromBlock && !toBlock {
		return max(claim, VolumeSizeFor(claim, overhead))
	}
	return claim
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
