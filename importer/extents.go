package importer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Extent is a run of a disk that holds data: [Off, Off+Len). The rest of the disk reads as
// zeros.
type Extent struct{ Off, Len int64 }

// sparseObject is an Object that can say where its data is, so that a raw copy skips the
// holes instead of reading them: a local disk.img (fileObject), or a clone source that lists
// its disk's extents (httpObject with an ExtentsURL). nil extents, without an error, mean that
// it cannot tell: the whole disk is read.
type sparseObject interface {
	DataExtents(ctx context.Context) ([]Extent, error)
}

const (
	// extentGap: a hole shorter than this is read with the data around it, not skipped (one
	// more request, or seek, costs more than reading it).
	extentGap = 1 << 20
	// maxExtents bounds the list (16 bytes each here, some 30 in JSON): a disk more fragmented
	// than this is read whole.
	maxExtents = 1 << 16
)

// fileExtents lists the data extents of the first size bytes of f (SEEK_DATA and SEEK_HOLE),
// merged across holes shorter than extentGap: a block device, or a file system that does not
// tell, is one extent, the whole disk. nil when it cannot tell at all. f stays open while it
// looks (a clone source closing meanwhile does not hand its descriptor to another file).
func fileExtents(f *os.File, size int64) []Extent {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil
	}
	var out []Extent
	if err := rc.Control(func(fd uintptr) { out = extentsOf(int(fd), size) }); err != nil { //nolint:gosec // a descriptor fits
		return nil
	}
	return out
}

func extentsOf(fd int, size int64) []Extent {
	out := []Extent{}
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole after off
		}
		if err != nil || data < off {
			return nil
		}
		if data >= size {
			break
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil || hole <= data {
			return nil
		}
		hole = min(hole, size)
		if n := len(out); n > 0 && data-(out[n-1].Off+out[n-1].Len) < extentGap {
			out[n-1].Len = hole - out[n-1].Off
		} else {
			if len(out) == maxExtents {
				return nil
			}
			out = append(out, Extent{Off: data, Len: hole - data})
		}
		off = hole
	}
	return out
}

// validExtents says whether extents are sorted, apart, non-empty and within a disk of size:
// a list a copy may skip the rest of.
func validExtents(extents []Extent, size int64) error {
	end := int64(0)
	for i, e := range extents {
		if e.Len <= 0 || e.Off < end || e.Off > size-e.Len {
			return fmt.Errorf("extent %d [%d, +%d) is empty, out of order or past the disk's %d bytes", i, e.Off, e.Len, size)
		}
		end = e.Off + e.Len
	}
	return nil
}

func (o *fileObject) DataExtents(context.Context) ([]Extent, error) {
	return fileExtents(o.f, o.size), nil
}

// DataExtents reads the clone source's list of its disk's extents, when it is one (the source
// has an ExtentsURL): nil when it has none, or the list cannot be read within a minute or is
// not one (the copy then reads the whole disk, as from any server).
func (o *httpObject) DataExtents(ctx context.Context) ([]Extent, error) {
	if o.src.ExtentsURL == "" {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.src.ExtentsURL, nil)
	if err != nil {
		return nil, nil //nolint:nilerr // not a list: the whole disk is read
	}
	for k, vs := range o.src.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, err := o.client.Do(req)
	if err != nil {
		return nil, nil //nolint:nilerr // as above
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil
	}
	extents, err := decodeExtents(io.LimitReader(resp.Body, maxExtents*64))
	if err != nil || validExtents(extents, o.size) != nil {
		return nil, nil //nolint:nilerr // as above
	}
	return extents, nil
}

// decodeExtents reads a JSON array of at most maxExtents extents.
func decodeExtents(r io.Reader) ([]Extent, error) {
	dec := json.NewDecoder(r)
	if t, err := dec.Token(); err != nil || t != json.Delim('[') {
		return nil, fmt.Errorf("not a list of extents")
	}
	out := []Extent{}
	for dec.More() {
		if len(out) == maxExtents {
			return nil, fmt.Errorf("more than %d extents", maxExtents)
		}
		var e Extent
		if err := dec.Decode(&e); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	return out, nil
}
