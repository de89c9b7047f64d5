package importer

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"time"

	"github.com/lima-vm/go-qcow2reader/image"

	"github.com/diskpipe/diskpipe/internal/backup"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// A backup chain is a full backup and the incrementals taken after it, each a qcow2 holding
// only the clusters that changed since the one before. It is restored into one disk with no
// scratch: every layer is read at random through its own block cache, and each cluster of
// the disk is taken from the newest layer that holds it — a zero cluster reads as zeros, an
// unallocated one falls through to the older layers — and written once. The order is the
// chain's own (its list, or its index's checkpoints), never a backing file's name: a layer's
// backing name (KubeVirt's name the VM's overlay, which means nothing here) is removed from
// the header the reader sees, so no path in an image is ever opened.

// MaxChainLayers bounds a chain: each layer keeps its own cache and tables in memory.
const MaxChainLayers = backup.MaxChainLayers

// The chain's cache: chainBlocks blocks of 1 MiB shared out by the layers' sizes, from
// chainMinBlocks to chainMaxBlocks a layer (layerBlocks). A 4-layer chain of a 4 GiB disk
// from the bundled store took 5.5 s with 24 blocks for its full and 8 for each incremental
// (79 MiB peak RSS), 6.2 s with 16 and 6 (63 MiB), 10 s with 4.5 MiB of blocks of 256 KiB
// each: the workers wait on the fetches a small cache makes again.
const (
	chainHashChunk = 4 << 20
	chainBlocks    = 40
	chainMinBlocks = 6
	chainMaxBlocks = 16
)

// ChainLayer is one qcow2 of a backup chain.
type ChainLayer struct {
	Source Source
	// Name says which layer a message is about (its checkpoint, or its object); empty names it
	// by its source.
	Name string
	// Checksum is the layer's expected digest, "<algorithm>:<hex>"; empty checks none.
	Checksum string
	// Size and VirtualSize, when not zero, are the object's length and its disk's size as the
	// chain's index records them: a layer whose object or header says otherwise is refused.
	Size, VirtualSize int64
}

// ChainIndex is a point of a disk's backups, restored through their index (internal/backup).
type ChainIndex struct {
	// Source is the index object.
	Source Source
	// Point is the checkpoint restored; empty is the newest.
	Point string
	// Layer is where a layer of the index is read, by its checkpoint and its object's name
	// relative to the index; nil reads it beside the index, as Source's Beside names it.
	Layer func(checkpoint, object string) (Source, error)
}

// besideSource is a source that names its neighbours: the layers beside a backup index.
type besideSource interface {
	Beside(object string) (Source, error)
}

// Beside is the object of that name in the index's directory, read as the index is (a
// presigned URL's query, which signs one object only, is not kept).
func (s *HTTPSource) Beside(object string) (Source, error) {
	if q, err := url.ParseQuery(urlQuery(s.URL)); err == nil && (q.Has("X-Amz-Signature") || q.Has("Signature")) {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument,
			"the backup index was given by a presigned URL, which signs the index alone: give it as a chain source (source.chain), whose layers are presigned too")
	}
	u, err := backup.ObjectURL(s.URL, object)
	if err != nil {
		return nil, err
	}
	layer := *s
	layer.URL, layer.ExtentsURL = u, ""
	return &layer, nil
}

// Beside is the object of that name beside the index, in its bucket, with its credentials.
func (s *S3Source) Beside(object string) (Source, error) {
	return &S3Source{Config: s.Config, Bucket: s.Bucket, Object: backup.ObjectKey(s.Object, object)}, nil
}

// indexAllowed refuses to take a source for a backup index where its bytes were pinned: a
// checksum (or an OVA's disk) says which image the source must be, and a server that answered
// an index in its place would otherwise have the layers it names restored, checked only by
// the digests it chose.
func indexAllowed(o *Options, cs *transfer.Checksum) error {
	if cs.Want != "" || o.OVADisk != "" {
		return transfer.Permanent(transfer.ReasonUnsupportedFormat,
			"%s is a backup index, not the image the checksum pins: restore an index through a chain source (source.chain), whose layers the index's digests check", o.Source)
	}
	return nil
}

// urlQuery is the query of a URL, "" when it has none or does not parse.
func urlQuery(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.RawQuery
	}
	return ""
}

