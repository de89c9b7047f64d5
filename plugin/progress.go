package plugin

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// bar shows the progress of a copy: on a terminal a live line redrawn in place (bytes, rate,
// ETA); to a pipe or a CI log a plain line at most every few seconds and at the end.
type bar struct {
	w        io.Writer
	what     string
	terminal bool
	start    time.Time
	lastLine time.Time
	drawn    bool
}

func newBar(w io.Writer, what string) *bar {
	return &bar{w: w, what: what, terminal: isTerminal(w), start: time.Now()}
}

// show draws done of total bytes.
func (b *bar) show(done, total int64, note string) {
	now := time.Now()
	every := 5 * time.Second // a line in a log
	if b.terminal {
		every = 100 * time.Millisecond // a redraw
	}
	if now.Sub(b.lastLine) < every && done < total {
		return
	}
	b.lastLine = now
	elapsed := now.Sub(b.start).Seconds()
	rate := float64(0)
	if elapsed > 0 {
		rate = float64(done) / elapsed
	}
	eta := "--"
	if rate > 0 && total > done {
		eta = (time.Duration(float64(total-done)/rate) * time.Second).String()
	}
	pct := 0.0
	if total > 0 {
		pct = 100 * float64(done) / float64(total)
	}
	text := fmt.Sprintf("%s %5.1f%% %s / %s  %s/s  ETA %s", b.what, pct, bytesOf(done), bytesOf(total), bytesOf(int64(rate)), eta)
	if note != "" {
		text += "  " + note
	}
	if b.terminal {
		const width = 30
		filled := int(pct / 100 * width)
		fmt.Fprintf(b.w, "\r[%s%s] %s\x1b[K", strings.Repeat("=", filled), strings.Repeat(" ", width-filled), text)
		b.drawn = true
		return
	}
	fmt.Fprintln(b.w, text)
}

// line prints a line of state (a phase that changed).
func (b *bar) line(s string) {
	if b.drawn {
		fmt.Fprintln(b.w)
		b.drawn = false
	}
	fmt.Fprintln(b.w, s)
}

// finish ends a live line.
func (b *bar) finish() {
	if b.drawn {
		fmt.Fprintln(b.w)
		b.drawn = false
	}
}
