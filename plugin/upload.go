package plugin

import (
	"context"
	"crypto/sha256"
	"encoding"
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

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"

	upload "github.com/diskpipe/diskpipe/apis/upload/v1alpha1"
	"github.com/diskpipe/diskpipe/internal/uploadproto"
	"github.com/diskpipe/diskpipe/internal/uploadtoken"
)

// uploadOptions are upload's flags.
type uploadOptions struct {
	file, kind, checksum, url string
	create, resume, noWait    bool
	size, storageClass        string
}

// tokenRequests is the UploadTokenRequest resource.
var tokenRequests = upload.GroupVersion.WithResource("uploadtokenrequests")

// upload sends a file to an image's upload source through the upload proxy, going on by
// itself after a dropped connection, and waits until the image is imported.
func (o *options) upload(ctx context.Context, c *client, name string) error {
	u := o.up
	if u.file == "" {
		return usageError("upload needs the image file: --file FILE")
	}
	r, err := c.resolve(u.kind + "/" + name)
	if err != nil {
		return err
	}
	if uploadproto.Resources[r.kind] != r.gvr.Resource {
		return usageError("--kind %s: uploads go to a virtualmachineimage (vmimage) or an imagetemplate (imt)", u.kind)
	}
	f, err := os.Open(u.file)
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if info.Size() == 0 {
		return usageError("%s is empty", u.file)
	}
	if u.create {
		if err := o.createImage(ctx, c, r); err != nil {
			return err
		}
	}
	up := &uploader{c: c, r: r, file: f, size: info.Size(), url: u.url, out: o.streams.ErrOut}
	if err := up.run(ctx, u.resume); err != nil {
		return err
	}
	if u.noWait {
		fmt.Fprintf(o.streams.Out, "%s: uploaded; the import goes on in the cluster (kubectl diskpipe wait %s)\n", r, r)
		return nil
	}
	_, err = o.wait(ctx, c, r)
	return err
}

// createImage makes the image with an upload source; one that exists with an upload source
// is taken as it is (a second run, --resume).
func (o *options) createImage(ctx context.Context, c *client, r ref) error {
	spec := map[string]any{"source": map[string]any{"upload": map[string]any{}}}
	if o.up.checksum != "" {
		spec["source"].(map[string]any)["checksum"] = o.up.checksum
	}
	if o.up.size != "" {
		q, err := resource.ParseQuantity(o.up.size)
		if err != nil {
			return usageError("--size %s: %v", o.up.size, err)
		}
		spec["resources"] = map[string]any{"requests": map[string]any{"storage": q.String()}}
	}
	if o.up.storageClass != "" {
		spec["storageClassName"] = o.up.storageClass
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": r.gvr.GroupVersion().String(), "kind": r.kind,
		"metadata": map[string]any{"name": r.name}, "spec": spec}}
	_, err := c.dyn.Resource(r.gvr).Namespace(c.namespace).Create(ctx, obj, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		old, err := c.get(ctx, r)
		if err != nil {
			return err
		}
		if _, ok, _ := unstructured.NestedMap(old.Object, "spec", "source", "upload"); !ok {
			return fmt.Errorf("%s exists and its source is not upload", r)
		}
		fmt.Fprintf(o.streams.ErrOut, "%s exists already, with an upload source: uploading to it\n", r)
		return nil
	}
	if err != nil {
		return fmt.Errorf("making %s: %w", r, err)
	}
	fmt.Fprintf(o.streams.ErrOut, "%s made, with an upload source\n", r)
	return nil
}

// uploader is one upload in progress.
type uploader struct {
	c    *client
	r    ref
	file *os.File
	size int64
	url  string // --url
	out  io.Writer
	// hash is the file's sha256 up to what the proxy has stored, to compare with its digest.
	hash *rewindHash
}

// endpoint is where requests for the image go, and the client that reaches it.
type endpoint struct {
	url    string
	client *http.Client
	token  string
	// service is set when requests go through the apiserver's service proxy.
	service *upload.ProxyService
}

