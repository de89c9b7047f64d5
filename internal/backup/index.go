// Package backup is the layout diskpipe keeps a disk's backups in, in any S3-compatible store:
// one index object per disk, and one qcow2 object per backup — a full, then incrementals that
// hold only the clusters changed since the backup before (docs/backups.md). The importer
// restores any point the index lists (importer/chain.go); the controllers resolve an index of
// the bundled store to presign its layers.
package backup

import (
	"encoding/json"
	"fmt"
	"net/url"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// Format is the index's format name; an index of another is refused.
const Format = "diskpipe.io/backup-index/v1"

// IndexName is the index's object name beside its layers.
const IndexName = "index.json"

// Limits on what an index may say, so that a hostile one costs nothing to refuse: the index
// object's size, the layers it lists, and a name's length.
const (
	MaxIndexBytes = 4 << 20
	// MaxChainLayers is the longest chain restored at once.
	MaxChainLayers = 64
	MaxLayers      = 10000
	// maxName keeps "layer-<checkpoint>" a valid Secret key (LayerURLKey).
	maxName = 200
)

// Index lists a disk's backups.
type Index struct {
	// Format is Format.
	Format string `json:"format"`
	// Disk names the disk the backups are of ("namespace/name"), for people.
	Disk string `json:"disk,omitempty"`
	// Layers are the backups, oldest first.
	Layers []Layer `json:"layers"`
}

// Layer is one backup: a qcow2 object holding a full disk (no parent) or the clusters that
// changed since its parent.
type Layer struct {
	// Checkpoint names the point this backup restores to, unique in the index.
	Checkpoint string `json:"checkpoint"`
	// Parent is the checkpoint of the backup this one holds the changes since; empty for a full.
	Parent string `json:"parent,omitempty"`
	// Object is the qcow2's name, relative to the index's directory.
	Object string `json:"object"`
	// Size is the object's length in bytes.
	Size int64 `json:"size"`
	// VirtualSize is the disk's size at this point.
	VirtualSize int64 `json:"virtualSize"`
	// SHA256 is the object's digest, in hex.
	SHA256 string `json:"sha256"`
	// Created is when the backup was taken.
	Created time.Time `json:"created,omitzero"`
	// Sums is the object, beside the index, holding the sha256 of each 2 MiB piece of the disk
	// at this point, from which the next backup finds what changed (diskpipe's own backups).
	Sums string `json:"sums,omitempty"`
}

var (
	checkpointRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	hexRE        = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// Parse reads an index and checks every layer it lists on its own: what Chain then follows
// is known to be well-formed.
func Parse(b []byte) (*Index, error) {
	broken := func(format string, args ...any) error {
		return transfer.Permanent(transfer.ReasonBrokenChain, "the backup index "+format, args...)
	}
	if len(b) > MaxIndexBytes {
		return nil, broken("is %d bytes, more than the %d an index may be", len(b), MaxIndexBytes)
	}
	var ix Index
	if err := json.Unmarshal(b, &ix); err != nil {
		return nil, broken("is not valid JSON: %v", err)
	}
	if ix.Format != Format {
		return nil, broken("is of format %q, not %q", ix.Format, Format)
	}
	if len(ix.Layers) > MaxLayers {
		return nil, broken("lists %d backups, more than %d", len(ix.Layers), MaxLayers)
	}
	seen := map[string]bool{}
	for i, l := range ix.Layers {
		what := fmt.Sprintf("lists a backup (the %d.)", i+1)
		if checkpointRE.MatchString(l.Checkpoint) && len(l.Checkpoint) <= maxName {
			what = fmt.Sprintf("lists backup %q", l.Checkpoint)
		}
		switch {
		case !checkpointRE.MatchString(l.Checkpoint) || len(l.Checkpoint) > maxName:
			return nil, broken("%s with an invalid checkpoint name: letters, digits, '.', '_' and '-', at most %d", what, maxName)
		case seen[l.Checkpoint]:
			return nil, broken("lists checkpoint %q twice", l.Checkpoint)
		case l.Parent != "" && (!checkpointRE.MatchString(l.Parent) || len(l.Parent) > maxName):
			return nil, broken("%s with an invalid parent name", what)
		case !validObject(l.Object):
			return nil, broken("%s whose object %q is not a plain name under the index's directory (no '..', no leading '/', no scheme)", what, l.Object)
		case l.Size <= 0 || l.VirtualSize <= 0 || l.VirtualSize > 1<<56:
			return nil, broken("%s with size %d and disk size %d", what, l.Size, l.VirtualSize)
		case l.Sums != "" && !validObject(l.Sums):
			return nil, broken("%s whose sums object %q is not a plain name under the index's directory", what, l.Sums)
		case !hexRE.MatchString(l.SHA256):
			return nil, broken("%s without a sha256 of 64 lower-case hex digits", what)
		}
		seen[l.Checkpoint] = true
	}
	return &ix, nil
}

func validObject(o string) bool {
	// No '%': a URL would decode it ("%2e%2e") where a key keeps it.
	if o == "" || len(o) > 1024 || strings.HasPrefix(o, "/") || strings.Contains(o, "://") || strings.ContainsAny(o, "\\?#%*\x00") {
		return false
	}
	for _, seg := range strings.Split(o, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

// Chain is the layers that restore point (the newest backup when empty), full first, found by
// following each backup's parent back to a full. A point the index lacks, a parent it lacks,
// a loop, and a chain longer than maxLayers are refused with the checkpoint named.
func (ix *Index) Chain(point string, maxLayers int) ([]Layer, error) {
	if len(ix.Layers) == 0 {
		return nil, transfer.Permanent(transfer.ReasonBrokenChain, "the backup index lists no backups")
	}
	by := map[string]int{}
	for i, l := range ix.Layers {
		by[l.Checkpoint] = i
	}
	at := len(ix.Layers) - 1
	if point != "" {
		i, ok := by[point]
		if !ok {
			return nil, transfer.Permanent(transfer.ReasonBrokenChain, "the backup index has no checkpoint %q (its newest is %q)", point, ix.Layers[at].Checkpoint)
		}
		at = i
	}
	var chain []Layer
	for seen := map[int]bool{}; ; {
		l := ix.Layers[at]
		if seen[at] {
			return nil, transfer.Permanent(transfer.ReasonBrokenChain, "the backup index's chain of %q loops back to checkpoint %q", chain[0].Checkpoint, l.Checkpoint)
		}
		seen[at] = true
		chain = append(chain, l)
		if len(chain) > maxLayers {
			return nil, transfer.Permanent(transfer.ReasonInvalidArgument,
				"checkpoint %q needs a chain of more than %d backups, more than diskpipe restores at once: take a new full backup", chain[0].Checkpoint, maxLayers)
		}
		if l.Parent == "" {
			break
		}
		parent, ok := by[l.Parent]
		if !ok {
			return nil, transfer.Permanent(transfer.ReasonBrokenChain, "backup %q holds the changes since checkpoint %q, which the backup index does not list", l.Checkpoint, l.Parent)
		}
		if parent > at {
			return nil, transfer.Permanent(transfer.ReasonBrokenChain, "backup %q names checkpoint %q as its parent, which the backup index lists after it: the index is out of order", l.Checkpoint, l.Parent)
		}
		at = parent
	}
	for i, j := 0, len(chain)-1; i < j; i, j = i+1, j-1 {
		chain[i], chain[j] = chain[j], chain[i]
	}
	return chain, nil
}

// LayerURLKey is the file, in the importer's --layer-url-dir, that holds the presigned URL of
// the layer of that checkpoint.
func LayerURLKey(checkpoint string) string { return "layer-" + checkpoint }

// ObjectURL is a layer's URL, beside the index at indexURL.
func ObjectURL(indexURL, object string) (string, error) {
	u, err := url.Parse(indexURL)
	if err != nil {
		return "", transfer.Permanent(transfer.ReasonInvalidArgument, "the backup index's URL does not parse: %v", err)
	}
	ref, err := url.Parse(object)
	if err != nil || ref.IsAbs() || ref.Host != "" {
		return "", transfer.Permanent(transfer.ReasonBrokenChain, "the backup index names object %q, which is not a name under its directory", object)
	}
	return u.ResolveReference(ref).String(), nil
}

// ObjectKey is a layer's object key in the store, beside the index at indexKey.
func ObjectKey(indexKey, object string) string {
	if dir := path.Dir(indexKey); dir != "." && dir != "/" {
		return dir + "/" + object
	}
	return object
}
