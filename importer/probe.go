package importer

import (
	"archive/tar"
	"context"
	"errors"
	"io"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// Probe reads just enough of the source to tell its format and virtual size, so that a
// controller can size the volume before importing. For a compressed raw stream the virtual
// size is not known without reading it all: the result says -1.
func Probe(ctx context.Context, o Options) (*transfer.Result, error) {
	res, err := probe(ctx, o)
	if err == nil {
		res.Succeeded = true
	}
	return res, err
}

// Check tells the source's revision (Result.Revision) without reading its image: what a
// scheduled image compares between checks. A registry tag is resolved to its manifest digest;
// an HTTP or S3 source answers with its ETag (else Last-Modified) from one small request.
func Check(ctx context.Context, o Options) (*transfer.Result, error) {
	o.defaults()
	res := &transfer.Result{}
	src := o.Source
	switch {
	case o.ChainIndex != nil:
		src = o.ChainIndex.Source // a new backup is a new index
	case len(o.Chain) > 0:
		return res, transfer.Permanent(transfer.ReasonNoRevision, "a chain given layer by layer has no revision to check: keep it with a backup index")
	}
	err := o.Retry.Do(ctx, o.Log, "check "+src.String(), func() (err error) {
		res.Revision, err = revisionOf(ctx, src)
		return err
	})
	if err != nil {
		return res, err
	}
	if res.Revision == "" {
		return res, transfer.Permanent(transfer.ReasonNoRevision,
			"%s gives no ETag or Last-Modified, so a change cannot be seen without downloading it: serve it from a server that does "+
				"(most do; the bundled object store does), or from a registry", src)
	}
	res.Succeeded = true
	return res, nil
}

func revisionOf(ctx context.Context, s Source) (string, error) {
	if r, ok := s.(interface {
		Revision(context.Context) (string, error)
	}); ok {
		return r.Revision(ctx)
	}
	obj, err := s.Open(ctx)
	if err != nil {
		return "", err
	}
	defer obj.Close()
	return obj.Revision(), nil
}

func probe(ctx context.Context, o Options) (*transfer.Result, error) {
	o.defaults()
	res := &transfer.Result{VirtualSize: -1}
	if len(o.Chain) > 0 || o.ChainIndex != nil {
		return res, probeChain(ctx, &o, res)
	}
	var obj Object
	err := o.Retry.Do(ctx, o.Log, "open "+o.Source.String(), func() (err error) {
		obj, err = o.Source.Open(ctx)
		return err
	})
	if err != nil {
		return res, err
	}
	defer obj.Close()
	res.Revision = obj.Revision()
	f := &fetcher{ctx: ctx, obj: obj, name: o.Source.String(), retry: o.Retry, log: o.Log, stall: o.StallTimeout}
	defer func() { res.BytesRead = f.read.Load() }()

	if obj.RandomAccess() && o.Format == "" && obj.Size() > 0 {
		head := make([]byte, min(sniffLen, obj.Size()))
		if _, err := f.ReadAt(head, 0); err != nil && !errors.Is(err, io.EOF) {
			return res, err
		}
		if isIndex(head) {
			cs, err := transfer.ParseChecksum(o.Checksum)
			if err == nil {
				err = indexAllowed(&o, cs)
			}
			if err != nil {
				return res, err
			}
			o.ChainIndex = &ChainIndex{Source: o.Source}
			return res, probeChain(ctx, &o, res)
		}
		if sniffCompression(head) == CompressionNone {
			format := sniffFormat(head)
			if format == FormatRaw && isFixedVHD(f) {
				format = FormatVPC
			}
			if format != FormatRaw && format != FormatISO && format != FormatOVA {
				img, err := openImage(format, head, checkedHead{head, boundedReaderAt{r: f, size: obj.Size()}}, obj.Size())
				if err != nil {
					return res, err
				}
				defer img.Close()
				res.Format, res.VirtualSize = string(format), img.Size()
				return res, nil
			}
		}
	}
	s := f.stream()
	defer s.Close()
	st, err := openStream(s, o.Format != "")
	if err != nil {
		return res, err
	}
	defer st.Close()
	comp, format, head, data := st.comp, st.format, st.head, st.data
	res.Compression = string(comp)
	switch format {
	case FormatQcow2:
		h, err := parseQcow2Header(head, -1)
		if err != nil {
			return res, err
		}
		res.Format, res.VirtualSize = string(format), int64(h.Size) //nolint:gosec // checked by parseQcow2Header
	case FormatVMDK:
		res.Format = string(format)
		h, err := parseStreamHeader(head)
		if err != nil {
			return res, err
		}
		res.VirtualSize = h.size
	case FormatOVA:
		d, err := readOVF(tar.NewReader(data), o.OVADisk)
		if err != nil {
			return res, err
		}
		res.Format = string(format)
		if d.capacity > 0 {
			res.VirtualSize = d.capacity
		}
	case FormatRaw, FormatISO:
		res.Format = string(FormatRaw)
		if comp == CompressionNone {
			res.VirtualSize = obj.Size()
		} else if c, ok := obj.(interface{ capacity() int64 }); ok && c.capacity() > 0 {
			// A VM artifact's disk says the capacity of the claim it was exported from: the
			// disk is no larger.
			res.VirtualSize = c.capacity()
		}
	case FormatVPC, FormatVDI, FormatVHDX:
		res.Format = string(format)
		return res, needsRandomAccess(format, comp)
	}
	return res, nil
}
