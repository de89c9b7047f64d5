package importer

import (
	"archive/tar"
	"bufio"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"path"
	"strconv"
	"strings"

	"github.com/klauspost/compress/gzip"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// An OVA appliance is a tar archive: the OVF descriptor first, then the files it names. It is
// read in one pass: the descriptor says which member holds the chosen disk and how large the
// disk is; the members before it are passed over, the disk is converted as it streams (a
// streamOptimized vmdk, qcow2 or raw, gzip-compressed when the descriptor says so), and the
// disk gets the descriptor's capacity.

// maxOVF bounds the descriptor read into memory.
const maxOVF = 16 << 20

type ovfEnvelope struct {
	Files []ovfFile `xml:"References>File"`
	Disks []ovfDisk `xml:"DiskSection>Disk"`
}

type ovfFile struct {
	ID          string `xml:"id,attr"`
	Href        string `xml:"href,attr"`
	Compression string `xml:"compression,attr"`
	ChunkSize   string `xml:"chunkSize,attr"`
}

type ovfDisk struct {
	ID       string `xml:"diskId,attr"`
	FileRef  string `xml:"fileRef,attr"`
	Capacity string `xml:"capacity,attr"`
	Units    string `xml:"capacityAllocationUnits,attr"`
}

// ovaDisk is the disk an import takes from an appliance.
type ovaDisk struct {
	id, file    string
	compression string
	capacity    int64 // bytes; 0 when the descriptor does not say
}

// readOVF reads the descriptor, the archive's first member, and picks the disk named (by
// disk id or file name; empty: the first).
func readOVF(tr *tar.Reader, name string) (ovaDisk, error) {
	h, err := tr.Next()
	if err != nil {
		return ovaDisk{}, ovaError(err, transfer.ReasonMalformedImage, "malformed tar archive")
	}
	if !strings.EqualFold(path.Ext(h.Name), ".ovf") {
		return ovaDisk{}, transfer.Permanent(transfer.ReasonUnsupportedFormat,
			"the source is a tar archive whose first member, %q, is not an OVF descriptor: diskpipe imports a tar archive only as an OVA appliance; extract the disk image and import that", h.Name)
	}
	b, err := io.ReadAll(io.LimitReader(tr, maxOVF+1))
	if err != nil {
		return ovaDisk{}, ovaError(err, transfer.ReasonTruncatedImage, "truncated OVA: its descriptor "+h.Name)
	}
	if len(b) > maxOVF {
		return ovaDisk{}, transfer.Permanent(transfer.ReasonMalformedImage, "malformed OVA: its descriptor %s is larger than %d MiB", h.Name, maxOVF>>20)
	}
	var env ovfEnvelope
	if err := xml.Unmarshal(b, &env); err != nil {
		return ovaDisk{}, transfer.Permanent(transfer.ReasonMalformedImage, "malformed OVA: its descriptor %s: %w", h.Name, err)
	}
	return env.pick(name)
}

func (e *ovfEnvelope) pick(name string) (ovaDisk, error) {
	files := map[string]ovfFile{}
	for _, f := range e.Files {
		files[f.ID] = f
	}
	var names []string
	for _, d := range e.Disks {
		f, ok := files[d.FileRef]
		if !ok {
			if d.FileRef == "" { // a blank disk the appliance makes when deployed
				continue
			}
			return ovaDisk{}, transfer.Permanent(transfer.ReasonMalformedImage, "malformed OVA: disk %q refers to file %q, which the descriptor does not list", d.ID, d.FileRef)
		}
		names = append(names, fmt.Sprintf("%s (%s)", d.ID, f.Href))
		if name != "" && name != d.ID && name != f.Href {
			continue
		}
		if f.ChunkSize != "" {
			return ovaDisk{}, transfer.Permanent(transfer.ReasonUnsupportedFormat, "the OVA's disk %q is split into chunks, which diskpipe does not join: repack the appliance with whole files", d.ID)
		}
		capacity, err := ovfBytes(d.Capacity, d.Units)
		if err != nil {
			return ovaDisk{}, transfer.Permanent(transfer.ReasonMalformedImage, "malformed OVA: the capacity of disk %q: %w", d.ID, err)
		}
		return ovaDisk{id: d.ID, file: path.Clean(f.Href), compression: f.Compression, capacity: capacity}, nil
	}
	if name == "" || len(names) == 0 {
		return ovaDisk{}, transfer.Permanent(transfer.ReasonMalformedImage, "malformed OVA: its descriptor names no disk file")
	}
	return ovaDisk{}, transfer.Permanent(transfer.ReasonInvalidArgument, "the OVA has no disk %q: its disks are %s", name, strings.Join(names, ", "))
}

// ovfBytes reads an OVF capacity in bytes: "10" with units "byte * 2^30", say.
func ovfBytes(capacity, units string) (int64, error) {
	if capacity == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(strings.TrimSpace(capacity), 10, 63)
	if err != nil {
		return 0, fmt.Errorf("capacity %q is not a whole number", capacity)
	}
	factors := strings.Split(units, "*")
	if strings.TrimSpace(factors[0]) != "byte" && strings.TrimSpace(units) != "" {
		return 0, fmt.Errorf("units %q do not start with byte", units)
	}
	for _, f := range factors[1:] {
		f = strings.TrimSpace(f)
		var m uint64
		if base, exp, ok := strings.Cut(f, "^"); ok {
			b, err1 := strconv.ParseUint(base, 10, 16)
			e, err2 := strconv.ParseUint(exp, 10, 8)
			if err1 != nil || err2 != nil || b < 2 || float64(e)*math.Log2(float64(b)) >= 63 {
				return 0, fmt.Errorf("units %q: %q is not a power that fits", units, f)
			}
			m = 1
			for range e {
				m *= b
			}
		} else if m, err = strconv.ParseUint(f, 10, 63); err != nil {
			return 0, fmt.Errorf("units %q: %q is not a number", units, f)
		}
		hi, lo := bits.Mul64(n, m)
		if hi != 0 || lo > math.MaxInt64 {
			return 0, fmt.Errorf("%s %s is more bytes than a disk can have", capacity, units)
		}
		n = lo
	}
	return int64(n), nil //nolint:gosec // checked above
}

// importOVA converts the chosen disk of the appliance read from r and returns the format of
// its image and the disk's size.
func importOVA(r io.Reader, name string, t *Target) (Format, int64, error) {
	tr := tar.NewReader(r)
	d, err := readOVF(tr, name)
	if err != nil {
		return FormatOVA, 0, err
	}
	if d.capacity > 0 { // refused before a byte of the disk is read
		if err := t.fits(d.capacity); err != nil {
			return FormatOVA, 0, err
		}
	}
	member, err := findMember(tr, d)
	if err != nil {
		return FormatOVA, 0, err
	}
	size := member.Size
	data := io.Reader(tr)
	switch d.compression {
	case "", "identity":
	case "gzip":
		gz, err := gzip.NewReader(tr)
		if err != nil {
			return FormatOVA, 0, ovaError(err, transfer.ReasonMalformedImage, "malformed OVA: its disk "+d.file+" is not gzip")
		}
		defer gz.Close()
		data, size = gz, -1
	default:
		return FormatOVA, 0, transfer.Permanent(transfer.ReasonUnsupportedFormat, "the OVA's disk %s is compressed with %q, which diskpipe does not read", d.file, d.compression)
	}
	br := bufio.NewReaderSize(data, copyBufferSize)
	head, err := br.Peek(sniffLen)
	if err != nil && !errors.Is(err, io.EOF) {
		return FormatOVA, 0, ovaError(err, transfer.ReasonTruncatedImage, "truncated OVA: its disk "+d.file)
	}
	format, vsize, err := convertStream(br, head, sniffFormat(head), size, t)
	switch {
	case errors.Is(err, errNeedsRandomAccess):
		return FormatOVA, 0, transfer.Permanent(transfer.ReasonNeedsRandomAccess,
			"the OVA's disk %s is a %s image, which cannot be read from inside an archive: make the appliance's disk a streamOptimized vmdk "+
				"('qemu-img convert -O vmdk -o subformat=streamOptimized'), or import the disk on its own", d.file, format)
	case err != nil:
		return FormatOVA, 0, err
	case d.capacity > 0 && vsize > d.capacity:
		return FormatOVA, 0, transfer.Permanent(transfer.ReasonMalformedImage,
			"malformed OVA: its disk %s holds %s, more than the %s its descriptor gives disk %q", d.file, bytesString(vsize), bytesString(d.capacity), d.id)
	}
	return FormatOVA, max(vsize, d.capacity), nil
}

// findMember reads the archive up to the disk's member.
func findMember(tr *tar.Reader, d ovaDisk) (*tar.Header, error) {
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, transfer.Permanent(transfer.ReasonTruncatedImage, "truncated OVA: it ends before its disk %s", d.file)
		}
		if err != nil {
			return nil, ovaError(err, transfer.ReasonMalformedImage, "malformed OVA: looking for its disk "+d.file)
		}
		if h.Typeflag == tar.TypeReg && path.Clean(h.Name) == d.file {
			return h, nil
		}
	}
}

// ovaError classifies a failure to read the archive: the source's own failures (a dropped
// connection is transient) pass as they are; the rest is the archive's fault.
func ovaError(err error, reason transfer.Reason, what string) error {
	var te *transfer.Error
	if errors.As(err, &te) || errors.Is(err, context.Canceled) {
		return err
	}
	return transfer.Permanent(reason, "%s: %w", what, err)
}