// isIndex tells a backup index by its first bytes: an http or s3 source that names one (a
// DataVolume's, as a CDI client writes it) restores its newest point.
func isIndex(head []byte) bool {
	head = bytes.TrimLeft(head, " \t\r\n")
	return len(head) > 0 && head[0] == '{' && bytes.Contains(head, []byte(`"`+backup.Format+`"`))
}

// resolveChain turns o.ChainIndex into o.Chain: the index read (at most backup.MaxIndexBytes),
// checked, and the point's layers, each to be checked against what the index says of it.
func resolveChain(ctx context.Context, o *Options) error {
	if o.ChainIndex == nil {
		return nil
	}
	var b []byte
	err := o.Retry.Do(ctx, o.Log, "read the backup index "+o.ChainIndex.Source.String(), func() error {
		obj, err := o.ChainIndex.Source.Open(ctx)
		if err != nil {
			return err
		}
		defer obj.Close()
		r, err := obj.ReadRange(ctx, 0, -1)
		if err != nil {
			return err
		}
		defer r.Close()
		b, err = io.ReadAll(io.LimitReader(r, backup.MaxIndexBytes+1))
		return err
	})
	if err != nil {
		return transfer.Within("the backup index", err)
	}
	ix, err := backup.Parse(b)
	if err != nil {
		return err
	}
	layers, err := ix.Chain(o.ChainIndex.Point, MaxChainLayers)
	if err != nil {
		return err
	}
	layer := o.ChainIndex.Layer
	if layer == nil {
		b, ok := o.ChainIndex.Source.(besideSource)
		if !ok {
			return transfer.Permanent(transfer.ReasonInvalidArgument, "a backup index from %s names no layers beside it", o.ChainIndex.Source)
		}
		layer = func(_, object string) (Source, error) { return b.Beside(object) }
	}
	o.Chain = make([]ChainLayer, len(layers))
	for i, l := range layers {
		src, err := layer(l.Checkpoint, l.Object)
		if err != nil {
			return err
		}
		o.Chain[i] = ChainLayer{Source: src, Name: l.Checkpoint, Checksum: "sha256:" + l.SHA256, Size: l.Size, VirtualSize: l.VirtualSize}
	}
	o.Log.Info("Restoring from the backup index", "point", layers[len(layers)-1].Checkpoint, "layers", len(layers))
	return nil
}

// openChain opens the layers of o.Chain (resolved first from its index) and checks that they
// fit together.
func openChain(ctx context.Context, o *Options) (*chainImage, error) {
	c := &chainImage{}
	if err := resolveChain(ctx, o); err != nil {
		return c, err
	}
	n := len(o.Chain)
	if n > MaxChainLayers {
		return c, transfer.Permanent(transfer.ReasonInvalidArgument,
			"the chain has %d layers, more than the %d diskpipe restores at once: take a new full backup, or merge the oldest incrementals into the full with 'qemu-img commit'", n, MaxChainLayers)
	}
	for i := range o.Chain {
		l, err := openLayer(ctx, o, i)
		if l != nil {
			c.layers = append(c.layers, l)
		}
		if err != nil {
			return c, err
		}
	}
	var total int64
	for _, l := range c.layers {
		total += l.f.obj.Size()
	}
	for _, l := range c.layers {
		if err := l.open(o, layerBlocks(l.f.obj.Size(), total, len(c.layers))); err != nil {
			return c, err
		}
	}
	return c, c.fits()
}

// probeChain tells the chain's disk size, reading its layers' headers only.
func probeChain(ctx context.Context, o *Options, res *transfer.Result) error {
	c, err := openChain(ctx, o)
	defer c.Close() //nolint:staticcheck // a chain opened in part is closed as far as it was opened
	res.BytesRead = c.read()
	if err != nil {
		return err
	}
	res.Format, res.VirtualSize = string(FormatQcow2), c.Size()
	return nil
}

// read is what the layers' sources have sent.
func (c *chainImage) read() int64 {
	var n int64
	for _, l := range c.layers {
		n += l.f.read.Load()
	}
	return n
}

// chainLayer is an open layer.
type chainLayer struct {
	label   string
	f       *fetcher
	cache   *blockCache
	img     image.Image
	cluster int64
	head    []byte
	cs      *transfer.Checksum
	hash    *orderedHash
}

// chainImage is the disk a chain restores, as one image: Extent and ReadAt resolve each range
// to the newest layer that holds it.
type chainImage struct {
	layers []*chainLayer // the full backup first
	size   int64
}

