package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/diskpipe/diskpipe/internal/uploadproto"
)

// UploadProxy is where the gateway sends a browser's uploads: the upload proxy, which the
// gateway asks with the caller's own token, so that the proxy's check of the caller's right
// to upload is the only one.
type UploadProxy struct {
	// URL is the proxy's base URL (https://diskpipe-uploadproxy.diskpipe-system.svc).
	URL string
	// Client reaches it (trusting its CA).
	Client *http.Client
}

// pieceTimeout bounds the reading of one piece of an upload; the upload proxy ends a body
// slower than its least rate before that.
const pieceTimeout = 30 * time.Minute

// uploadState is an upload's progress as the gateway answers it.
type uploadState struct {
	Offset   int64 `json:"offset"`
	Complete bool  `json:"complete"`
	// Total is the upload's size, once a piece has said it: a client going on must send the
	// same file.
	Total int64 `json:"total,omitempty"`
	// PartSize is the proxy's part size: a piece that is not the last ends at a multiple of it.
	PartSize int64 `json:"partSize"`
	// Message is the proxy's own answer to the last piece.
	Message string `json:"message,omitempty"`
}

// startUpload makes the image an upload is for, as the caller: the body is the image, whose
// source is spec.source.upload.
func (s *Server) startUpload(ctx context.Context, c *call) (int, envelope, error) {
	o, k, err := s.decode(c)
	if err != nil {
		return 0, envelope{}, err
	}
	if _, found, _ := unstructured.NestedMap(o.Object, "spec", "source", "upload"); !found {
		return 0, envelope{}, fail(http.StatusBadRequest, "BadRequest", "an upload is to an image whose spec.source is upload: {}; this %s's is not", k.gvk.Kind)
	}
	return s.createAs(ctx, c, o, k)
}

// uploadState answers where the upload of c's image stands: the bytes the proxy holds.
func (s *Server) uploadState(ctx context.Context, c *call) (int, envelope, error) {
	k, err := s.uploadKind(ctx, c)
	if err != nil {
		return 0, envelope{}, err
	}
	req, err := s.proxyRequest(ctx, c, k, http.MethodHead, nil)
	if err != nil {
		return 0, envelope{}, err
	}
	return s.forward(c, k, req)
}

// uploadPiece sends the request's body, a piece of the upload (its Content-Range), to the
// proxy, with the client's digest (Upload-Digest) on the last piece.
func (s *Server) uploadPiece(ctx context.Context, c *call) (int, envelope, error) {
	k, err := s.uploadKind(ctx, c)
	if err != nil {
		return 0, envelope{}, err
	}
	// A piece may take longer than the server's read timeout, meant for the API's requests.
	rc := http.NewResponseController(c.w)
	_ = rc.SetReadDeadline(time.Now().Add(pieceTimeout))
	_ = rc.SetWriteDeadline(time.Now().Add(pieceTimeout + time.Minute))
	req, err := s.proxyRequest(ctx, c, k, http.MethodPut, c.r.Body)
	if err != nil {
		return 0, envelope{}, err
	}
	req.ContentLength = c.r.ContentLength
	for _, h := range []string{"Content-Range", uploadproto.HeaderDigest, "Content-Type"} {
		if v := c.r.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	status, e, err := s.forward(c, k, req)
	if st, ok := e.Data.(uploadState); (ok && st.Complete) || err != nil {
		c.audit = newID() // the upload's end, or its failure, is a change worth a line
	}
	return status, e, err
}

// uploadKind is the kind of c's image: ?kind=, or whichever kind holds the name.
func (s *Server) uploadKind(ctx context.Context, c *call) (kind, error) {
	if len(c.kinds) == 1 {
		return c.kinds[0], nil
	}
	_, k, err := s.find(ctx, c)
	return k, err
}

// proxyRequest is a request to the proxy for c's image, carrying the caller's own token.
func (s *Server) proxyRequest(ctx context.Context, c *call, k kind, method string, body io.Reader) (*http.Request, error) {
	if c.cl != s.Host {
		return nil, fail(http.StatusBadRequest, "BadRequest", "uploads go to the upload proxy of the cluster the gateway runs in (%s), not to %s: use a console of that cluster's gateway", HostCluster, c.cl.Name)
	}
	if s.Uploads == nil || s.Uploads.URL == "" {
		return nil, fail(http.StatusNotImplemented, "NotImplemented", "this gateway was started with no upload proxy (--upload-proxy-url): uploads are not served")
	}
	u := strings.TrimSuffix(s.Uploads.URL, "/") + "/v1/namespaces/" + url.PathEscape(c.namespace) + "/" + k.resource + "/" + url.PathEscape(c.r.PathValue("name"))
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.bearer)
	return req, nil
}

