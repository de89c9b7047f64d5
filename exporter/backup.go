package exporter

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/diskpipe/diskpipe/internal/backup"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore"
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

func (p *Pieces) String() string {
	return fmt.Sprintf("%d pieces of a %d-byte disk", len(p.Sums), p.Size)
}

// BackupOptions keep an export as a backup in an index of a disk's backups (docs/backups.md).
type BackupOptions struct {
	Client *objectstore.Client
	// Bucket holds the index, at Index, and the backup, at Object beside it.
	Bucket, Index, Object string
	// Checkpoint names the backup in the index.
	Checkpoint string
	// Full writes the whole disk even when the index has a backup to follow.
	Full bool
	// MaxChain is how many incrementals may follow a full; KeepFulls how many fulls the index
	// keeps, with their incrementals (0: all).
	MaxChain, KeepFulls int
	// Disk names the disk in the index, for people.
	Disk string
	Log  *slog.Logger
}

// Keep exports o.Source as a backup: it reads the index and, unless a full is due, takes
// only the pieces changed since its newest backup (whose sums it reads); it writes the backup
// and its sums beside the index, then the index with the backup in it, in one PUT, so a
// restore that reads the index meanwhile sees the one before, whole; last it drops what
// KeepFulls no longer keeps, from the index first, then from the store.
func Keep(ctx context.Context, o Options, b BackupOptions) (*transfer.Result, error) {
	log := b.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	layer, err := backupNames(b)
	if err != nil {
		return nil, err
	}
	ix, err := readIndex(ctx, b)
	if err != nil {
		return nil, err
	}
	for i, l := range ix.Layers {
		if l.Checkpoint != b.Checkpoint {
			continue
		}
		if i == len(ix.Layers)-1 && l.Object == layer.Object {
			// An attempt that ended after writing the index: the backup is kept.
			log.Info("The index already holds this backup", "checkpoint", b.Checkpoint)
			if err := o.Sink.Abort(ctx); err != nil { // the upload this attempt began
				log.Warn("Could not abort the upload", "err", err)
			}
			return &transfer.Result{Succeeded: true, Format: string(FormatQcow2), VirtualSize: l.VirtualSize, BytesWritten: l.Size,
				Digest: "sha256:" + l.SHA256, Revision: l.Checkpoint, URL: objectstore.ObjectURL(b.Bucket, b.Object)}, nil
		}
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument,
			"the backup index %s already holds checkpoint %q (its %d. of %d backups): name the backup anew", b.Index, b.Checkpoint, i+1, len(ix.Layers))
	}
	layer.Created = time.Now().UTC()
	size := int64(-1)
	if d, err := openDisk(o.Source, o.DeclaredSize); err == nil {
		size = d.size
		d.Close()
	}
	if parent, ok := incrementalParent(ix, b); ok && size >= parent.VirtualSize-511 {
		sums, err := readObject(ctx, b.Client, b.Bucket, backup.ObjectKey(b.Index, parent.Sums), maxSums(parent.VirtualSize))
		if err == nil {
			o.Since, err = ParsePieces(sums, parent.VirtualSize)
		}
		if err != nil {
			log.Warn("Taking a full backup: the parent's sums cannot be read", "parent", parent.Checkpoint, "err", err)
			o.Since = nil
		} else {
			layer.Parent, o.Backing = parent.Checkpoint, parent.Object
		}
	}
	pieces := &Pieces{}
	o.Pieces, o.Format = pieces, FormatQcow2
	log.Info("Keeping a backup", "checkpoint", b.Checkpoint, "parent", layer.Parent, "index", objectstore.ObjectURL(b.Bucket, b.Index))
	res, err := Export(ctx, o)
	if err != nil {
		return res, err
	}
	res.Revision = b.Checkpoint
	sum := pieces.Bytes()
	if _, err := b.Client.PutObject(ctx, b.Bucket, backup.ObjectKey(b.Index, layer.Sums), bytes.NewReader(sum), int64(len(sum)),
		minio.PutObjectOptions{ContentType: "application/octet-stream"}); err != nil {
		return res, transfer.AsTarget(objectstore.Classify(err, "writing "+objectstore.ObjectURL(b.Bucket, backup.ObjectKey(b.Index, layer.Sums))))
	}
	layer.Size, layer.VirtualSize, layer.SHA256 = res.BytesWritten, divUp(res.VirtualSize, 512)*512, strings.TrimPrefix(res.Digest, "sha256:")
	ix.Layers = append(ix.Layers, layer)
	dropped := retain(ix, b.KeepFulls)
	if err := writeIndex(ctx, b, ix); err != nil {
		return res, err
	}
	for _, l := range dropped {
		for _, name := range []string{l.Object, l.Sums} {
			if name == "" {
				continue
			}
			if err := b.Client.RemoveObject(ctx, b.Bucket, backup.ObjectKey(b.Index, name), minio.RemoveObjectOptions{}); err != nil {
				log.Warn("Could not delete a backup the index no longer keeps", "object", name, "err", err)
			}
		}
	}
	if len(dropped) > 0 {
		log.Info("Dropped old backups", "backups", len(dropped), "keepFulls", b.KeepFulls)
	}
	return res, nil
}

