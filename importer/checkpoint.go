package importer

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// # Resuming an import in another pod
//
// A long import whose pod is killed, evicted or fails transiently goes on in the next pod
// where it stopped instead of at byte 0. Every 256 MiB of the disk, or every 10 s of work when
// that is more (checkpointAfter), the importer flushes what it wrote to stable storage and
// then records how far it got (both in the background, while the import goes on past that
// point) in a small checkpoint beside the disk: disk.img.checkpoint on a filesystem volume,
// the device's last 64 KiB (when the image leaves them free) on a block volume. The checkpoint names the source
// and its identity (ETag or Last-Modified and size, an S3 ETag, a file's size and mtime),
// the format and virtual size, how far the disk is done, and the checksum's running state.
//
// The next importer trusts it only when all of that matches the source it opens now and the
// record's own sha256 is intact; otherwise — a changed source, a torn or foreign record, a
// source with no identity — it starts over from an empty disk. A permanent failure empties
// the disk as before; a transient one keeps it for the next attempt. On success the
// checkpoint is removed (a block device's region zeroed) before the disk is flushed.
//
// Resumable: images read at random (qcow2, vmdk, vhdx, vpc, vdi) and raw images streamed
// from a source with random access. A gzip, xz or zstd wrapper or a registry layer can only
// be decoded from its start, so those imports start over.

// checkpointEvery is the least of the disk done between two checkpoints, and checkpointInterval
// the least time: the next checkpoint waits for whichever is more of the disk at the pace so
// far. A resumed import reads again at most that much (plus the cache's read-ahead), and a
// checkpoint — a flush, and a pause of the converter's workers at its boundary — costs a fast
// import little: one at 256 MiB, then about one every 10 s.
var (
	checkpointEvery    int64 = 256 << 20        // a variable for the tests
	checkpointInterval       = 10 * time.Second // a variable for the tests; 0: by size alone
)

// checkpointAfter is how much of the disk the next checkpoint waits for, given that this
// attempt did done bytes in elapsed; a multiple of 4 MiB.
func checkpointAfter(done int64, elapsed time.Duration) int64 {
	n := checkpointEvery
	if checkpointInterval > 0 && done > 0 && elapsed > 0 {
		n = max(n, int64(float64(done)/elapsed.Seconds()*checkpointInterval.Seconds()))
	}
	const align = 4 << 20
	return (n + align - 1) / align * align
}

// checkpointRegion is the size of a block device's checkpoint area, at its end.
const checkpointRegion = 64 << 10

// checkpoint is the record of how far an import got.
type checkpoint struct {
	Source      string `json:"source"`
	Identity    string `json:"identity"`
	Format      string `json:"format"`
	VirtualSize int64  `json:"virtualSize"`
	// Done: the disk's bytes [0, Done) are written and flushed. For a raw stream it is also
	// how much of the source was consumed.
	Done int64 `json:"done"`
	// Hashed and Hash: the checksum's state after the source's first Hashed bytes.
	Hashed int64  `json:"hashed,omitempty"`
	Hash   []byte `json:"hash,omitempty"`
	// Layers are the hash states of a backup chain's layers, in its order (chain.go).
	Layers []hashState `json:"layers,omitempty"`
}

// hashState is a checksum's state after the first Hashed bytes of its source.
type hashState struct {
	Hashed int64  `json:"hashed"`
	Hash   []byte `json:"hash"`
}

// sealed is the checkpoint as stored: the record and its sha256.
type sealed struct {
	Checkpoint json.RawMessage `json:"checkpoint"`
	SHA256     string          `json:"sha256"`
}

// matches reports whether c continues an import of this source (of srcSize bytes, -1 when
// unknown) into this disk. The record lies on a volume a VM may have written: every number in
// it is checked, not only its seal.
func (c *checkpoint) matches(source, identity string, format Format, vsize, srcSize int64) bool {
	return c != nil && identity != "" && c.Source == source && c.Identity == identity &&
		c.Format == string(format) && c.VirtualSize == vsize && c.Done > 0 && c.Done <= vsize &&
		c.Hashed >= 0 && (srcSize < 0 || c.Hashed <= srcSize)
}

// checkpointPath is where a disk file's checkpoint lives.
func (t *Target) checkpointPath() string { return t.path + ".checkpoint" }

