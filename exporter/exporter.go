package exporter

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"io"
	"log/slog"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// Format of an export.
type Format string

// Formats an export can write.
const (
	FormatQcow2 Format = "qcow2"
	FormatRaw   Format = "raw"
)

// Sink receives the exported image as one stream.
type Sink interface {
	io.Writer
	// Complete makes what was written, whose sha256 is digest, visible; Abort discards it.
	Complete(ctx context.Context, digest string) error
	Abort(ctx context.Context) error
}

// Options describe one export.
type Options struct {
	// Source is disk.img on a filesystem volume, or a block device.
	Source string
	// DeclaredSize, when positive, is the size the disk must have.
	DeclaredSize int64
	Format       Format
	Compression  Compression
	// Sink receives the image; it is aborted on failure.
	Sink Sink
	// Since, for an incremental backup, is what its parent held (backup.go): only the pieces
	// whose digests differ are written, over Backing, the parent's object name.
	Since   *Pieces
	Backing string
	// Pieces, when not nil, receives the digest of every piece of the disk, for the next
	// backup's Since.
	Pieces *Pieces
	// Workers read and compress clusters in parallel (default 4).
	Workers  int
	Progress *transfer.Progress
	Log      *slog.Logger
}

// clustersPerJob is the unit of work of the parallel passes: 2 MiB of guest space.
const clustersPerJob = 32