// importChain restores o.Chain into t.
func importChain(ctx context.Context, o *Options, t *Target, res *transfer.Result, start time.Time) error {
	c, err := openChain(ctx, o)
	defer c.Close() //nolint:staticcheck // a chain opened in part is closed as far as it was opened
	defer func() {
		res.BytesRead = c.read()
		for _, l := range c.layers {
			res.FirstByteSeconds = firstOf(res.FirstByteSeconds, since(&l.f.first, start))
			res.LastByteSeconds = max(res.LastByteSeconds, since(&l.f.last, start))
		}
	}()
	if err != nil {
		return err
	}
	if o.ChainIndex != nil {
		res.Revision = o.Chain[len(o.Chain)-1].Name // the checkpoint restored
	}
	vsize := c.Size()
	res.Format, res.VirtualSize = string(FormatQcow2), vsize
	o.Progress.SetTotal(vsize)
	none, _ := transfer.ParseChecksum("") // the layers' hashes are resumed below, each on its own
	cp, err := startOrResume(o, c.origin(), FormatQcow2, vsize, t, none)
	if err != nil {
		return err
	}
	c.resumeHashes(cp)

	// One hasher reads the layers whose digests are checked, one after another, each in order
	// in requests of chainHashChunk, beside the converter rather than through its cache: the
	// converter reads only the clusters no newer layer holds, and a hasher sharing its cache
	// ran ahead or fell behind it and had blocks evicted before the other came for them (a
	// full read 1.5 to 2.5 times, measured). A layer hashed is read twice.
	hashed := make(chan error, 1)
	go func() {
		for _, l := range c.layers {
			if l.cs.Want != "" {
				if err := l.hash.run(ctx, l.f, l.f.obj.Size()); err != nil {
					hashed <- transfer.Within(l.label, err)
					return
				}
			}
		}
		hashed <- nil
	}()
	if err = convertInPieces(o, c, t, cp, c.markHashes); err != nil {
		for _, l := range c.layers {
			l.hash.stop()
		}
	}
	if herr := <-hashed; err == nil {
		err = herr
	}
	if err != nil {
		return imageError(err)
	}
	for _, l := range c.layers {
		if l.cs.Want == "" {
			continue
		}
		if err := l.cs.Verify(); err != nil {
			return transfer.Within(l.label, err)
		}
		o.Log.Info("Layer verified", "layer", l.label, "digest", l.cs.Digest())
	}
	return t.Finish(vsize)
}

// resumeHashes goes on with each layer's hash from the state cp recorded. A state that does
// not restore (or a checkpoint of none) costs only reading that layer again from its start.
func (c *chainImage) resumeHashes(cp *checkpoint) {
	if len(cp.Layers) != len(c.layers) {
		return
	}
	for i, l := range c.layers {
		st := cp.Layers[i]
		if l.cs.Want == "" || st.Hashed <= 0 || st.Hashed > l.f.obj.Size() {
			continue
		}
		if l.cs.Restore(st.Hash) != nil {
			l.cs.Hash.Reset()
			continue
		}
		l.hash.off = st.Hashed
	}
}

// markHashes records each layer's hash state in cp.
func (c *chainImage) markHashes(cp *checkpoint) {
	cp.Layers = make([]hashState, len(c.layers))
	for i, l := range c.layers {
		cp.Layers[i].Hashed, cp.Layers[i].Hash = l.hash.snapshot()
	}
}

// firstOf is the earlier of two times after the start, 0 meaning none.
func firstOf(a, b float64) float64 {
	if a == 0 || b > 0 && b < a {
		return b
	}
	return a
}

