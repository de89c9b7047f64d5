package importer

import (
	"context"
	"io"
)

// Object is an opened source: its size, whether it can be read at random, and ranged reads.
type Object interface {
	// Size is the source's length in bytes, or -1 when the source does not say.
	Size() int64
	// RandomAccess reports whether ReadRange may start anywhere; without it only off == 0 is
	// allowed and the source can only be streamed.
	RandomAccess() bool
	// ReadRange returns the bytes [off, off+n), or from off to the end when n < 0.
	ReadRange(ctx context.Context, off, n int64) (io.ReadCloser, error)
	// Close releases the object.
	Close() error
	// Identity names this version of the source (an ETag, Last-Modified and size, a file's
	// size and mtime) for a checkpoint; "" when the source tells nothing that would show a
	// change, and its imports cannot resume.
	Identity() string
	// Revision names the version of the source a scheduled image compares between checks:
	// a registry image's manifest digest, an ETag, else a Last-Modified date; "" when the
	// source tells none.
	Revision() string
}

// Source opens an Object. Each kind of source (http.go, s3.go, file.go) is one Source.
type Source interface {
	// Open reaches the source and learns its size and whether it supports random access.
	Open(ctx context.Context) (Object, error)
	// String describes the source for logs, without credentials.
	String() string
}