// Export writes the disk to the sink. On failure the sink is aborted, so nothing
// half-written is left.
func Export(ctx context.Context, o Options) (*transfer.Result, error) {
	if o.Workers == 0 {
		o.Workers = 4
	}
	if o.Progress == nil {
		o.Progress = transfer.NewProgress(0)
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	res := &transfer.Result{Format: string(o.Format)}
	err := export(ctx, &o, res)
	if err != nil {
		if aerr := o.Sink.Abort(context.WithoutCancel(ctx)); aerr != nil {
			o.Log.Error("Could not abort the upload", "err", aerr)
		}
		return res, err
	}
	if err := o.Sink.Complete(ctx, res.Digest); err != nil {
		if aerr := o.Sink.Abort(context.WithoutCancel(ctx)); aerr != nil {
			o.Log.Error("Could not abort the upload", "err", aerr)
		}
		return res, err
	}
	res.Succeeded = true
	return res, nil
}

func export(ctx context.Context, o *Options, res *transfer.Result) error {
	if o.Compression == "" {
		o.Compression = CompressionNone
	}
	if o.Format == FormatRaw && o.Compression != CompressionNone {
		return transfer.Permanent(transfer.ReasonInvalidArgument, "compression %s needs format qcow2", o.Compression)
	}
	d, err := openDisk(o.Source, o.DeclaredSize)
	if err != nil {
		return err
	}
	defer d.Close()
	res.VirtualSize = d.size
	w := &hashingWriter{w: o.Sink, h: sha256.New()}
	defer func() {
		res.BytesWritten = w.n
		res.Digest = "sha256:" + hex.EncodeToString(w.h.Sum(nil))
	}()
	switch o.Format {
	case FormatRaw:
		o.Progress.SetTotal(d.size)
		return exportRaw(d, w, o.Progress)
	case FormatQcow2, "":
		res.Format = string(FormatQcow2)
		if o.Compression != CompressionNone {
			res.Compression = string(o.Compression)
		}
		o.Progress.SetTotal(2 * d.size) // the plan pass, then the emit pass
		return exportQcow2(ctx, o, d, w)
	default:
		return transfer.Permanent(transfer.ReasonInvalidArgument, "unknown format %q: qcow2 or raw", o.Format)
	}
}

// exportRaw streams the disk's bytes as they are, holes as zeros.
func exportRaw(d *disk, w io.Writer, p *transfer.Progress) error {
	buf := make([]byte, 4<<20)
	for off := int64(0); off < d.size; off += int64(len(buf)) {
		chunk := buf[:min(int64(len(buf)), d.size-off)]
		if d.hasData(off, int64(len(chunk))) {
			if err := d.readCluster(chunk, off); err != nil {
				return err
			}
		} else {
			clear(chunk)
		}
		if _, err := w.Write(chunk); err != nil {
			return err
		}
		p.Add(int64(len(chunk)))
	}
	return nil
}

// exportQcow2 plans the image in a first pass over the disk, then streams it in file order.
func exportQcow2(ctx context.Context, o *Options, d *disk, w io.Writer) error {
	if len(o.Backing) > maxBackingName {
		return transfer.Permanent(transfer.ReasonInvalidArgument, "the parent's name is %d bytes long; a qcow2 header holds at most %d", len(o.Backing), maxBackingName)
	}
	plan, zeros, err := planPass(ctx, o, d)
	if err != nil {
		return err
	}
	// qemu reads a qcow2 image's size in whole sectors, rounding down: round up instead, as
	// qemu-img convert does, so the disk's last bytes are kept (the rest reads as zeros).
	l := newLayout(divUp(d.size, 512)*512, o.Compression, plan, zeros)
	l.backing = o.Backing
	o.Log.Info("Planned the image", "dataClusters", len(plan), "fileSize", l.fileSize)
	if _, err := w.Write(l.header()); err != nil {
		return err
	}
	if err := l.metadata(func(b []byte) error { _, err := w.Write(b); return err }); err != nil {
		return err
	}
	return emitPass(ctx, o, d, l, w)
}

// planPass finds the non-zero clusters and, when compressing, their compressed sizes. For an
// incremental (o.Since), only the pieces whose digests changed are planned, their zero
// clusters as zeroed ones; the others are left to the parent.
func planPass(ctx context.Context, o *Options, d *disk) ([]planned, []uint32, error) {
	nClusters := int(divUp(d.size, clusterSize))
	jobs := int(divUp(int64(nClusters), clustersPerJob))
	compressors := make(chan *compressor, o.Workers)
	for range o.Workers {
		c, err := newCompressor(o.Compression)
		if err != nil {
			return nil, nil, transfer.Permanent(transfer.ReasonInvalidArgument, "%w", err)
		}
		defer c.release()
		compressors <- c
	}
	var plan []planned
	var zeros []uint32
	if o.Pieces != nil {
		*o.Pieces = Pieces{Size: d.size, Sums: make([][32]byte, 0, jobs)}
	}
	type piece struct {
		plan  []planned
		zeros []uint32
		sum   [32]byte
	}
	// A backup's pieces are hashed, and a piece's clusters held until its digest says whether
	// it changed; a plain export reads each cluster into one buffer and plans it at once.
	hashing := o.Pieces != nil || o.Since != nil
	err := ordered(ctx, jobs, o.Workers, func(j int) (piece, error) {
		c := <-compressors
		defer func() { compressors <- c }()
		var out piece
		from, to := j*clustersPerJob, min((j+1)*clustersPerJob, nClusters)
		start, end := int64(from)*clusterSize, min(int64(to)*clusterSize, d.size)
		plan := func(i int, buf []byte) error {
			if isZero(buf) {
				if o.Since != nil { // over a parent: zeros, not what the parent held
					out.zeros = append(out.zeros, uint32(i)) //nolint:gosec // bounded by the disk's size
				}
				return nil
			}
			p := planned{idx: uint32(i)} //nolint:gosec // bounded by the disk's size
			if o.Compression != CompressionNone {
				z, err := c.compress(buf)
				if err != nil {
					return transfer.Permanent(transfer.ReasonInternal, "compressing: %w", err)
				}
				if len(z) < clusterSize {
					p.csize = uint32(len(z)) //nolint:gosec // less than a cluster
				}
			}
			out.plan = append(out.plan, p)
			return nil
		}
		hole := !d.hasData(start, end-start)
		var held [][]byte
		h := sha256.New()
		buf := make([]byte, clusterSize)
		for i := from; i < to && !hole; i++ {
			off := int64(i) * clusterSize
			if hashing {
				buf = make([]byte, clusterSize)
			}
			if d.hasData(off, clusterSize) {
				if err := d.readCluster(buf, off); err != nil {
					return out, err
				}
			} else if !hashing {
				continue
			}
			if !hashing {
				if err := plan(i, buf); err != nil {
					return out, err
				}
				continue
			}
			h.Write(buf[:min(clusterSize, d.size-off)]) // a piece's digest is of the disk's bytes
			held = append(held, buf)
		}
		if !hashing {
			return out, nil
		}
		if hole {
			out.sum = zeroPiece(end - start)
		} else {
			h.Sum(out.sum[:0])
		}
		if !o.Since.changed(j, start, end, out.sum) {
			return out, nil
		}
		for k, b := range held {
			if err := plan(from+k, b); err != nil {
				return out, err
			}
		}
		if hole && o.Since != nil { // a hole where the parent held data
			for i := from; i < to; i++ {
				out.zeros = append(out.zeros, uint32(i)) //nolint:gosec // bounded by the disk's size
			}
		}
		return out, nil
	}, func(out piece) error {
		plan, zeros = append(plan, out.plan...), append(zeros, out.zeros...)
		if o.Pieces != nil {
			o.Pieces.Sums = append(o.Pieces.Sums, out.sum)
		}
		o.Progress.Add(min(clustersPerJob*clusterSize, d.size-o.Progress.Done()))
		return nil
	})
	return plan, zeros, err
}

// emitPass writes the data region: each job builds the exact bytes of its clusters, padding
// included, and the jobs' bytes are written in order.
func emitPass(ctx context.Context, o *Options, d *disk, l *layout, w io.Writer) error {
	jobs := int(divUp(int64(len(l.plan)), clustersPerJob))
	starts := make([]int64, jobs+1) // each job's first byte in the data region
	var p placer
	for i, c := range l.plan {
		if i%clustersPerJob == 0 {
			starts[i/clustersPerJob] = p.pos
		}
		p.place(c)
	}
	starts[jobs] = l.dataLen
	compressors := make(chan *compressor, o.Workers)
	for range o.Workers {
		c, err := newCompressor(o.Compression)
		if err != nil {
			return err
		}
		defer c.release()
		compressors <- c
	}
	type chunk struct {
		data     []byte
		guestEnd int64 // the guest offset the job reached
	}
	guestDone := int64(0)
	err := ordered(ctx, jobs, o.Workers, func(j int) (chunk, error) {
		c := <-compressors
		defer func() { compressors <- c }()
		out := make([]byte, starts[j+1]-starts[j])
		buf := make([]byte, clusterSize)
		pl := placer{pos: starts[j]}
		clusters := l.plan[j*clustersPerJob : min((j+1)*clustersPerJob, len(l.plan))]
		for _, pc := range clusters {
			at := pl.place(pc) - starts[j]
			if err := d.readCluster(buf, int64(pc.idx)*clusterSize); err != nil {
				return chunk{}, err
			}
			data := buf
			if pc.csize != 0 {
				z, err := c.compress(buf)
				if err != nil {
					return chunk{}, transfer.Permanent(transfer.ReasonInternal, "compressing: %w", err)
				}
				data = z
			}
			if want := planSize(pc); len(data) != want || (pc.csize == 0 && isZero(buf)) {
				return chunk{}, transfer.Permanent(transfer.ReasonSourceUnavailable,
					"the source disk changed during the export (cluster %d): export a snapshot or a disk no VM is using", pc.idx)
			}
			copy(out[at:], data)
		}
		return chunk{data: out, guestEnd: min(int64(clusters[len(clusters)-1].idx+1)*clusterSize, d.size)}, nil
	}, func(c chunk) error {
		_, err := w.Write(c.data)
		o.Progress.Add(c.guestEnd - guestDone)
		guestDone = c.guestEnd
		return err
	})
	if err != nil {
		return err
	}
	o.Progress.Add(d.size - guestDone) // the zeros after the last data
	return nil
}

func planSize(p planned) int {
	if p.csize == 0 {
		return clusterSize
	}
	return int(p.csize)
}

var zeroCluster [clusterSize]byte

func isZero(b []byte) bool { return string(b) == string(zeroCluster[:len(b)]) }

// hashingWriter hashes and counts what it writes.
type hashingWriter struct {
	w io.Writer
	h hash.Hash
	n int64
}

func (h *hashingWriter) Write(p []byte) (int, error) {
	n, err := h.w.Write(p)
	h.h.Write(p[:n])
	h.n += int64(n)
	if err != nil {
		return n, err
	}
	return n, nil
}
