package transfer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestResultFits: whatever a failure says (a server's HTML page, control characters JSON
// escapes sixfold) and however long an export's URLs are, the result fits in a termination
// message and parses back with its reason, so a permanent failure stays one.
func TestResultFits(t *testing.T) {
	for name, msg := range map[string]string{
		"html":    strings.Repeat("<b>&amp;</b>", 1000),
		"control": strings.Repeat("\x01", 5000),
		"utf-8":   strings.Repeat("é", 3000),
		"short":   "404 Not Found",
	} {
		r := &Result{URL: "s3://b/" + strings.Repeat("k", 900), SealedDownloadURL: strings.Repeat("q", 2000)}
		r.Fail(Permanent(ReasonSourceNotFound, "%s", msg))
		path := filepath.Join(t.TempDir(), "termination-log")
		if err := r.Finish(time.Now(), path); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > MaxResult {
			t.Errorf("%s: %d bytes", name, len(b))
		}
		got, err := ReadResult(string(b))
		if err != nil || got.Reason != ReasonSourceNotFound || got.Transient || got.SealedDownloadURL != r.SealedDownloadURL {
			t.Errorf("%s: read back %+v, %v", name, got, err)
		}
		if name == "short" && got.Message != "404 Not Found" {
			t.Errorf("a short message changed: %q", got.Message)
		}
		if name != "short" && (!strings.HasSuffix(got.Message, "...") || len(got.Message) < 100) {
			t.Errorf("%s: message %q", name, got.Message)
		}
	}
}

// TestResultTooLargeEnds: a result too large even without a message is an error, not a loop.
func TestResultTooLargeEnds(t *testing.T) {
	r := &Result{Revision: strings.Repeat("e", 5000)}
	r.Fail(Permanent(ReasonSourceNotFound, "%s", strings.Repeat("x", 100)))
	if _, err := r.Encode(); err == nil || !strings.Contains(err.Error(), "without a message") {
		t.Fatalf("a result of 5000 bytes without its message: %v", err)
	}
}
