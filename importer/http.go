package importer

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// HTTPSource reads an image from an HTTP(S) URL. Servers that answer Range requests are read
// at random, several ranges at once; others are streamed from the start.
type HTTPSource struct {
	// URL of the image.
	URL string
	// CAFile is a PEM bundle that replaces the system roots.
	CAFile string
	// ServerName, when set, is the name the server's certificate is verified for, rather than
	// the URL's host (a clone source, reached at its pod's address).
	ServerName string
	// Insecure skips verification of the server's certificate.
	Insecure bool
	// Username and Password are sent as basic authentication when Username is set.
	Username, Password string
	// Header is sent with every request.
	Header http.Header
	// SecretHeaders are the names of the headers in Header that came from a Secret: like
	// basic auth, they are sent only to the URL's host, never to a host a redirect names.
	SecretHeaders []string
	// ExtentsURL, for a clone source (Serve), is where it lists its disk's data extents
	// (ExtentsPath), sent the same headers: a raw copy reads those only.
	ExtentsURL string
	// Egress is where the source may connect (nil: anywhere).
	Egress *transfer.Egress
	// Transport overrides the transport (tests); nil builds one from the fields above, with
	// the proxy taken from the environment.
	Transport http.RoundTripper
}

func (s *HTTPSource) String() string {
	u, err := url.Parse(s.URL)
	if err != nil {
		return "http source"
	}
	u.User = nil
	u.RawQuery = "" // presigned URLs carry credentials in the query
	return u.String()
}

func (s *HTTPSource) client() (*http.Client, error) {
	redirects := transfer.RedirectPolicy(s.SecretHeaders)
	if s.Transport != nil {
		return &http.Client{Transport: s.Transport, CheckRedirect: redirects}, nil
	}
	tr, err := transfer.HTTPTransport(s.CAFile, s.Insecure)
	if s.ServerName != "" { // a clone source
		tr, err = transfer.PinnedTransport(s.CAFile, s.ServerName)
	}
	if err != nil {
		return nil, err
	}
	tr.ResponseHeaderTimeout = time.Minute
	return &http.Client{Transport: s.Egress.Apply(tr), CheckRedirect: redirects}, nil
}

// Open probes the URL with a one-byte Range request: 206 means random access and tells the
// size; 200 means the server ignores Range.
func (s *HTTPSource) Open(ctx context.Context) (Object, error) {
	if u, err := url.Parse(s.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "%q is not an http:// or https:// URL", s.String())
	}
	c, err := s.client()
	if err != nil {
		return nil, err
	}
	o := &httpObject{src: s, client: c, size: -1}
	resp, err := o.get(ctx, 0, 1)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if etag, lm := resp.Header.Get("ETag"), resp.Header.Get("Last-Modified"); (etag != "" && !strings.HasPrefix(etag, "W/")) || lm != "" {
		o.id = fmt.Sprintf("etag %s last-modified %s", etag, lm) // the size is added below
		o.revision, o.validator = etag, etag
		if o.revision == "" || strings.HasPrefix(etag, "W/") {
			o.revision, o.validator = "last-modified "+lm, lm
		}
	}
	switch resp.StatusCode {
	case http.StatusPartialContent:
		size, err := totalFromContentRange(resp.Header.Get("Content-Range"))
		if err != nil {
			return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "%s: %w", s, err)
		}
		o.size, o.random = size, true
	case http.StatusOK:
		o.size = resp.ContentLength
	case http.StatusRequestedRangeNotSatisfiable: // an empty object
		o.size, o.random = 0, true
	}
	if o.id != "" {
		o.id += fmt.Sprintf(" size %d", o.size)
	}
	return o, nil
}

type httpObject struct {
	src    *HTTPSource
	client *http.Client
	size   int64
	random bool
	id     string
	// revision is the strong ETag, else the Last-Modified date; validator is the same as
	// If-Range takes it.
	revision, validator string
}

func (o *httpObject) Identity() string { return o.id }
func (o *httpObject) Revision() string { return o.revision }

func (o *httpObject) Size() int64        { return o.size }
func (o *httpObject) RandomAccess() bool { return o.random }
func (o *httpObject) Close() error       { o.client.CloseIdleConnections(); return nil }

// get sends a GET for [off, off+n); it returns the response only for 200 or 206.
func (o *httpObject) get(ctx context.Context, off, n int64) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.src.URL, nil)
	if err != nil {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "building request: %w", err)
	}
	for k, vs := range o.src.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if o.src.Username != "" {
		req.SetBasicAuth(o.src.Username, o.src.Password)
	}
	switch {
	case n > 0:
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+n-1))
	case off > 0:
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", off))
	}
	if req.Header.Get("Range") != "" && o.validator != "" {
		// Only the object Open saw: one changed since is answered whole (200), which
		// ReadRange refuses, so that no disk is put together from two versions.
		req.Header.Set("If-Range", o.validator)
	}
	resp, err := o.client.Do(req)
	if err != nil {
		return nil, classifyNetError(err, o.src.String())
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPartialContent &&
		(resp.StatusCode != http.StatusRequestedRangeNotSatisfiable || off != 0) {
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil, classifyHTTPStatus(resp, o.src.String())
	}
	return resp, nil
}

func (o *httpObject) ReadRange(ctx context.Context, off, n int64) (io.ReadCloser, error) {
	if off > 0 && !o.random {
		return nil, transfer.Permanent(transfer.ReasonNeedsRandomAccess, "%s does not support Range requests", o.src)
	}
	resp, err := o.get(ctx, off, n)
	if err != nil {
		return nil, err
	}
	if (off > 0 || n > 0) && resp.StatusCode != http.StatusPartialContent {
		resp.Body.Close()
		if o.validator != "" {
			return nil, transfer.Transient(transfer.ReasonSourceUnavailable, "%s answered a Range request with %s: it changed since the copy began (If-Range %s); the next attempt starts over", o.src, resp.Status, o.validator)
		}
		return nil, transfer.Transient(transfer.ReasonSourceUnavailable, "%s answered a Range request with %s", o.src, resp.Status)
	}
	if (off > 0 || n > 0) && !rangeIs(resp.Header.Get("Content-Range"), off, n, o.size) {
		resp.Body.Close()
		return nil, transfer.Transient(transfer.ReasonSourceUnavailable, "%s answered bytes %q for a Range request of %d bytes at %d of %d", o.src, resp.Header.Get("Content-Range"), n, off, o.size)
	}
	return resp.Body, nil
}

// rangeIs says whether a Content-Range header is the answer to a request of n bytes at off (n 0:
// to the end) of an object of size bytes: a server that sends other bytes than those asked for
// would have them written in the wrong place.
func rangeIs(header string, off, n, size int64) bool {
	var first, last, total int64
	if _, err := fmt.Sscanf(header, "bytes %d-%d/%d", &first, &last, &total); err != nil {
		return false
	}
	end := size - 1
	if n > 0 {
		end = min(off+n, size) - 1
	}
	return first == off && last == end && total == size
}

// totalFromContentRange parses "bytes 0-0/12345".
func totalFromContentRange(v string) (int64, error) {
	i := strings.LastIndexByte(v, '/')
	if i < 0 || v[i+1:] == "*" {
		return 0, fmt.Errorf("the server sent no total size in Content-Range %q", v)
	}
	return strconv.ParseInt(v[i+1:], 10, 64)
}
