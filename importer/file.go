package importer

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

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

// containerDiskFile is the disk of a container disk image mounted at dir: the one regular file
// in it, as KubeVirt's containerDisk volumes take it.
func containerDiskFile(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", transfer.Permanent(transfer.ReasonSourceNotFound, "the image holds no %s directory with its disk: %w", dir, err)
	}
	var files []string
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() { // a link to a file too
			files = append(files, p)
		}
	}
	switch len(files) {
	case 1:
		return files[0], nil
	case 0:
		return "", transfer.Permanent(transfer.ReasonSourceNotFound, "the image's %s holds no disk file: a container disk holds one, as docker://quay.io/containerdisks images do", dir)
	}
	return "", transfer.Permanent(transfer.ReasonInvalidArgument, "the image's %s holds %d files (%s): a container disk holds one disk", dir, len(files), strings.Join(files, ", "))
}

// install copies the running importer to path, executable: an init container's work, for a
// pod whose own image (a container disk) holds no importer.
func install(path string) error {
	self, err := os.Executable()
	if err != nil {
		return transfer.Permanent(transfer.ReasonInternal, "finding the importer's own binary: %w", err)
	}
	in, err := os.Open(self)
	if err != nil {
		return transfer.Permanent(transfer.ReasonInternal, "reading the importer's own binary: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o555)
	if err != nil {
		return transfer.Permanent(transfer.ReasonInvalidArgument, "installing the importer: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return transfer.Permanent(transfer.ReasonInternal, "installing the importer: %w", err)
	}
	return out.Close()
}