// token asks the apiserver for an upload token (an UploadTokenRequest, answered by diskpipe's
// aggregated API; sent as a dry run, which older installations, answering from a webhook,
// required) and learns where the proxy is.
func (u *uploader) token(ctx context.Context) (endpoint, error) {
	req := &upload.UploadTokenRequest{TypeMeta: metav1.TypeMeta{APIVersion: upload.GroupVersion.String(), Kind: "UploadTokenRequest"},
		ObjectMeta: metav1.ObjectMeta{GenerateName: u.r.name + "-"}, Spec: upload.UploadTokenRequestSpec{Kind: u.r.kind, Name: u.r.name}}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(req)
	if err != nil {
		return endpoint{}, err
	}
	got, err := u.c.dyn.Resource(tokenRequests).Namespace(u.c.namespace).Create(ctx, &unstructured.Unstructured{Object: obj},
		metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		if apierrors.IsNotFound(err) && strings.Contains(err.Error(), "the server could not find the requested resource") {
			return endpoint{}, errors.New("this cluster has no UploadTokenRequest API: install or upgrade diskpipe's chart")
		}
		return endpoint{}, fmt.Errorf("asking for an upload token for %s: %w", u.r, err)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, req); err != nil {
		return endpoint{}, err
	}
	st := req.Status
	if st.Token == "" {
		return endpoint{}, errors.New("the apiserver issued no upload token: diskpipe's upload token API is off (webhook.enabled=false); upload with curl and a Kubernetes token (docs/uploads.md)")
	}
	e := endpoint{token: st.Token, client: &http.Client{}}
	switch {
	case u.url != "":
		e.url = strings.TrimSuffix(u.url, "/") + st.Path
	case st.URL != "":
		e.url = strings.TrimSuffix(st.URL, "/") + st.Path
	case st.Service != nil:
		// Through the apiserver, with kubectl's own credentials and connection.
		cfg := rest.CopyConfig(u.c.config)
		if e.client, err = rest.HTTPClientFor(cfg); err != nil {
			return endpoint{}, err
		}
		s := st.Service
		e.service = s
		e.url = fmt.Sprintf("%s/api/v1/namespaces/%s/services/%s:%s:%s/proxy%s", strings.TrimSuffix(cfg.Host, "/"), s.Namespace, s.Scheme, s.Name, s.Port, st.Path)
	default:
		return endpoint{}, errors.New("the upload token names no way to the upload proxy: give its address with --url")
	}
	return e, nil
}

// errStatus is an answer of the proxy that is not success.
type errStatus struct {
	code int
	msg  string
}

func (e *errStatus) Error() string {
	return fmt.Sprintf("the upload proxy answered %d: %s", e.code, e.msg)
}

// transient says whether trying again may help.
func (e *errStatus) transient() bool {
	return e.code >= 500 || e.code == http.StatusConflict || e.code == http.StatusRequestTimeout ||
		e.code == http.StatusTooManyRequests || e.code == http.StatusBadRequest && strings.Contains(e.msg, "resume from")
}

// head asks the proxy how much is stored and whether the upload is complete.
func (u *uploader) head(ctx context.Context, e endpoint) (int64, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, e.url, nil)
	if err != nil {
		return 0, false, err
	}
	req.Header.Set(uploadtoken.Header, e.token)
	resp, err := e.client.Do(req)
	if err != nil {
		return 0, false, err
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusForbidden && e.service != nil {
		return 0, false, fmt.Errorf("the apiserver would not take the upload to the proxy's Service %s/%s: that needs get and update on "+
			"services/proxy there, which the chart grants to every authenticated user (or give the proxy's address with --url)", e.service.Namespace, e.service.Name)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, false, &errStatus{resp.StatusCode, http.StatusText(resp.StatusCode) + " to HEAD " + e.url}
	}
	off, err := strconv.ParseInt(resp.Header.Get(uploadproto.HeaderOffset), 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("the upload proxy sent no %s header (is %s the proxy?)", uploadproto.HeaderOffset, e.url)
	}
	return off, resp.Header.Get(uploadproto.HeaderComplete) == "true", nil
}

// put sends the file from off to its end.
func (u *uploader) put(ctx context.Context, e endpoint, off int64, b *bar) (string, error) {
	body := &progressReader{r: io.NewSectionReader(u.file, off, u.size-off), done: off, total: u.size, bar: b, hash: u.hash}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, e.url, body)
	if err != nil {
		return "", err
	}
	req.ContentLength = u.size - off
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", off, u.size-1, u.size))
	req.Header.Set(uploadtoken.Header, e.token)
	resp, err := e.client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return "", &errStatus{resp.StatusCode, strings.TrimSpace(string(msg))}
	}
	return strings.TrimSpace(string(msg)), nil
}