// openLayer opens o.Chain[i] and checks it can be a layer there. A layer returned with an
// error is to be closed.
func openLayer(ctx context.Context, o *Options, i int) (*chainLayer, error) {
	spec := o.Chain[i]
	l := &chainLayer{label: fmt.Sprintf("layer %d of %d (%s)", i+1, len(o.Chain), cmp.Or(spec.Name, spec.Source.String()))}
	var obj Object
	err := o.Retry.Do(ctx, o.Log, "open "+spec.Source.String(), func() (err error) {
		obj, err = spec.Source.Open(ctx)
		return err
	})
	if err != nil {
		return nil, transfer.Within(l.label, err)
	}
	l.f = &fetcher{ctx: ctx, obj: obj, name: spec.Source.String(), retry: o.Retry, log: o.Log, stall: o.StallTimeout}
	size := obj.Size()
	switch {
	case !obj.RandomAccess() || size <= 0:
		return l, transfer.Permanent(transfer.ReasonNeedsRandomAccess,
			"%s: a chain's layers are read at random, and its server does not serve ranges (any S3 store and the bundled store do)", l.label)
	case spec.Size > 0 && size != spec.Size:
		return l, transfer.Permanent(transfer.ReasonBrokenChain,
			"%s: the chain's index says its object holds %d bytes, and it holds %d: the object was replaced or cut short", l.label, spec.Size, size)
	}
	head := make([]byte, min(sniffLen, size))
	if _, err := l.f.ReadAt(head, 0); err != nil && !errors.Is(err, io.EOF) {
		return l, transfer.Within(l.label, err)
	}
	if c, f := sniffCompression(head), sniffFormat(head); c != CompressionNone || f != FormatQcow2 {
		return l, transfer.Permanent(transfer.ReasonUnsupportedFormat,
			"%s is %s, not qcow2: every layer of a chain is a qcow2 image", l.label, cmp.Or(string(c), string(f)))
	}
	h, err := parseQcow2(head, size, true)
	if err != nil {
		return l, transfer.Within(l.label, err)
	}
	switch {
	case i == 0 && h.BackingFile != "":
		return l, transfer.Permanent(transfer.ReasonBackingFile,
			"%s names a backing file %s: a chain starts with a full backup, which names none (give the layers full backup first)", l.label, h.BackingFile)
	case i > 0 && h.BackingFile == "":
		// An incremental names the disk it was taken over (qemu-img create -b, KubeVirt's
		// overlay); a full names none.
		return l, transfer.Permanent(transfer.ReasonBrokenChain,
			"%s names no backing file, so it is a full backup, and a chain has one, first: the layers are out of order (restore from this full and the layers after it)", l.label)
	case i > 0 && h.IncompatFeatures&qcow2IncompatExtendedL2 != 0:
		return l, transfer.Permanent(transfer.ReasonUnsupportedFormat,
			"%s has subclusters (extended L2 entries), which diskpipe does not merge with older layers: write incrementals without extended_l2", l.label)
	case spec.VirtualSize > 0 && int64(h.Size) != spec.VirtualSize: //nolint:gosec // at most 2^56, checked
		return l, transfer.Permanent(transfer.ReasonBrokenChain,
			"%s: the chain's index says its disk is %d bytes, and its header says %d", l.label, spec.VirtualSize, h.Size)
	}
	if l.cs, err = transfer.ParseChecksum(spec.Checksum); err != nil {
		return l, transfer.Within(l.label, err)
	}
	l.hash = &orderedHash{cs: l.cs, chunk: chainHashChunk}
	l.cluster = 1 << h.ClusterBits
	l.head = head
	return l, nil
}

// open gives the layer its cache of blocks and opens its image. The reader sees the header
// without the backing file's name, so it never looks for one.
func (l *chainLayer) open(o *Options, blocks int) error {
	size := l.f.obj.Size()
	l.cache = newBlockCache(l.f, size, cacheBlockSize, blocks, o.Parallel, min(readahead, blocks/8))
	l.cache.prefix = l.head
	own := slices.Clone(l.head)
	clear(own[qcow2BackingFields:qcow2BackingFieldsEnd])
	var err error
	if l.img, err = openQcow2(own, boundedReaderAt{r: l.cache, size: size}); err != nil {
		return transfer.Within(l.label, err)
	}
	return nil
}

// layerBlocks is a layer's share of the chain's cache, by its share of the chain's bytes: the
// converter's eight workers read where the disk's data is, mostly in the full, and a layer
// needs about as many blocks as they hold in it, with read-ahead, or it fetches blocks again.
func layerBlocks(size, total int64, layers int) int {
	// The floor shrinks with the chain, to two blocks a layer, so that 64 layers stay near
	// 128 MiB.
	floor := int64(max(2, min(chainMinBlocks, chainBlocks/layers)))
	if total <= 0 {
		return int(floor)
	}
	return int(max(floor, min(chainMaxBlocks, chainBlocks*size/total)))
}