// forward sends req to the proxy and answers as it did: its progress headers and status, its
// message, and for a refusal the right the caller lacks.
func (s *Server) forward(c *call, k kind, req *http.Request) (int, envelope, error) {
	resp, err := s.Uploads.Client.Do(req)
	if err != nil {
		return 0, envelope{}, fail(http.StatusBadGateway, "ServiceUnavailable", "the upload proxy could not be reached: %v; the bytes it acknowledged are kept: resume", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	text := strings.TrimSpace(string(msg))
	for _, h := range []string{uploadproto.HeaderOffset, uploadproto.HeaderComplete, uploadproto.HeaderPartSize, uploadproto.HeaderLength, "Retry-After"} {
		if v := resp.Header.Get(h); v != "" {
			c.w.Header().Set(h, v)
		}
	}
	if resp.StatusCode >= 300 {
		f := fail(resp.StatusCode, reasonOf(resp.StatusCode), "%s", text)
		if resp.StatusCode == http.StatusForbidden {
			f.deny = fmt.Sprintf("%s may not create %s/upload in namespace %s", c.user.Username, k.qualified(), c.namespace)
		}
		if f.message == "" {
			f.message = fmt.Sprintf("the upload proxy answered %d", resp.StatusCode)
		}
		return 0, envelope{}, f
	}
	st := uploadState{Message: text}
	st.Offset, _ = strconv.ParseInt(resp.Header.Get(uploadproto.HeaderOffset), 10, 64)
	st.Complete = resp.Header.Get(uploadproto.HeaderComplete) == "true"
	st.PartSize, _ = strconv.ParseInt(resp.Header.Get(uploadproto.HeaderPartSize), 10, 64)
	st.Total, _ = strconv.ParseInt(resp.Header.Get(uploadproto.HeaderLength), 10, 64)
	status := resp.StatusCode
	if req.Method == http.MethodHead || status == http.StatusNoContent {
		status = http.StatusOK // an envelope follows
	}
	return status, envelope{Data: st, Message: text}, nil
}

// reasonOf names a status as the API's reasons do.
func reasonOf(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequest"
	case http.StatusUnauthorized:
		return "Unauthorized"
	case http.StatusForbidden:
		return "Forbidden"
	case http.StatusNotFound:
		return "NotFound"
	case http.StatusConflict:
		return "Conflict"
	case http.StatusRequestTimeout:
		return "Timeout"
	case http.StatusUnprocessableEntity:
		return "Invalid"
	case http.StatusTooManyRequests:
		return "TooManyRequests"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailable"
	}
	return "InternalError"
}

// decode reads c's body, an object of one of c's kinds, for c's namespace.
func (s *Server) decode(c *call) (*unstructured.Unstructured, kind, error) {
	body, err := io.ReadAll(io.LimitReader(c.r.Body, maxBody+1))
	if err != nil {
		return nil, kind{}, fail(http.StatusBadRequest, "BadRequest", "reading the body: %v", err)
	}
	if len(body) > maxBody {
		return nil, kind{}, fail(http.StatusRequestEntityTooLarge, "RequestEntityTooLarge", "the body is over %d bytes", maxBody)
	}
	o := &unstructured.Unstructured{}
	if err := json.Unmarshal(body, &o.Object); err != nil || o.Object == nil {
		return nil, kind{}, fail(http.StatusBadRequest, "BadRequest", "the body is not a JSON object: %v", err)
	}
	k, ok := kindNamed(c.kinds, o.GetKind())
	if !ok || o.GetAPIVersion() != k.gvk.GroupVersion().String() {
		return nil, kind{}, fail(http.StatusBadRequest, "BadRequest", "the %s are %s; the body is apiVersion %q, kind %q",
			c.resource, strings.Join(kindAPIs(c.kinds), " or "), o.GetAPIVersion(), o.GetKind())
	}
	if ns := o.GetNamespace(); ns != "" && ns != c.namespace {
		return nil, kind{}, fail(http.StatusBadRequest, "BadRequest", "the body's metadata.namespace is %q, the path's %q", ns, c.namespace)
	}
	o.SetNamespace(c.namespace)
	return o, k, nil
}