// run uploads the file, resuming after every drop, and checks the proxy's digest.
func (u *uploader) run(ctx context.Context, resume bool) error {
	b := newBar(u.out, "upload "+u.r.name)
	defer b.finish()
	u.hash = newRewindHash()
	drops := 0
	for attempt := 0; ; attempt++ {
		e, err := u.token(ctx)
		if err != nil {
			return err
		}
		off, complete, err := u.head(ctx, e)
		if err == nil && complete {
			b.line(fmt.Sprintf("%s: the upload is complete in the cluster", u.r))
			return nil
		}
		if err == nil && off > 0 && attempt == 0 && !resume {
			return usageError("%s bytes of an upload to %s are stored already: run again with --resume to continue it, or delete and make the image again to start over", bytesOf(off), u.r)
		}
		if err == nil && off > u.size {
			return fmt.Errorf("the upload to %s holds %d bytes, more than %s's %d: it is another file", u.r, off, u.file.Name(), u.size)
		}
		var reply string
		if err == nil {
			if off > u.hash.at+checkpoint {
				b.line(fmt.Sprintf("hashing the %s stored already, to verify the upload", bytesOf(off)))
			}
			if err = u.hash.rewind(u.file, off); err == nil {
				if off > 0 {
					b.line(fmt.Sprintf("resuming at %s of %s", bytesOf(off), bytesOf(u.size)))
				}
				reply, err = u.put(ctx, e, off, b)
			}
		}
		if err == nil {
			return u.verify(reply, b)
		}
		var st *errStatus
		if ctx.Err() != nil {
			stored, _, _ := u.head(context.WithoutCancel(ctx), e)
			return fmt.Errorf("stopped with %s of %s stored in the cluster; run the same command with --resume to continue", bytesOf(stored), bytesOf(u.size))
		}
		if errors.As(err, &st) && !st.transient() {
			return err
		}
		drops++
		if drops > maxDrops {
			return fmt.Errorf("%d attempts failed, the last: %w (run again with --resume to continue)", maxDrops, err)
		}
		b.line(fmt.Sprintf("the upload was interrupted (%v); resuming", err))
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(min(drops, 5)) * time.Second):
		}
	}
}

// verify compares the proxy's digest of what it stored with the file's.
func (u *uploader) verify(reply string, b *bar) error {
	b.finish()
	want := "sha256:" + hex.EncodeToString(u.hash.h.Sum(nil))
	if i := strings.Index(reply, "sha256:"); i >= 0 {
		if got := reply[i:]; got != want {
			return fmt.Errorf("the upload proxy stored bytes with %s, the file has %s", got, want)
		}
	}
	fmt.Fprintf(u.out, "%s: %s uploaded, %s\n", u.r, bytesOf(u.size), want)
	return nil
}

// progressReader shows what was read of the body and hashes it.
type progressReader struct {
	r           io.Reader
	done, total int64
	bar         *bar
	hash        *rewindHash
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.hash.write(b[:n])
		p.done += int64(n)
		p.bar.show(p.done, p.total, "")
	}
	return n, err
}

// rewindHash is a sha256 of a file's prefix that can go back to an earlier offset: it keeps
// its state at every checkpoint bytes, and re-reads at most that much of the file.
type rewindHash struct {
	h     hash.Hash
	at    int64
	marks map[int64][]byte
}

const checkpoint = 4 << 20

func newRewindHash() *rewindHash {
	return &rewindHash{h: sha256.New(), marks: map[int64][]byte{0: mustState(sha256.New())}}
}

func mustState(h hash.Hash) []byte {
	s, _ := h.(encoding.BinaryMarshaler).MarshalBinary()
	return s
}

func (r *rewindHash) write(b []byte) {
	for len(b) > 0 {
		n := min(int64(len(b)), checkpoint-r.at%checkpoint)
		r.h.Write(b[:n])
		r.at += n
		b = b[n:]
		if r.at%checkpoint == 0 {
			r.marks[r.at] = mustState(r.h)
		}
	}
}

// rewind makes the hash cover f's first off bytes.
func (r *rewindHash) rewind(f *os.File, off int64) error {
	if off == r.at {
		return nil
	}
	mark := min(off, r.at) / checkpoint * checkpoint
	if _, ok := r.marks[mark]; !ok {
		mark = 0
	}
	if err := r.h.(encoding.BinaryUnmarshaler).UnmarshalBinary(r.marks[mark]); err != nil {
		return err
	}
	r.at = mark
	buf := make([]byte, 1<<20)
	for r.at < off {
		n, err := f.ReadAt(buf[:min(int64(len(buf)), off-r.at)], r.at)
		r.write(buf[:n])
		if err != nil && r.at < off {
			return fmt.Errorf("reading %s: %w", f.Name(), err)
		}
	}
	return nil
}
