package pace_test

import (
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/diskpipe/diskpipe/internal/pace"
)

// slow reads a byte every gap.
type slow struct{ gap time.Duration }

func (s slow) Read(p []byte) (int, error) { time.Sleep(s.gap); p[0] = 'x'; return 1, nil }

// TestRate: a body slower than Min over a window of waiting is ended with a SlowError that
// says its rate; a fast one is read to its end, and its deadline cleared there.
func TestRate(t *testing.T) {
	r := &pace.Reader{R: slow{gap: 20 * time.Millisecond}, Min: 1000, Window: 200 * time.Millisecond}
	_, err := io.Copy(io.Discard, r)
	slowErr, ok := errors.AsType[*pace.SlowError](err)
	if !ok || slowErr.Stalled || slowErr.Rate > 60 || !strings.Contains(err.Error(), "bytes a second over 200ms, under the 1000 the server takes") || r.Err() != slowErr {
		t.Fatalf("a slow body: %v", err)
	}
	var deadlines []time.Time
	fast := &pace.Reader{R: strings.NewReader(strings.Repeat("x", 1<<20)), Min: 1 << 20, Window: time.Second,
		Deadline: func(at time.Time) error { deadlines = append(deadlines, at); return nil }}
	if n, err := io.Copy(io.Discard, fast); err != nil || n != 1<<20 {
		t.Fatalf("a fast body: %d, %v", n, err)
	}
	if last := deadlines[len(deadlines)-1]; !last.IsZero() {
		t.Errorf("the deadline after the body's end is %v, want none", last)
	}
}

// deadlined is a connection whose read ends at its deadline, as a net.Conn's does.
type deadlined struct{ at time.Time }

func (d *deadlined) Read([]byte) (int, error) {
	time.Sleep(time.Until(d.at))
	return 0, timeoutErr{}
}

type timeoutErr struct{}

func (timeoutErr) Error() string { return "i/o timeout" }
func (timeoutErr) Unwrap() error { return errDeadline }

var errDeadline = os.ErrDeadlineExceeded

// TestStall: a body that stops is ended at its window, saying where it stopped.
func TestStall(t *testing.T) {
	d := &deadlined{}
	r := &pace.Reader{R: d, Min: 1, Window: 100 * time.Millisecond, Deadline: func(at time.Time) error { d.at = at; return nil }}
	_, err := r.Read(make([]byte, 10))
	if slowErr, ok := errors.AsType[*pace.SlowError](err); !ok || !slowErr.Stalled ||
		err.Error() != "the body stopped after byte 0: nothing came for 100ms, as long as the server waits" {
		t.Fatalf("a stalled body: %v", err)
	}
}
