package exporter

import (
	"context"
	"os"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// FileSink writes the image to a local file (for tests and for exporting to a mounted
// volume); Abort removes it.
type FileSink struct {
	f *os.File
}

// NewFileSink creates path.
func NewFileSink(path string) (*FileSink, error) {
	f, err := os.Create(path) //nolint:gosec // the user's output path
	if err != nil {
		return nil, transfer.Permanent(transfer.ReasonTargetError, "creating %s: %w", path, err)
	}
	return &FileSink{f: f}, nil
}

func (s *FileSink) Write(p []byte) (int, error) {
	n, err := s.f.Write(p)
	if err != nil {
		return n, transfer.Permanent(transfer.ReasonTargetError, "writing %s: %w", s.f.Name(), err)
	}
	return n, nil
}

// Complete flushes the file to stable storage.
func (s *FileSink) Complete(context.Context, string) error {
	if err := s.f.Sync(); err != nil {
		return transfer.Permanent(transfer.ReasonTargetError, "flushing %s: %w", s.f.Name(), err)
	}
	return s.f.Close()
}

// Abort removes the file.
func (s *FileSink) Abort(context.Context) error {
	s.f.Close()
	return os.Remove(s.f.Name())
}