// fits checks that the layers can follow one another: a disk never shrinks, so a layer smaller
// than the one before it is out of order. The chain's disk is its newest layer's.
func (c *chainImage) fits() error {
	for i := 1; i < len(c.layers); i++ {
		if prev, cur := c.layers[i-1], c.layers[i]; cur.img.Size() < prev.img.Size() {
			return transfer.Permanent(transfer.ReasonBrokenChain,
				"%s has a disk of %d bytes, smaller than %s's %d: the layers are out of order (a disk only grows between backups)",
				cur.label, cur.img.Size(), prev.label, prev.img.Size())
		}
	}
	c.size = c.layers[len(c.layers)-1].img.Size()
	return nil
}

// origin is what a checkpoint of the restore is matched against: every layer's source, version
// and size. A layer that tells no version makes the restore one that cannot resume.
func (c *chainImage) origin() origin {
	type part struct {
		Source, Identity string
		Size             int64
	}
	parts := make([]part, len(c.layers))
	for i, l := range c.layers {
		if parts[i] = (part{l.f.name, l.f.obj.Identity(), l.f.obj.Size()}); parts[i].Identity == "" {
			return origin{name: "chain", size: -1}
		}
	}
	b, _ := json.Marshal(parts)
	sum := sha256.Sum256(b)
	return origin{name: fmt.Sprintf("chain of %d layers, newest %s", len(c.layers), c.layers[len(c.layers)-1].f.name),
		identity: hex.EncodeToString(sum[:]), size: -1}
}

func (c *chainImage) Size() int64      { return c.size }
func (c *chainImage) Type() image.Type { return image.Type(FormatQcow2) }
func (c *chainImage) Readable() error  { return nil }

func (c *chainImage) Close() error {
	for _, l := range c.layers {
		if l.f == nil {
			continue
		}
		if l.img != nil {
			l.img.Close()
		}
		l.f.obj.Close()
	}
	return nil
}

// find says where the disk's bytes at off come from: the newest layer that holds them (-1 when
// they read as zeros) and for how many bytes from off, at most n, that holds.
func (c *chainImage) find(off, n int64) (int, int64, error) {
	for i := len(c.layers) - 1; i >= 0; i-- {
		l := c.layers[i]
		if off >= l.img.Size() {
			continue // an older, smaller disk: past its end the disk falls through to zeros
		}
		e, err := l.extent(off, min(n, l.img.Size()-off))
		if err != nil {
			return 0, 0, err
		}
		n = e.Length
		if e.Allocated {
			if e.Zero {
				return -1, n, nil
			}
			return i, n, nil
		}
	}
	return -1, n, nil
}

// extent is the layer's own extent at off, at most n bytes long. The reader is asked from a
// cluster's start: go-qcow2reader's Extent overstates the first cluster of a range that starts
// inside one (by where in it the range starts).
func (l *chainLayer) extent(off, n int64) (image.Extent, error) {
	from := off - off%l.cluster
	whole := (off + n - from + l.cluster - 1) / l.cluster * l.cluster
	e, err := l.img.Extent(from, min(whole, l.img.Size()-from))
	if err != nil {
		return e, transfer.Within(l.label, err)
	}
	e.Length = min(e.Start+e.Length-off, n)
	if e.Length <= 0 {
		return e, transfer.Permanent(transfer.ReasonMalformedImage, "%s: its tables describe no bytes at %d", l.label, off)
	}
	e.Start = off
	return e, nil
}

// Extent is the run from start of bytes one layer holds (or that read as zeros).
func (c *chainImage) Extent(start, length int64) (image.Extent, error) {
	i, n, err := c.find(start, length)
	return image.Extent{Start: start, Length: n, Allocated: i >= 0, Zero: i < 0}, err
}

// ReadAt reads each run from the layer that holds it.
func (c *chainImage) ReadAt(p []byte, off int64) (int, error) {
	if off >= c.size {
		return 0, io.EOF
	}
	var eof error
	if rest := c.size - off; int64(len(p)) > rest {
		p, eof = p[:rest], io.EOF
	}
	for done := int64(0); done < int64(len(p)); {
		i, n, err := c.find(off+done, int64(len(p))-done)
		if err != nil {
			return int(done), err
		}
		piece := p[done : done+n]
		if i < 0 {
			clear(piece)
		} else if m, err := c.layers[i].img.ReadAt(piece, off+done); m < len(piece) {
			return int(done) + m, transfer.Within(c.layers[i].label, cmp.Or(err, io.ErrUnexpectedEOF))
		}
		done += n
	}
	return len(p), eof
}
