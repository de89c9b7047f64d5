package exporter

import (
	"errors"
	"io"
	"os"
	"sort"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// disk is the volume being exported: disk.img on a filesystem volume, or a block device.
type disk struct {
	f    *os.File
	path string
	size int64
	// data are the byte ranges that may hold data; everything else is a hole and reads as
	// zeros. A block device, which cannot say, is one range.
	data []extent
}

type extent struct{ start, end int64 }

// openDisk opens path; declared, when positive, is the size the disk must have.
func openDisk(path string, declared int64) (*disk, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, transfer.Permanent(transfer.ReasonSourceNotFound, "source disk %s does not exist", path)
	}
	if err != nil {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "opening source disk: %w", err)
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		f.Close()
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "reading the size of %s: %w", path, err)
	}
	if declared > 0 && size < declared {
		f.Close()
		return nil, transfer.Permanent(transfer.ReasonTruncatedImage,
			"source disk %s is %d bytes, shorter than the declared %d", path, size, declared)
	}
	d := &disk{f: f, path: path, size: size}
	if d.data, err = dataExtents(f, size); err != nil {
		f.Close()
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "finding the data of %s: %w", path, err)
	}
	return d, nil
}

// dataExtents lists the data ranges of f with SEEK_DATA and SEEK_HOLE; where the file or
// device does not support them, the whole size is data.
func dataExtents(f *os.File, size int64) ([]extent, error) {
	var out []extent
	for off := int64(0); off < size; {
		start, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA) //nolint:gosec // a descriptor fits
		if errors.Is(err, syscall.ENXIO) {
			break // no data after off
		}
		if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.EOPNOTSUPP) {
			return []extent{{0, size}}, nil
		}
		if err != nil {
			return nil, err
		}
		end, err := unix.Seek(int(f.Fd()), start, unix.SEEK_HOLE) //nolint:gosec // a descriptor fits
		if err != nil {
			return nil, err
		}
		out = append(out, extent{start, min(end, size)})
		off = end
	}
	return out, nil
}

// hasData reports whether [off, off+n) may hold data.
func (d *disk) hasData(off, n int64) bool {
	i := sort.Search(len(d.data), func(i int) bool { return d.data[i].end > off })
	return i < len(d.data) && d.data[i].start < off+n
}

// readCluster fills buf with the disk's bytes at off; past the end of the disk it reads zeros.
func (d *disk) readCluster(buf []byte, off int64) error {
	n := int64(len(buf))
	if off+n > d.size {
		n = max(d.size-off, 0)
		clear(buf[n:])
	}
	if _, err := d.f.ReadAt(buf[:n], off); err != nil {
		if errors.Is(err, io.EOF) {
			return transfer.Permanent(transfer.ReasonTruncatedImage, "source disk %s shrank during the export: no data at %d", d.path, off)
		}
		return transfer.Permanent(transfer.ReasonInternal, "reading %s: %w", d.path, err)
	}
	return nil
}

func (d *disk) Close() error { return d.f.Close() }