// backupNames is the new backup's entry as far as its names go: its object, beside the
// index, and its sums. An index at the root of a bucket, a name with a policy wildcard, and a
// backup or sums object of the index's own name are refused: the exporter's account may write
// only under the index's directory, and the index must never overwrite a backup.
func backupNames(b BackupOptions) (backup.Layer, error) {
	dir := path.Dir(b.Index)
	object := strings.TrimPrefix(b.Object, dir+"/")
	layer := backup.Layer{Checkpoint: b.Checkpoint, Object: object, Sums: strings.TrimSuffix(object, ".qcow2") + ".sums"}
	switch {
	case dir == "." || dir == "/" || strings.ContainsAny(b.Index, "*?"):
		return layer, transfer.Permanent(transfer.ReasonInvalidArgument,
			"the backup index %q must be in a directory of its bucket, without '*' or '?' (e.g. vm-root/index.json): its backups are kept beside it", b.Index)
	case object == b.Object || strings.Contains(object, "/"):
		return layer, transfer.Permanent(transfer.ReasonInvalidArgument, "the backup %s must be beside its index %s", b.Object, b.Index)
	case backup.ObjectKey(b.Index, layer.Object) == b.Index || backup.ObjectKey(b.Index, layer.Sums) == b.Index:
		return layer, transfer.Permanent(transfer.ReasonInvalidArgument,
			"the backup index %s has the name of the backup %q's own objects: name the index index.json", b.Index, b.Checkpoint)
	}
	return layer, nil
}

// incrementalParent is the backup the new one takes the changes since: the index's newest,
// unless a full is asked for or due (its chain holds MaxChain incrementals already), or it
// keeps no sums.
func incrementalParent(ix *backup.Index, b BackupOptions) (backup.Layer, bool) {
	if b.Full || len(ix.Layers) == 0 {
		return backup.Layer{}, false
	}
	newest := ix.Layers[len(ix.Layers)-1]
	chain, err := ix.Chain(newest.Checkpoint, backup.MaxChainLayers)
	if err != nil || newest.Sums == "" || len(chain) > b.MaxChain {
		return backup.Layer{}, false
	}
	return newest, true
}

// retain drops from ix the backups of all but its newest keepFulls fulls, and returns them.
func retain(ix *backup.Index, keepFulls int) []backup.Layer {
	if keepFulls <= 0 {
		return nil
	}
	root := map[string]string{}
	var fulls []string
	for _, l := range ix.Layers {
		if l.Parent == "" {
			root[l.Checkpoint] = l.Checkpoint
			fulls = append(fulls, l.Checkpoint)
		} else {
			root[l.Checkpoint] = root[l.Parent]
		}
	}
	if len(fulls) <= keepFulls {
		return nil
	}
	keep := map[string]bool{}
	for _, f := range fulls[len(fulls)-keepFulls:] {
		keep[f] = true
	}
	var kept, dropped []backup.Layer
	for _, l := range ix.Layers {
		if keep[root[l.Checkpoint]] {
			kept = append(kept, l)
		} else {
			dropped = append(dropped, l)
		}
	}
	ix.Layers = kept
	return dropped
}

// readIndex reads the index, or makes a new one where there is none.
func readIndex(ctx context.Context, b BackupOptions) (*backup.Index, error) {
	raw, err := readObject(ctx, b.Client, b.Bucket, b.Index, backup.MaxIndexBytes)
	if errors.Is(err, objectstore.ErrNoSuchObject) {
		return &backup.Index{Format: backup.Format, Disk: b.Disk}, nil
	}
	if err != nil {
		return nil, err
	}
	return backup.Parse(raw)
}

func writeIndex(ctx context.Context, b BackupOptions, ix *backup.Index) error {
	raw, err := json.MarshalIndent(ix, "", "  ")
	if err != nil {
		return err
	}
	if _, err = b.Client.PutObject(ctx, b.Bucket, b.Index, bytes.NewReader(raw), int64(len(raw)), minio.PutObjectOptions{ContentType: "application/json"}); err != nil {
		return transfer.AsTarget(objectstore.Classify(err, "writing "+objectstore.ObjectURL(b.Bucket, b.Index)))
	}
	return nil
}

// readObject reads an object of the backups, a byte more than limit, for its parser to
// refuse a larger one; objectstore.ErrNoSuchObject when there is none.
func readObject(ctx context.Context, c *objectstore.Client, bucket, key string, limit int64) ([]byte, error) {
	b, err := c.ReadObject(ctx, bucket, key, limit+1)
	if err != nil && !errors.Is(err, objectstore.ErrNoSuchObject) {
		return nil, transfer.AsTarget(objectstore.Classify(err, "reading "+objectstore.ObjectURL(bucket, key)))
	}
	return b, err
}

// maxSums is the size of the sums object of a disk of size bytes.
func maxSums(size int64) int64 { return 32 * ((size + PieceSize - 1) / PieceSize) }
