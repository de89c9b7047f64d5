// Package uploadproxy receives images for VirtualMachineImages and ImageTemplates whose source
// is `upload`, and stores them in the bundled object store, where the image controller imports
// them like an objectStore source (the object stays as the image's source of record).
//
//	PUT  /v1/namespaces/{namespace}/{virtualmachineimages|imagetemplates}/{name}
//	HEAD /v1/namespaces/{namespace}/{virtualmachineimages|imagetemplates}/{name}
//
// Callers authenticate with their Kubernetes bearer token (a TokenReview) and need `create`
// on the image's `upload` subresource (a SubjectAccessReview); there are no anonymous uploads.
//
// Uploads are resumable. The body goes to the store as a multipart upload, one part per
// PartSize bytes; the parts stored are the acknowledged offset, which HEAD reports in the
// Upload-Offset header. A client whose connection dropped continues with a PUT of the rest and
// `Content-Range: bytes <offset>-<last>/<total>` (resending from an earlier offset is fine: the
// bytes already stored are skipped). When the last byte arrives the upload is completed, the
// image's checksum, if it has one, verified by reading the object back, and a marker object
// written that tells the image controller the upload is whole. A mismatch deletes the object:
// nothing is imported.
package uploadproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/minio/minio-go/v7"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore"
)

// Bucket is where uploads are kept.
const Bucket = "diskpipe-uploads"

// ObjectKey is the object an image's upload is stored as: a function of the image's UID, so
// that nobody can point an image at another's object.
func ObjectKey(namespace, resource, name, uid string) string {
	return fmt.Sprintf("%s/%s/%s-%s", namespace, resource, name, uid)
}

// MarkerKey is written once the upload at key is whole and verified.
func MarkerKey(key string) string { return key + ".complete" }

// Headers of the resumable protocol.
const (
	HeaderOffset   = "Upload-Offset"
	HeaderComplete = "Upload-Complete"
)

// Server is the upload proxy.
type Server struct {
	// Kube reviews tokens and access, and reads images.
	Kube client.Client
	// Store holds the uploads.
	Store *objectstore.Client
	// PartSize is the size of each stored part (default 16 MiB; S3 needs 5 MiB at least).
	PartSize int64
	Log      *slog.Logger
}

var path = regexp.MustCompile(`^/v1/namespaces/([a-z0-9-]{1,63})/(virtualmachineimages|imagetemplates)/([a-z0-9.-]{1,253})$`)

// httpError is a failure with its status code.
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func fail(code int, format string, args ...any) error {
	return &httpError{code: code, msg: fmt.Sprintf(format, args...)}
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.PartSize == 0 {
		s.PartSize = 16 << 20
	}
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
	err := s.serve(w, r)
	var he *httpError
	switch {
	case err == nil:
	case errors.As(err, &he):
		http.Error(w, he.msg, he.code)
	default:
		s.Log.Error("Upload failed", "path", r.URL.Path, "err", err)
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// upload is one image's upload.
type upload struct {
	key      string
	checksum string
	uploadID string
	parts    []minio.ObjectPart
	offset   int64
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) error {
	m := path.FindStringSubmatch(r.URL.Path)
	if m == nil {
		return fail(http.StatusNotFound, "PUT or HEAD /v1/namespaces/<namespace>/<virtualmachineimages|imagetemplates>/<name>")
	}
	ns, resource, name := m[1], m[2], m[3]
	if r.Method != http.MethodPut && r.Method != http.MethodHead {
		return fail(http.StatusMethodNotAllowed, "PUT or HEAD")
	}
	ctx := r.Context()
	if err := s.authorize(ctx, r, ns, resource, name); err != nil {
		return err
	}
	u, err := s.find(ctx, ns, resource, name)
	if err != nil {
		return err
	}
	if r.Method == http.MethodHead {
		w.Header().Set(HeaderOffset, strconv.FormatInt(u.offset, 10))
		w.Header().Set(HeaderComplete, strconv.FormatBool(u.uploadID == "" && u.offset > 0))
		return nil
	}
	return s.put(ctx, w, r, u)
}

// authorize checks the caller's token and its right to upload to the image.
func (s *Server) authorize(ctx context.Context, r *http.Request, ns, resource, name string) error {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		return fail(http.StatusUnauthorized, "an Authorization: Bearer <token> header with a Kubernetes token is required")
	}
	tr := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}
	if err := s.Kube.Create(ctx, tr); err != nil {
		return fmt.Errorf("reviewing the token: %w", err)
	}
	if !tr.Status.Authenticated {
		return fail(http.StatusUnauthorized, "the token is not valid: %s", tr.Status.Error)
	}
	user := tr.Status.User
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range user.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	group := hypercloud.GroupVersion.Group
	if resource == "imagetemplates" {
		group = virtualmachine.GroupVersion.Group
	}
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user.Username, Groups: user.Groups, UID: user.UID, Extra: extra,
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "create", Group: group,
			Resource: resource, Subresource: "upload", Name: name}}}
	if err := s.Kube.Create(ctx, sar); err != nil {
		return fmt.Errorf("reviewing access: %w", err)
	}
	if !sar.Status.Allowed {
		return fail(http.StatusForbidden, "%s may not upload to %s %s/%s: it needs create on %s/upload", user.Username, resource, ns, name, resource)
	}
	return nil
}

