package transfer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"
	"unicode/utf8"
)

// Exit codes of the importer and exporter commands.
const (
	ExitSucceeded = 0
	// ExitFailed: a permanent failure; the controller does not retry.
	ExitFailed = 1
	// ExitTransient: a transient failure outlasted the command's own retries; the controller
	// may run it again. (Not 2, which is what a Go program exits with when it panics.)
	ExitTransient = 3
	// ExitUsage: the command line was wrong.
	ExitUsage = 64
)

// Result is what a pod leaves in its termination message, as JSON.
type Result struct {
	// Succeeded is true when the copy completed and was verified.
	Succeeded bool `json:"succeeded"`
	// Format of the source (qcow2, raw, ...), or of the written object for an export.
	Format string `json:"format,omitempty"`
	// Compression wrapping the source stream (gzip, xz, zstd), if any.
	Compression string `json:"compression,omitempty"`
	// VirtualSize of the disk in bytes.
	VirtualSize int64 `json:"virtualSize,omitempty"`
	// BytesRead from the source.
	BytesRead int64 `json:"bytesRead,omitempty"`
	// BytesWritten to the target (non-zero data only; holes are not written).
	BytesWritten int64 `json:"bytesWritten,omitempty"`
	// Revision of the source read (a manifest digest, an ETag, a Last-Modified date), for an
	// import or a probe; "" when the source tells none.
	Revision string `json:"revision,omitempty"`
	// Digest of the source bytes (import) or the written object (export), "<algorithm>:<hex>".
	Digest string `json:"digest,omitempty"`
	// URL of the written object, for an export.
	URL string `json:"url,omitempty"`
	// SealedDownloadURL is a presigned GET of the exported object, signed in the pod with the
	// user's keys of an external store (the manager never reads them) and sealed to the
	// manager's key (internal/seal): whoever may read pods reads this message, and the URL is
	// a bearer credential. DownloadURLExpiresAt is when it stops working.
	SealedDownloadURL    string     `json:"sealedDownloadURL,omitempty"`
	DownloadURLExpiresAt *time.Time `json:"downloadURLExpiresAt,omitempty"`
	// DurationSeconds the copy took.
	DurationSeconds float64 `json:"durationSeconds"`
	// The copy's timeline, in seconds after it began: the first and the last byte from the
	// source, and the end of the final flush (the disk on the volume); 0 where none.
	FirstByteSeconds float64 `json:"firstByteSeconds,omitempty"`
	LastByteSeconds  float64 `json:"lastByteSeconds,omitempty"`
	FlushedSeconds   float64 `json:"flushedSeconds,omitempty"`
	// Reason of a failure.
	Reason Reason `json:"reason,omitempty"`
	// Transient is true when trying again may help.
	Transient bool `json:"transient,omitempty"`
	// Message says what failed, for a human.
	Message string `json:"message,omitempty"`
}

// maxMessage keeps the result within the kubelet's 4096-byte termination message, with
// Encode's check as the last word.
const maxMessage = 2048

// MaxResult is the kubelet's limit on a termination message: a longer one is cut, and a cut
// result is no result.
const MaxResult = 4096

// Fail fills the failure fields of r from err.
func (r *Result) Fail(err error) {
	r.Succeeded = false
	r.Reason = ReasonOf(err)
	r.Transient = IsTransient(err)
	r.Message = err.Error()
	if len(r.Message) > maxMessage {
		r.Message = r.Message[:maxMessage] + "..."
	}
}

// ExitCode is the command's exit code for r.
func (r *Result) ExitCode() int {
	switch {
	case r.Succeeded:
		return ExitSucceeded
	case r.Transient:
		return ExitTransient
	default:
		return ExitFailed
	}
}

// Finish records the duration since start and writes r to path (the termination message
// path) when path is not empty.
func (r *Result) Finish(start time.Time, path string) error {
	r.DurationSeconds = time.Since(start).Seconds()
	if path == "" {
		return nil
	}
	b, err := r.Encode()
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil { //nolint:gosec // read by the kubelet
		return fmt.Errorf("writing termination message: %w", err)
	}
	return nil
}

// Encode is r as JSON that fits in MaxResult bytes: its message is shortened until it does
// (a message that JSON escapes, control characters say, grows up to sixfold when encoded).
func (r *Result) Encode() ([]byte, error) {
	out := *r
	for {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(&out); err != nil {
			return nil, fmt.Errorf("encoding result: %w", err)
		}
		b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
		if len(b) <= MaxResult {
			return b, nil
		}
		if out.Message == "" {
			return nil, fmt.Errorf("encoding result: %d bytes without a message, over the %d a termination message holds", len(b), MaxResult)
		}
		// What is over, in encoded bytes, may be a few escaped characters of the message:
		// halve it rather than lose it all; a message that no longer shrinks goes.
		keep := len(out.Message) - (len(b) - MaxResult) - len("...")
		if keep < len(out.Message)/2 {
			keep = len(out.Message) / 2
		}
		for keep > 0 && !utf8.RuneStart(out.Message[keep]) {
			keep--
		}
		shorter := strings.TrimSuffix(out.Message[:keep], "...") + "..."
		if keep == 0 || len(shorter) >= len(out.Message) {
			shorter = ""
		}
		out.Message = shorter
	}
}

// ReadResult parses a termination message.
func ReadResult(msg string) (*Result, error) {
	var r Result
	if err := json.Unmarshal([]byte(msg), &r); err != nil {
		return nil, fmt.Errorf("parsing result %q: %w", msg, err)
	}
	return &r, nil
}
