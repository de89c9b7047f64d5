// Package pace holds a request body to a minimum rate, and an answer to a reader that takes
// it, so that a client cannot keep a server's slot (a connection, a writer, a clone source) by
// sending a byte now and then, or by reading nothing.
//
// Only the time spent waiting for the client counts: while the server writes what came (to
// the store, to a disk), the client is not asked for more, and is not blamed for it. Each
// read waits at most Window (a longer stall ends the body); each Window of waiting must bring
// Min bytes a second, on average.
package pace

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// Reader reads R at no less than Min bytes a second, measured over each Window of waiting.
type Reader struct {
	R io.Reader
	// Min is the least rate, in bytes a second; 0 bounds only a stall (a read of Window).
	Min int64
	// Window is how long waiting is measured over, and the longest one read may wait.
	Window time.Duration
	// Deadline, when set, ends a read of the connection at t (http.ResponseController's
	// SetReadDeadline): a client that sends nothing is not waited for past the window.
	Deadline func(t time.Time) error

	waited time.Duration
	got    int64
	total  int64
	slow   *SlowError
}

// Err is the SlowError a read returned, if any: what reads it may see it wrapped, or not at all.
func (p *Reader) Err() *SlowError { return p.slow }

// SlowError is a body that stopped, or came slower than the rate.
type SlowError struct {
	// Stalled: nothing came for Window.
	Stalled   bool
	Rate, Min int64
	Window    time.Duration
	// Read is what came before.
	Read int64
}

func (e *SlowError) Error() string {
	if e.Stalled {
		return fmt.Sprintf("the body stopped after byte %d: nothing came for %s, as long as the server waits", e.Read, e.Window)
	}
	return fmt.Sprintf("the body came at %d bytes a second over %s, under the %d the server takes (after byte %d)",
		e.Rate, e.Window, e.Min, e.Read)
}

func (p *Reader) Read(b []byte) (int, error) {
	if p.Deadline != nil {
		_ = p.Deadline(time.Now().Add(p.Window))
	}
	start := time.Now()
	n, err := p.R.Read(b)
	if errors.Is(err, io.EOF) {
		p.Done() // the server may read on (for the client's close): not under this deadline
	}
	p.waited += time.Since(start)
	p.got += int64(n)
	p.total += int64(n)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		p.slow = &SlowError{Stalled: true, Min: p.Min, Window: p.Window, Read: p.total}
		return n, p.slow
	}
	if p.waited >= p.Window {
		if rate := int64(float64(p.got) / p.waited.Seconds()); rate < p.Min {
			p.slow = &SlowError{Rate: rate, Min: p.Min, Window: p.Window, Read: p.total}
			return n, p.slow
		}
		p.waited, p.got = 0, 0
	}
	return n, err
}

// Done clears the deadline of the connection, once the body has come: what the server does
// next (write what came, answer) is not bound by the client's pace, and a deadline left would
// end the server's own wait for the client's close, cancelling the request.
func (p *Reader) Done() {
	if p.Deadline != nil {
		_ = p.Deadline(time.Time{})
	}
}

// Close closes R when it is a Closer.
func (p *Reader) Close() error {
	if c, ok := p.R.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// Writer ends an answer whose client does not read it: each write must be taken within
// Window (a write deadline, set before each).
type Writer struct {
	http.ResponseWriter
	rc     *http.ResponseController
	window time.Duration
}

// NewWriter is w with each write bounded by window.
func NewWriter(w http.ResponseWriter, window time.Duration) *Writer {
	return &Writer{ResponseWriter: w, rc: http.NewResponseController(w), window: window}
}

func (p *Writer) Write(b []byte) (int, error) {
	_ = p.rc.SetWriteDeadline(time.Now().Add(p.window))
	return p.ResponseWriter.Write(b)
}

// Unwrap is the ResponseWriter written to (for http.ResponseController).
func (p *Writer) Unwrap() http.ResponseWriter { return p.ResponseWriter }