// find reads the image and the state of its upload.
func (s *Server) find(ctx context.Context, ns, resource, name string) (*upload, error) {
	var obj client.Object
	var src *common.UploadSource
	var sum common.Checksum
	if resource == "imagetemplates" {
		t := &virtualmachine.ImageTemplate{}
		obj = t
		if err := s.Kube.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, t); err != nil {
			return nil, notFound(err, resource, ns, name)
		}
		src, sum = t.Spec.Source.Upload, t.Spec.Source.Checksum
	} else {
		v := &hypercloud.VirtualMachineImage{}
		obj = v
		if err := s.Kube.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, v); err != nil {
			return nil, notFound(err, resource, ns, name)
		}
		src, sum = v.Spec.Source.Upload, v.Spec.Source.Checksum
	}
	if src == nil {
		return nil, fail(http.StatusConflict, "%s %s/%s does not take uploads: its source is not upload", resource, ns, name)
	}
	u := &upload{key: ObjectKey(ns, resource, name, string(obj.GetUID())), checksum: string(sum)}
	if _, err := s.Store.StatObject(ctx, Bucket, MarkerKey(u.key), minio.StatObjectOptions{}); err == nil {
		info, err := s.Store.StatObject(ctx, Bucket, u.key, minio.StatObjectOptions{})
		if err != nil {
			return nil, err
		}
		u.offset = info.Size
		return u, nil // complete
	}
	core := minio.Core{Client: s.Store.Client}
	list, err := core.ListMultipartUploads(ctx, Bucket, u.key, "", "", "", 100)
	if err != nil && minio.ToErrorResponse(err).Code != "NoSuchBucket" {
		return nil, err
	}
	for _, up := range list.Uploads {
		if up.Key != u.key {
			continue
		}
		u.uploadID = up.UploadID
		parts, err := core.ListObjectParts(ctx, Bucket, u.key, up.UploadID, 0, 10000)
		if err != nil {
			return nil, err
		}
		u.parts = parts.ObjectParts
		for _, p := range u.parts {
			u.offset += p.Size
		}
	}
	if u.uploadID == "" {
		u.uploadID = "new"
	}
	return u, nil
}

func notFound(err error, resource, ns, name string) error {
	if apierrors.IsNotFound(err) {
		return fail(http.StatusNotFound, "%s %s/%s does not exist", resource, ns, name)
	}
	return err
}

