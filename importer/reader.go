package importer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// fetcher reads an Object with retries: a transient failure is retried with backoff and the
// read resumes at the first byte it did not get, by Range where the source allows it.
type fetcher struct {
	ctx   context.Context
	obj   Object
	name  string
	retry transfer.RetryPolicy
	log   *slog.Logger
	// stall is how long a response may send nothing before it counts as a transient failure.
	stall time.Duration
	// read counts the bytes received from the source, retries included; first and last are
	// when the first and the last of them came (Unix nanoseconds, 0 before any).
	read        atomic.Int64
	first, last atomic.Int64
}

// got counts n bytes received now.
func (f *fetcher) got(n int64) {
	if n <= 0 {
		return
	}
	f.read.Add(n)
	now := time.Now().UnixNano()
	f.first.CompareAndSwap(0, now)
	f.last.Store(now)
}

// since is when, of first or last, came, in seconds after start; 0 when nothing came.
func since(at *atomic.Int64, start time.Time) float64 {
	if ns := at.Load(); ns > 0 {
		return max(0, time.Unix(0, ns).Sub(start).Seconds())
	}
	return 0
}

// ReadAt reads len(p) bytes at off (fewer only at the end of the object).
func (f *fetcher) ReadAt(p []byte, off int64) (int, error) {
	if size := f.obj.Size(); size >= 0 {
		if off >= size {
			return 0, io.EOF
		}
		if rest := size - off; int64(len(p)) > rest {
			n, err := f.ReadAt(p[:rest], off)
			if err == nil {
				err = io.EOF
			}
			return n, err
		}
	}
	got := 0
	err := f.retry.Do(f.ctx, f.log, fmt.Sprintf("read %d bytes at %d", len(p), off), func() error {
		for got < len(p) {
			n, err := f.readOnce(p[got:], off+int64(got))
			got += n
			if err != nil {
				return err
			}
		}
		return nil
	})
	return got, err
}

// readOnce issues one ranged request for p and reads as much of it as arrives.
func (f *fetcher) readOnce(p []byte, off int64) (int, error) {
	ctx, cancel := context.WithCancelCause(f.ctx)
	defer cancel(nil)
	rc, err := f.obj.ReadRange(ctx, off, int64(len(p)))
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	n, err := io.ReadFull(f.watch(ctx, cancel, rc), p)
	f.got(int64(n))
	if err != nil {
		return n, f.readError(ctx, err)
	}
	return n, nil
}

// readError classifies an error met while reading a response body.
func (f *fetcher) readError(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); errors.Is(cause, errStalled) {
		return transfer.Transient(transfer.ReasonSourceUnavailable, "%s: %w", f.name, cause)
	}
	if f.ctx.Err() != nil {
		return f.ctx.Err()
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF // the body ended before the range did
	}
	return classifyNetError(err, f.name)
}

var errStalled = errors.New("no data received within the stall timeout")

// watch cancels ctx when r yields nothing for f.stall.
func (f *fetcher) watch(_ context.Context, cancel context.CancelCauseFunc, r io.Reader) io.Reader {
	if f.stall <= 0 {
		return r
	}
	t := time.AfterFunc(f.stall, func() { cancel(errStalled) })
	return &stallReader{r: r, t: t, d: f.stall}
}

type stallReader struct {
	r io.Reader
	t *time.Timer
	d time.Duration
}

func (s *stallReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if n > 0 {
		s.t.Reset(s.d)
	}
	if err != nil {
		s.t.Stop()
	}
	return n, err
}

// stream is the object as one sequential reader. A transient failure mid-way reopens it at
// the current offset (by Range, or from the start skipping what was read when the source
// ignores Range) and carries on, so the consumer never sees the break.
type stream struct {
	f      *fetcher
	pos    int64
	rc     io.ReadCloser
	r      io.Reader
	cancel context.CancelCauseFunc
	ctx    context.Context
}

func (f *fetcher) stream() *stream { return &stream{f: f} }

func (s *stream) Read(p []byte) (int, error) {
	var n int
	err := s.f.retry.Do(s.f.ctx, s.f.log, fmt.Sprintf("stream at %d", s.pos), func() error {
		if s.rc == nil {
			if err := s.open(); err != nil {
				return err
			}
		}
		var err error
		n, err = s.r.Read(p)
		s.pos += int64(n)
		s.f.got(int64(n))
		switch {
		case err == nil || n > 0 && errors.Is(err, io.EOF):
			return nil
		case errors.Is(err, io.EOF):
			if size := s.f.obj.Size(); size >= 0 && s.pos < size {
				s.close()
				return transfer.Transient(transfer.ReasonSourceUnavailable, "%s: stream ended at %d of %d bytes", s.f.name, s.pos, size)
			}
			return io.EOF
		default:
			err = s.f.readError(s.ctx, err)
			s.close()
			return err
		}
	})
	if n > 0 {
		return n, nil
	}
	return 0, err
}

func (s *stream) open() error {
	s.ctx, s.cancel = context.WithCancelCause(s.f.ctx)
	off, skip := s.pos, int64(0)
	if off > 0 && !s.f.obj.RandomAccess() {
		off, skip = 0, s.pos
		s.f.log.Info("Restarting the download from the start: the source does not support Range", "skip", skip)
	}
	rc, err := s.f.obj.ReadRange(s.ctx, off, -1)
	if err != nil {
		s.cancel(nil)
		return err
	}
	s.rc, s.r = rc, s.f.watch(s.ctx, s.cancel, rc)
	if skip > 0 {
		n, err := io.CopyN(io.Discard, s.r, skip)
		s.f.got(n)
		if err != nil {
			err = s.f.readError(s.ctx, err)
			s.close()
			return err
		}
	}
	return nil
}

func (s *stream) close() {
	if s.rc != nil {
		s.rc.Close()
		s.cancel(nil)
		s.rc, s.r = nil, nil
	}
}

// Close releases the current response.
func (s *stream) Close() error { s.close(); return nil }