// checkpointable reports whether the target has room for a checkpoint beside a disk of vsize.
func (t *Target) checkpointable(vsize int64) bool {
	return !t.block || vsize <= t.usable-checkpointRegion
}

// loadCheckpoint reads the checkpoint beside a disk of vsize; nil when there is none or it
// is damaged.
func (t *Target) loadCheckpoint(vsize int64) *checkpoint {
	var b []byte
	if t.block {
		if !t.checkpointable(vsize) {
			return nil
		}
		b = make([]byte, checkpointRegion)
		if _, err := t.f.ReadAt(b, t.usable-checkpointRegion); err != nil && !errors.Is(err, io.EOF) {
			return nil
		}
		b = bytes.TrimRight(b, "\x00")
	} else {
		var err error
		if b, err = os.ReadFile(t.checkpointPath()); err != nil {
			return nil
		}
	}
	var s sealed
	if len(b) == 0 || json.Unmarshal(b, &s) != nil {
		return nil
	}
	if sum := sha256.Sum256(s.Checkpoint); hex.EncodeToString(sum[:]) != s.SHA256 {
		return nil
	}
	c := &checkpoint{}
	if json.Unmarshal(s.Checkpoint, c) != nil {
		return nil
	}
	return c
}

// saveCheckpoint flushes the disk, then records c: the record never claims data that is not
// on stable storage. Both happen in the background while the import goes on writing past
// c.Done (an fsync in the import's path would leave the network and the converter idle at
// every checkpoint); it first waits for the previous checkpoint and returns its error.
func (t *Target) saveCheckpoint(c checkpoint) error {
	if err := t.settle(); err != nil {
		return err
	}
	done := make(chan error, 1)
	t.pending = done
	go func() { done <- t.writeCheckpoint(&c) }()
	return nil
}

// settle waits for the checkpoint being recorded, if any, and returns its error. Whatever
// ends the import (Finish, Keep, Wipe) settles first, so that no record is written after
// the disk was finished or emptied.
func (t *Target) settle() error {
	if t.pending == nil {
		return nil
	}
	err := <-t.pending
	t.pending = nil
	t.checkpointed = t.checkpointed || err == nil
	return err
}

func (t *Target) writeCheckpoint(c *checkpoint) error {
	if err := t.syncData(); err != nil {
		return err
	}
	rec, err := json.Marshal(c)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(rec)
	b, err := json.Marshal(sealed{Checkpoint: rec, SHA256: hex.EncodeToString(sum[:])})
	if err != nil {
		return err
	}
	if t.block {
		if len(b) > checkpointRegion {
			return nil // a checksum state this large does not exist; skip rather than fail
		}
		region := make([]byte, checkpointRegion)
		copy(region, b)
		if _, err := t.f.WriteAt(region, t.usable-checkpointRegion); err != nil {
			return transfer.Permanent(transfer.ReasonTargetError, "writing the checkpoint: %w", err)
		}
		return t.syncData()
	}
	tmp := t.checkpointPath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return transfer.Permanent(transfer.ReasonTargetError, "writing the checkpoint: %w", err)
	}
	if err := syncFile(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, t.checkpointPath()); err != nil {
		return transfer.Permanent(transfer.ReasonTargetError, "writing the checkpoint: %w", err)
	}
	return nil
}

// removeCheckpoint removes the record beside a disk of vsize (a block device's region is
// zeroed: it is part of the disk the VM sees; when the image reaches into it, it holds data
// and is left alone).
func (t *Target) removeCheckpoint(vsize int64) error {
	if t.block {
		if !t.checkpointable(vsize) {
			return nil
		}
		if _, err := t.f.WriteAt(make([]byte, checkpointRegion), t.usable-checkpointRegion); err != nil {
			return transfer.Permanent(transfer.ReasonTargetError, "clearing the checkpoint: %w", err)
		}
		return nil
	}
	if err := os.Remove(t.checkpointPath()); err != nil && !os.IsNotExist(err) {
		return transfer.Permanent(transfer.ReasonTargetError, "removing the checkpoint: %w", err)
	}
	return nil
}

func syncFile(path string) error {
	f, err := os.Open(path) //nolint:gosec // the importer's own file
	if err != nil {
		return transfer.Permanent(transfer.ReasonTargetError, "flushing the checkpoint: %w", err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return transfer.Permanent(transfer.ReasonTargetError, "flushing the checkpoint: %w", err)
	}
	return nil
}