// put stores the body from its offset on, part by part, and completes the upload with its
// last byte.
func (s *Server) put(ctx context.Context, w http.ResponseWriter, r *http.Request, u *upload) error {
	if u.uploadID == "" {
		return fail(http.StatusConflict, "the upload is already complete (%d bytes)", u.offset)
	}
	start, total, err := contentRange(r)
	if err != nil {
		return err
	}
	if start > u.offset {
		w.Header().Set(HeaderOffset, strconv.FormatInt(u.offset, 10))
		return fail(http.StatusConflict, "the upload is at byte %d; continue from there", u.offset)
	}
	core := minio.Core{Client: s.Store.Client}
	if u.uploadID == "new" {
		if err := s.Store.EnsureBucket(ctx, Bucket); err != nil {
			return err
		}
		if u.uploadID, err = core.NewMultipartUpload(ctx, Bucket, u.key, minio.PutObjectOptions{}); err != nil {
			return err
		}
	}
	// Skip what is stored already.
	if _, err := io.CopyN(io.Discard, r.Body, u.offset-start); err != nil {
		return fail(http.StatusBadRequest, "the body ended before byte %d: %v", u.offset, err)
	}
	buf := make([]byte, s.PartSize)
	for u.offset < total {
		n, err := io.ReadFull(r.Body, buf[:min(s.PartSize, total-u.offset)])
		if err != nil {
			// A cut connection: the stored parts are the offset to resume from.
			s.Log.Info("Upload interrupted", "key", u.key, "offset", u.offset, "err", err)
			w.Header().Set(HeaderOffset, strconv.FormatInt(u.offset, 10))
			return fail(http.StatusBadRequest, "the body ended at byte %d of %d; resume from %d", u.offset+int64(n), total, u.offset)
		}
		part, err := core.PutObjectPart(ctx, Bucket, u.key, u.uploadID, len(u.parts)+1, bytes.NewReader(buf[:n]), int64(n), minio.PutObjectPartOptions{})
		if err != nil {
			return err
		}
		u.parts = append(u.parts, minio.ObjectPart{PartNumber: part.PartNumber, ETag: part.ETag, Size: part.Size})
		u.offset += int64(n)
	}
	return s.complete(ctx, w, u)
}

// complete joins the parts, verifies the checksum and marks the upload whole.
func (s *Server) complete(ctx context.Context, w http.ResponseWriter, u *upload) error {
	core := minio.Core{Client: s.Store.Client}
	parts := make([]minio.CompletePart, len(u.parts))
	for i, p := range u.parts {
		parts[i] = minio.CompletePart{PartNumber: p.PartNumber, ETag: p.ETag}
	}
	if _, err := core.CompleteMultipartUpload(ctx, Bucket, u.key, u.uploadID, parts, minio.PutObjectOptions{}); err != nil {
		return err
	}
	cs, err := transfer.ParseChecksum(u.checksum)
	if err != nil {
		return fail(http.StatusBadRequest, "%v", err)
	}
	obj, err := s.Store.GetObject(ctx, Bucket, u.key, minio.GetObjectOptions{})
	if err != nil {
		return err
	}
	_, err = io.Copy(cs.Hash, obj)
	obj.Close()
	if err != nil {
		return err
	}
	if err := cs.Verify(); err != nil {
		if rerr := s.Store.RemoveObject(ctx, Bucket, u.key, minio.RemoveObjectOptions{}); rerr != nil {
			s.Log.Error("Could not remove a mismatched upload", "key", u.key, "err", rerr)
		}
		return fail(http.StatusUnprocessableEntity, "%v; the upload was discarded: upload the right image", err)
	}
	digest := cs.Digest()
	if _, err := s.Store.PutObject(ctx, Bucket, MarkerKey(u.key), strings.NewReader(digest), int64(len(digest)), minio.PutObjectOptions{}); err != nil {
		return err
	}
	s.Log.Info("Upload complete", "key", u.key, "bytes", u.offset, "digest", digest)
	w.Header().Set(HeaderOffset, strconv.FormatInt(u.offset, 10))
	w.Header().Set(HeaderComplete, "true")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, "uploaded %d bytes, %s\n", u.offset, digest)
	return nil
}

// contentRange is where the body starts and the upload's total size: from Content-Range, or
// the whole upload in one body of Content-Length bytes.
func contentRange(r *http.Request) (start, total int64, err error) {
	cr := r.Header.Get("Content-Range")
	if cr == "" {
		if r.ContentLength < 0 {
			return 0, 0, fail(http.StatusLengthRequired, "Content-Length (or Content-Range) is required")
		}
		return 0, r.ContentLength, nil
	}
	var end int64
	if _, err := fmt.Sscanf(cr, "bytes %d-%d/%d", &start, &end, &total); err != nil || start < 0 || end < start || end >= total {
		return 0, 0, fail(http.StatusBadRequest, "Content-Range %q must be bytes <first>-<last>/<total>", cr)
	}
	if r.ContentLength >= 0 && r.ContentLength != end-start+1 {
		return 0, 0, fail(http.StatusBadRequest, "Content-Range %q does not match Content-Length %d", cr, r.ContentLength)
	}
	if end != total-1 {
		return 0, 0, fail(http.StatusBadRequest, "a body must run to the end of the upload (byte %d)", total-1)
	}
	return start, total, nil
}
