package plugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
)

// maxDrops is how many dropped connections a download survives in a row.
const maxDrops = 10

// errExpired is a download URL the store refuses (403): a presigned URL past its time, or
// signed with keys the store no longer has. The export controller makes a new one.
var errExpired = errors.New("the store refused the download URL (HTTP 403)")

// download fetches an export's object into file, waiting for the export first.
func (o *options) download(ctx context.Context, c *client, name string) error {
	r := exportRef(name)
	s, err := o.wait(ctx, c, r)
	if err != nil {
		return err
	}
	return o.fetchExport(ctx, c, r, s)
}

// fetchExport downloads the object of the Ready export s into o.output (through
// o.output+".part", which a later run resumes), renewing its URL when it expired, and
// checks the sha256 in its status; a mismatch deletes what was fetched.
func (o *options) fetchExport(ctx context.Context, c *client, r ref, s state) error {
	file, part := o.output, o.output+".part"
	want, ok := strings.CutPrefix(s.Digest, "sha256:")
	if !ok {
		return fmt.Errorf("%s has no sha256 digest in its status (%q) to verify a download against", r, s.Digest)
	}
	url, err := c.downloadURL(ctx, r, s)
	if err != nil {
		return err
	}
	h := sha256.New()
	renewed := false
	for {
		err := fetch(ctx, url, part, h, newBar(o.streams.ErrOut, "download "+r.name))
		if errors.Is(err, errExpired) && !renewed {
			fmt.Fprintf(o.streams.ErrOut, "%s: the store refused the download URL (expired?); asking for a new one\n", r)
			if url, err = renew(ctx, c, r, url); err != nil {
				return err
			}
			renewed = true
			continue
		}
		if err != nil {
			return fmt.Errorf("downloading %s: %w (run the command again to resume from %s)", r, err, part)
		}
		break
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		_ = os.Remove(part)
		return fmt.Errorf("the download of %s has sha256 %s, its status says %s: the partial file was deleted", r, got, want)
	}
	if err := os.Rename(part, file); err != nil {
		return err
	}
	fmt.Fprintf(o.streams.Out, "%s: sha256:%s verified\n", file, want)
	return nil
}

// fetch downloads url into part, resuming from part's length with Range, again after each
// dropped connection; h receives every byte of the file, from its start.
func fetch(ctx context.Context, url, part string, h hash.Hash, b *bar) error {
	defer b.finish()
	f, err := os.OpenFile(part, os.O_RDWR|os.O_CREATE, 0o644) //nolint:gosec // the user's file
	if err != nil {
		return err
	}
	defer f.Close()
	have, err := io.Copy(h, f) // what an earlier run left counts: hash it
	if err != nil {
		return err
	}
	drops := 0
	for {
		n, total, err := fetchFrom(ctx, url, f, have, h, b)
		have += n
		if err == nil {
			if total >= 0 && have != total {
				err = fmt.Errorf("the server sent %d of %d bytes", have, total)
			} else {
				return f.Close()
			}
		}
		var restart *errRestart
		if errors.As(err, &restart) { // the server ignored Range: start over
			if _, err := f.Seek(0, io.SeekStart); err != nil {
				return err
			}
			if err := f.Truncate(0); err != nil {
				return err
			}
			h.Reset()
			have = 0
			continue
		}
		if errors.Is(err, errExpired) || ctx.Err() != nil || errors.Is(err, errPermanent) {
			return err
		}
		if n == 0 {
			drops++
		} else {
			drops = 1
		}
		if drops > maxDrops {
			return fmt.Errorf("%d attempts in a row failed, the last: %w", maxDrops, err)
		}
		b.line(fmt.Sprintf("the connection dropped at %s (%v); resuming", bytesOf(have), err))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(drops) * time.Second):
		}
	}
}

// errRestart is a server answering a ranged request with the whole object.
type errRestart struct{}

func (*errRestart) Error() string { return "the server ignored the range: starting over" }

var errPermanent = errors.New("permanent")

// fetchFrom asks for url from byte have and appends what comes to f and h; it returns the
// bytes it appended and the object's total size (-1 when unknown).
func fetchFrom(ctx context.Context, url string, f *os.File, have int64, h hash.Hash, b *bar) (int64, int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, -1, fmt.Errorf("%w: %w", errPermanent, err)
	}
	if have > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", have))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, -1, err
	}
	defer resp.Body.Close()
	total := int64(-1)
	switch {
	case resp.StatusCode == http.StatusPartialContent:
		if _, rest, ok := strings.Cut(resp.Header.Get("Content-Range"), "/"); ok {
			total, _ = strconv.ParseInt(rest, 10, 64)
		}
	case resp.StatusCode == http.StatusOK:
		if have > 0 {
			return 0, -1, &errRestart{}
		}
		total = resp.ContentLength
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable && have > 0:
		return 0, have, nil // the file is whole already
	case resp.StatusCode == http.StatusForbidden:
		// A presigned URL past its time, or signed with keys the store no longer has.
		return 0, -1, errExpired
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
		return 0, -1, fmt.Errorf("HTTP %s", resp.Status)
	default:
		return 0, -1, fmt.Errorf("%w: HTTP %s", errPermanent, resp.Status)
	}
	if _, err := f.Seek(have, io.SeekStart); err != nil {
		return 0, total, err
	}
	buf := make([]byte, 1<<20)
	var n int64
	for {
		m, rerr := resp.Body.Read(buf)
		if m > 0 {
			if _, err := f.Write(buf[:m]); err != nil {
				return n, total, fmt.Errorf("%w: writing: %w", errPermanent, err)
			}
			h.Write(buf[:m])
			n += int64(m)
			b.show(have+n, total, "")
		}
		if rerr == io.EOF {
			return n, total, nil
		}
		if rerr != nil {
			return n, total, rerr
		}
	}
}

// renew asks the export controller for a fresh download URL (the annotation) and waits until
// the status has one other than old.
func renew(ctx context.Context, c *client, r ref, old string) (string, error) {
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}}}`, hypercloud.AnnotationRenewDownloadURL)
	if _, err := c.dyn.Resource(r.gvr).Namespace(c.namespace).Patch(ctx, r.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		return "", fmt.Errorf("asking for a new download URL of %s: %w", r, err)
	}
	for {
		obj, err := c.get(ctx, r)
		if err != nil {
			return "", err
		}
		if s := stateOf(r, obj); s.DownloadSecret != "" {
			u, err := c.downloadURL(ctx, r, s)
			if err != nil {
				return "", err
			}
			if u != old {
				return u, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("no new download URL for %s: %w", r, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}
