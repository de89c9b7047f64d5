package importer

import (
	"context"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// FileSource reads a local file or block device: another PVC's disk, mounted into the pod for
// a host-assisted clone.
type FileSource struct {
	// Path of disk.img or of the block device.
	Path string
}

func (s *FileSource) String() string { return s.Path }

// Open opens the file; its size is the file's, or the device's.
func (s *FileSource) Open(context.Context) (Object, error) {
	f, err := os.Open(s.Path)
	if os.IsNotExist(err) {
		return nil, transfer.Permanent(transfer.ReasonSourceNotFound, "source disk %s does not exist", s.Path)
	}
	if err != nil {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "opening source disk: %w", err)
	}
	size, err := f.Seek(0, io.SeekEnd) // a block device's size too
	if err != nil {
		f.Close()
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "reading the size of %s: %w", s.Path, err)
	}
	// The copy reads the whole disk once, front to back.
	_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_SEQUENTIAL) //nolint:gosec // a descriptor fits
	id := ""
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
		id = fmt.Sprintf("file size %d mtime %d", size, fi.ModTime().UnixNano())
	}
	return &fileObject{f: f, size: size, id: id}, nil
}

type fileObject struct {
	f    *os.File
	size int64
	id   string
}

func (o *fileObject) Identity() string { return o.id }
func (o *fileObject) Revision() string { return o.id }

func (o *fileObject) Size() int64        { return o.size }
func (o *fileObject) RandomAccess() bool { return true }
func (o *fileObject) Close() error       { return o.f.Close() }

func (o *fileObject) ReadRange(_ context.Context, off, n int64) (io.ReadCloser, error) {
	if n < 0 {
		n = o.size - off
	}
	return io.NopCloser(io.NewSectionReader(o.f, off, n)), nil
}
