// Package uploadproxy receives images for VirtualMachineImages and ImageTemplates whose source
// is `upload`, and stores them in the bundled object store, where the image controller imports
// them like an objectStore source (the object stays as the image's source of record).
//
//	PUT  /v1/namespaces/{namespace}/{virtualmachineimages|imagetemplates}/{name}
//	HEAD /v1/namespaces/{namespace}/{virtualmachineimages|imagetemplates}/{name}
//	GET  /healthz
//	...                     further doors (Server.Doors): CDI's upload paths, for virtctl
//	                        image-upload and browsers (uploadproxy/cdiupload)
//
// Callers prove their right to upload to the image (auth.go) with an upload token, which the
// manager's webhook issues for an UploadTokenRequest to users of any credential, or with a
// Kubernetes bearer token; either way the right checked is `create` on the image's `upload`
// subresource. There are no anonymous uploads.
//
// Uploads are resumable. The body goes to the store as a multipart upload, one part per
// PartSize bytes. After each part the proxy saves the upload's state beside it (the object
// <key>.state: the parts, the offset, and the checksum's hash state, which Go's hashes
// marshal), so the acknowledged offset, which HEAD reports in the Upload-Offset header,
// survives a dropped connection and a restart of the proxy. A client continues with a PUT of
// the rest and `Content-Range: bytes <offset>-<last>/<total>` (resending from an earlier
// offset is fine: the bytes already stored are skipped). A request may also send only a
// piece, stopping at a multiple of the part size (Upload-Part-Size, which every answer
// says): a browser sends its file so, piece by piece. Every byte is hashed once, as it
// arrives: when the last byte is stored the upload is completed and the image's checksum, if
// it has one, and the client's own digest of the file (Upload-Digest), if it sent one, are
// verified from the saved hash, never by reading the object back; then a marker object tells
// the image controller the upload is whole. A mismatch deletes the object: nothing is
// imported.
package uploadproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/internal/authn"
	"github.com/diskpipe/diskpipe/internal/pace"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/internal/uploadproto"
	"github.com/diskpipe/diskpipe/internal/uploadtoken"
	"github.com/diskpipe/diskpipe/objectstore"
	"github.com/diskpipe/diskpipe/objectstore/uploads"
)

// Headers of the resumable protocol (uploadproto, which clients import).
const (
	HeaderOffset   = uploadproto.HeaderOffset
	HeaderComplete = uploadproto.HeaderComplete
	HeaderPartSize = uploadproto.HeaderPartSize
	HeaderDigest   = uploadproto.HeaderDigest
	HeaderLength   = uploadproto.HeaderLength
)

// Server is the upload proxy.
type Server struct {
	// spare holds a token for each spare part in use (SpareParts).
	spare chan struct{}

	// Kube reviews tokens and access, and reads images.
	Kube client.Client
	// Tokens, when set, reviews the bearer tokens the apiserver does not know: KubeSphere's
	// (authn.KubeSphere), whose users upload from the console framed in KubeSphere's.
	Tokens authn.Authority
	// Store holds the uploads.
	Store *objectstore.Client
	// TokenKey verifies upload tokens; nil accepts only Kubernetes tokens.
	TokenKey *uploadtoken.Key
	// PartSize is the size of each stored part (default 16 MiB; S3 needs 5 MiB at least).
	PartSize int64
	// MaxWriters bounds the uploads written at once (default 8), MaxWritersPerNamespace those
	// of one namespace (default 4): each holds a part in memory, so the bound keeps the proxy
	// under its memory limit, and one namespace cannot take every slot. A request over either
	// is answered 503 with Retry-After.
	MaxWriters, MaxWritersPerNamespace int
	// SpareParts are the parts' buffers, across the proxy, that let a writer read its next
	// part while the last goes to the store (default 4): a writer that finds none spare reads
	// and stores one part at a time, so the proxy holds at most MaxWriters + SpareParts parts.
	SpareParts int
	// MinBytesPerSecond is the least rate of an upload's body, over each BodyWindow of
	// waiting for it (defaults 64 KiB/s, 30 s; see internal/pace): a request slower holds a
	// writer's slot and a part's memory from others, so it is ended (408), and may resume.
	MinBytesPerSecond int64
	BodyWindow        time.Duration
	// MaxBytesPerNamespace bounds what a namespace's uploads keep in the store (0: only its
	// ResourceQuotas' requests.storage bound them; see limit.go).
	MaxBytesPerNamespace int64
	// Doors are further ways in, by path, served beside the PUT: CDI's upload paths
	// (uploadproxy/cdiupload). They store through Upload, as the PUT does.
	Doors map[string]Door
	Log   *slog.Logger

	// mu guards writers: the request writing each upload, one at a time.
	mu      sync.Mutex
	writers map[string]*writer
	// writing counts the requests writing, by namespace; reserved the bytes each upload being
	// written will keep, by key.
	writing  map[string]int
	reserved map[string]int64
	// defaults fills PartSize and Log once, before the first request (requests run at once).
	defaults sync.Once
	// reviews answers who bears a Kubernetes token (reviews.go), made at its first use.
	reviews     *reviews
	reviewsOnce sync.Once
}

// A Door serves one path of the proxy beside the PUT; its error is answered as the PUT's are
// (Fail gives it a status).
type Door func(w http.ResponseWriter, r *http.Request) error

// PathHealthz answers "ok" while the proxy serves.
const PathHealthz = "/healthz"

// writer is the request writing an upload; stop makes it give up, done is closed when it has.
type writer struct {
	stop func()
	done chan struct{}
}

// waitStopped stops w, again and again until it has (it may be between reads), for a minute
// at most.
func waitStopped(ctx context.Context, w *writer) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(time.Minute)
	for {
		w.stop()
		select {
		case <-w.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return Fail(http.StatusConflict, "an earlier request writing this upload did not stop; try again")
		case <-tick.C:
		}
	}
}

// claim makes the request the upload's writer. A request already writing it is stopped: a
// client sends again only when it believes its earlier request failed, and that request's
// connection may linger half-open long after the client gave up on it.
func (s *Server) claim(ctx context.Context, key string, stop func()) (release func(), err error) {
	me := &writer{stop: stop, done: make(chan struct{})}
	for {
		s.mu.Lock()
		if s.writers == nil {
			s.writers = map[string]*writer{}
		}
		old := s.writers[key]
		if old == nil {
			s.writers[key] = me
			s.mu.Unlock()
			return func() {
				s.mu.Lock()
				delete(s.writers, key)
				s.mu.Unlock()
				close(me.done)
			}, nil
		}
		s.mu.Unlock()
		s.Log.Info("Stopping an earlier request writing the same upload", "key", key)
		if err := waitStopped(ctx, old); err != nil {
			return nil, err
		}
	}
}

var path = regexp.MustCompile(`^/v1/namespaces/([a-z0-9-]{1,63})/(virtualmachineimages|imagetemplates)/([a-z0-9.-]{1,253})$`)

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.defaults.Do(func() {
		if s.PartSize == 0 {
			s.PartSize = 16 << 20
		}
		if s.MaxWriters == 0 {
			s.MaxWriters = 8
		}
		if s.MaxWritersPerNamespace == 0 {
			s.MaxWritersPerNamespace = 4
		}
		if s.SpareParts == 0 {
			s.SpareParts = 4
		}
		s.spare = make(chan struct{}, s.SpareParts)
		if s.MinBytesPerSecond == 0 {
			s.MinBytesPerSecond = DefaultMinBytesPerSecond
		}
		if s.BodyWindow == 0 {
			s.BodyWindow = 30 * time.Second
		}
		if s.Log == nil {
			s.Log = slog.New(slog.DiscardHandler)
		}
	})
	if err := s.serve(w, r); err != nil {
		code := StatusOf(err)
		if code == http.StatusInternalServerError {
			s.Log.Error("Upload failed", "path", r.URL.Path, "err", err)
		}
		if code == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", strconv.Itoa(RetryAfter))
		}
		http.Error(w, err.Error(), code)
	}
}

// state is an unfinished upload's, saved after each part at StateKey.
type state struct {
	UploadID string `json:"uploadID"`
	Parts    []part `json:"parts"`
	// Offset is the bytes stored: the sum of the parts.
	Offset int64 `json:"offset"`
	// Total is the upload's size, once a PUT has said it.
	Total int64 `json:"total"`
	// Checksum is the image's checksum spec the hash is for, Hash the hash's state after
	// Offset bytes.
	Checksum string `json:"checksum"`
	Hash     []byte `json:"hash"`
	// PartSize is the size of the upload's parts, the proxy's when it began: a piece ends at
	// a multiple of it, so it stays the same though the proxy's changes (0: an older state's,
	// the proxy's).
	PartSize int64 `json:"partSize,omitempty"`
	// Claimed is the client's digest of the whole upload (Upload-Digest), kept from the
	// request that sent it so that the completion checks it, whichever request completes.
	Claimed string `json:"claimed,omitempty"`
}

type part struct {
	Number int    `json:"n"`
	ETag   string `json:"etag"`
	Size   int64  `json:"size"`
}

// upload is one image's upload as a request finds it.
type upload struct {
	key      string
	complete bool
	state
	sum *transfer.Checksum
	// alive says whether the image is still there, not being deleted.
	alive func(context.Context) error
	// taken says a later request took the upload over from this one.
	taken *atomic.Bool
}

// claimDigest takes the client's digest of the whole upload, which must be of the algorithm
// the upload is hashed with: the image's checksum's, or sha256.
func (u *upload) claimDigest(d string) error {
	c, err := transfer.ParseChecksum(d)
	if err != nil {
		return Fail(http.StatusBadRequest, "%s %q: %v", HeaderDigest, d, err)
	}
	if alg, _, _ := strings.Cut(u.sum.Digest(), ":"); !strings.HasPrefix(strings.ToLower(d), alg+":") {
		return Fail(http.StatusBadRequest, "%s %q: this upload is hashed with %s (the image's checksum says so, or it has none), so the digest must be %s:<hex>", HeaderDigest, d, alg, alg)
	}
	u.Claimed = c.Want
	return nil
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) error {
	if r.URL.Path == PathHealthz {
		_, _ = io.WriteString(w, "ok\n")
		return nil
	}
	if door := s.Doors[r.URL.Path]; door != nil {
		return door(w, r)
	}
	m := path.FindStringSubmatch(r.URL.Path)
	if m == nil {
		return Fail(http.StatusNotFound, "PUT or HEAD /v1/namespaces/<namespace>/<virtualmachineimages|imagetemplates>/<name>")
	}
	ns, resource, name := m[1], m[2], m[3]
	if r.Method != http.MethodPut && r.Method != http.MethodHead {
		return Fail(http.StatusMethodNotAllowed, "PUT or HEAD")
	}
	who, err := s.authorize(r.Context(), r, ns, resource, name)
	if err != nil {
		return err
	}
	return s.upload(w, r, nil, ns, resource, name, who)
}

// body is what a request uploads: from byte start of an upload of total bytes, or of a size
// not said (total < 0: a form's file).
type body struct {
	r            io.Reader
	start, total int64
	// stop is where a piece of the upload ends (a byte offset, a multiple of the part size);
	// 0: at the upload's end.
	stop int64
	// ended says the reader came to its end (io.EOF), not to a cut (a multipart part whose
	// connection ends before the boundary says io.ErrUnexpectedEOF).
	ended bool
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.ended = b.ended || err == io.EOF
	return n, err
}

// Upload stores in, an upload of size bytes (-1: not said, as a form's file), or with in nil
// r's body from its Content-Range as a PUT's, as the upload to the image the token's claims c
// name, answering w as a PUT is answered. A door (CDI's POST) uploads with it.
func (s *Server) Upload(w http.ResponseWriter, r *http.Request, in io.Reader, size int64, c uploadtoken.Claims) error {
	var b *body
	if in != nil {
		b = &body{r: in, total: size}
	}
	return s.upload(w, r, b, c.Namespace, c.Resource, c.Name, caller{user: c.User, uid: c.UID})
}

// upload answers a HEAD with the upload's offset, and stores what any other request (a PUT,
// a door's) from who uploads: in, or else r's body from its Content-Range.
func (s *Server) upload(w http.ResponseWriter, r *http.Request, in *body, ns, resource, name string, who caller) error {
	ctx := r.Context()
	img, err := GetImage(ctx, s.Kube, ns, resource, name)
	if err != nil {
		return err
	}
	if who.uid != "" && who.uid != img.UID {
		return Fail(http.StatusForbidden, "the upload token is for an earlier %s %s/%s, since deleted: ask for a new one", resource, ns, name)
	}
	key := uploads.ObjectKey(ns, resource, name, img.UID)
	// The image may be deleted while its upload goes on: before a store write that outlives
	// the request (a new multipart upload, the marker), it must still be there, the same one,
	// or its cleanup, done already, would miss what the write leaves.
	alive := func(ctx context.Context) error {
		now, err := GetImage(ctx, s.Kube, ns, resource, name)
		if err == nil && now.UID != img.UID {
			err = Fail(http.StatusConflict, "%s %s/%s was deleted and made again during the upload: upload to the new one", resource, ns, name)
		}
		return err
	}
	var taken atomic.Bool
	if r.Method != http.MethodHead {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		rc := http.NewResponseController(w)
		release, err := s.claim(ctx, key, func() { taken.Store(true); cancel(); _ = rc.SetReadDeadline(time.Now()) })
		if err != nil {
			return err
		}
		defer release()
		// After the claim, which stops an earlier request of this upload (a resume after a
		// dropped connection) and so frees its slot.
		done, err := s.slot(w, ns)
		if err != nil {
			return err
		}
		defer done()
		// From here on (a door's form is read from here on too) the body must keep coming.
		// A request stopped by a later one (claim) stays stopped.
		deadline := func(t time.Time) error {
			if taken.Load() {
				t = time.Now()
			}
			return rc.SetReadDeadline(t)
		}
		r.Body = &pace.Reader{R: r.Body, Min: s.MinBytesPerSecond, Window: s.BodyWindow, Deadline: deadline}
	}
	u, err := s.find(ctx, key, img.Checksum, r.Method != http.MethodHead)
	if err != nil {
		return err
	}
	u.alive, u.taken = alive, &taken
	if u.PartSize == 0 {
		u.PartSize = s.PartSize
	}
	w.Header().Set(HeaderPartSize, strconv.FormatInt(u.PartSize, 10))
	if r.Method == http.MethodHead {
		w.Header().Set(HeaderOffset, strconv.FormatInt(u.Offset, 10))
		w.Header().Set(HeaderComplete, strconv.FormatBool(u.complete))
		if u.Total > 0 {
			w.Header().Set(HeaderLength, strconv.FormatInt(u.Total, 10))
		}
		return nil
	}
	if in == nil {
		start, end, total, err := contentRange(r, u.PartSize)
		if err != nil {
			return err
		}
		in = &body{r: r.Body, start: start, total: total}
		if end+1 < total {
			in.stop = end + 1
		}
	}
	if d := r.Header.Get(HeaderDigest); d != "" && !u.complete {
		if in.stop > 0 {
			return Fail(http.StatusBadRequest, "%s goes with the piece that ends the upload, whose digest it is; this piece ends at byte %d of %d", HeaderDigest, in.stop, in.total)
		}
		if err := u.claimDigest(d); err != nil {
			return err
		}
	}
	s.Log.Info("Upload", "key", key, "user", who.user, "offset", u.Offset)
	return s.put(ctx, w, in, u)
}

// DefaultMinBytesPerSecond is the least rate of an upload's body, by default.
const DefaultMinBytesPerSecond = 64 << 10

// RetryAfter is what a request over the writers' bound is told to wait, in seconds.
const RetryAfter = 10

// slot counts a writing request of namespace ns, or refuses it with 503 when the proxy or the
// namespace already has as many as it may; done uncounts it.
func (s *Server) slot(w http.ResponseWriter, ns string) (done func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.writing == nil {
		s.writing = map[string]int{}
	}
	total := 0
	for _, n := range s.writing {
		total += n
	}
	switch {
	case s.writing[ns] >= s.MaxWritersPerNamespace:
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfter))
		return nil, Fail(http.StatusServiceUnavailable, "namespace %s has %d uploads being written, as many as the proxy takes at once from a namespace: try again in %d s",
			ns, s.writing[ns], RetryAfter)
	case total >= s.MaxWriters:
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfter))
		return nil, Fail(http.StatusServiceUnavailable, "the proxy is writing %d uploads, as many as it takes at once: try again in %d s", total, RetryAfter)
	}
	s.writing[ns]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.writing[ns]--; s.writing[ns] == 0 {
			delete(s.writing, ns)
		}
	}, nil
}

// ensureBucket makes the uploads' bucket unless it exists, and checks that it is the store's
// root's: a bucket of that name made by an account first would be read by that account.
func (s *Server) ensureBucket(ctx context.Context) error {
	if err := s.Store.EnsureBucket(ctx, uploads.Bucket); err != nil {
		return err
	}
	return s.Store.CheckOwnBucket(ctx, uploads.Bucket, transfer.ReasonTargetForbidden)
}

// find reads the state of an image's upload: complete, unfinished (its saved state), or new.
// Only the writer, which holds the upload's claim, clears what an unrecorded attempt left: a
// HEAD beside a running upload (whose multipart upload exists before its state is saved) must
// not abort it.
func (s *Server) find(ctx context.Context, key, checksum string, writer bool) (*upload, error) {
	u := &upload{key: key}
	if _, err := s.Store.StatObject(ctx, uploads.Bucket, uploads.MarkerKey(key), minio.StatObjectOptions{}); err == nil {
		info, err := s.Store.StatObject(ctx, uploads.Bucket, key, minio.StatObjectOptions{})
		if err != nil {
			return nil, err
		}
		u.complete, u.Offset = true, info.Size
		return u, nil
	}
	var err error
	if u.sum, err = transfer.ParseChecksum(checksum); err != nil {
		return nil, Fail(http.StatusBadRequest, "%v", err)
	}
	u.Checksum = checksum
	saved, err := s.readState(ctx, key)
	if err != nil {
		return nil, err
	}
	if saved != nil && saved.Checksum == checksum && s.inProgress(ctx, key, saved) {
		if err := u.sum.Restore(saved.Hash); err != nil {
			return nil, err
		}
		u.state = *saved
		return u, nil
	}
	// Nothing to go on: begin again, without what an unrecorded attempt left.
	if writer {
		s.abortAll(ctx, key)
	}
	return u, nil
}

func (s *Server) readState(ctx context.Context, key string) (*state, error) {
	obj, err := s.Store.GetObject(ctx, uploads.Bucket, uploads.StateKey(key), minio.GetObjectOptions{})
	if err != nil {
		return nil, err
	}
	defer obj.Close()
	data, err := io.ReadAll(obj)
	switch code := minio.ToErrorResponse(err).Code; {
	case code == "NoSuchKey" || code == "NoSuchBucket":
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading the upload's state: %w", err)
	}
	st := &state{}
	if err := json.Unmarshal(data, st); err != nil {
		s.Log.Error("Ignoring an unreadable upload state", "key", key, "err", err)
		return nil, nil
	}
	return st, nil
}

// inProgress says whether st's multipart upload is still open, or, for one whose last part
// was stored, completed (the proxy stopped between completing and marking it).
func (s *Server) inProgress(ctx context.Context, key string, st *state) bool {
	if st.Total > 0 && st.Offset == st.Total {
		info, err := s.Store.StatObject(ctx, uploads.Bucket, key, minio.StatObjectOptions{})
		if err == nil && info.Size == st.Total {
			return true
		}
	}
	core := minio.Core{Client: s.Store.Client}
	list, err := core.ListMultipartUploads(ctx, uploads.Bucket, key, "", "", "", 1000)
	if err != nil {
		return false
	}
	for _, up := range list.Uploads {
		if up.Key == key && up.UploadID == st.UploadID {
			return true
		}
	}
	return false
}

// abortAll aborts the multipart uploads of key.
func (s *Server) abortAll(ctx context.Context, key string) {
	core := minio.Core{Client: s.Store.Client}
	list, err := core.ListMultipartUploads(ctx, uploads.Bucket, key, "", "", "", 1000)
	if err != nil {
		return
	}
	for _, up := range list.Uploads {
		if up.Key == key {
			if err := core.AbortMultipartUpload(ctx, uploads.Bucket, key, up.UploadID); err != nil {
				s.Log.Error("Could not abort an unrecorded upload", "key", key, "err", err)
			}
		}
	}
}

// save writes u's state.
func (s *Server) save(ctx context.Context, u *upload) error {
	var err error
	if u.Hash, err = u.sum.State(); err != nil {
		return err
	}
	data, err := json.Marshal(u.state)
	if err != nil {
		return err
	}
	_, err = s.Store.PutObject(ctx, uploads.Bucket, uploads.StateKey(u.key), bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{ContentType: "application/json"})
	return err
}

// put stores the body from its offset on, part by part, and completes the upload with its
// last byte.
func (s *Server) put(ctx context.Context, w http.ResponseWriter, in *body, u *upload) error {
	if u.complete {
		return Fail(http.StatusConflict, "the upload is already complete (%d bytes)", u.Offset)
	}
	if u.Total > 0 && u.Offset == u.Total {
		return s.complete(ctx, w, u) // every byte is stored: finish what a stopped request began
	}
	start, total := in.start, in.total
	if total == 0 {
		return Fail(http.StatusBadRequest, "the upload is empty")
	}
	if u.Total > 0 && total > 0 && total != u.Total {
		return Fail(http.StatusConflict, "the upload is of %d bytes, this request says %d: upload the same file, or delete and make the image again", u.Total, total)
	}
	if start > u.Offset {
		w.Header().Set(HeaderOffset, strconv.FormatInt(u.Offset, 10))
		return Fail(http.StatusConflict, "the upload is at byte %d; continue from there", u.Offset)
	}
	if total > 0 && u.Offset > total {
		return Fail(http.StatusConflict, "%d bytes of the upload are stored, more than this request's %d: upload the same file, or delete and make the image again", u.Offset, total)
	}
	// A piece's end: where this request's bytes stop, short of the upload's end.
	end := total
	if in.stop > 0 {
		end = in.stop
	}
	ns := namespaceOf(u.key)
	if total > 0 {
		release, err := s.reserve(ctx, ns, u.key, total)
		if err != nil {
			return err
		}
		defer release()
	}
	core := minio.Core{Client: s.Store.Client}
	if u.UploadID == "" {
		if err := u.alive(ctx); err != nil {
			return err
		}
		if err := s.ensureBucket(ctx); err != nil {
			return err
		}
		id, err := core.NewMultipartUpload(ctx, uploads.Bucket, u.key, minio.PutObjectOptions{})
		if err != nil {
			return err
		}
		u.UploadID = id
		if err := s.save(ctx, u); err != nil {
			return err
		}
	}
	if u.Total <= 0 && total > 0 { // said now, by this request or a later one
		u.Total = total
		if err := s.save(ctx, u); err != nil {
			return err
		}
	}
	// Skip what is stored already; a client that sends nothing, or too slowly, frees the
	// upload in time (upload's pace.Reader).
	if in.stop > 0 && u.Offset >= in.stop { // a piece stored already: say where to go on
		w.Header().Set(HeaderOffset, strconv.FormatInt(u.Offset, 10))
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	if _, err := io.CopyN(io.Discard, in, u.Offset-start); err != nil {
		if ended := bodyFailed(u.taken.Load(), err, u.Offset); ended != nil {
			return ended
		}
		return Fail(http.StatusBadRequest, "the body ended before byte %d: %v", u.Offset, err)
	}
	// The parts go to the store while the next is read (storeParts); the offset answered
	// after a failure is what was committed.
	pl := s.storeParts(ctx, u)
	defer pl.close()
	read := u.Offset // the bytes read, committed or in flight
	reserved := false
	for total < 0 || read < end {
		if ctx.Err() != nil {
			_ = pl.close()
			return Fail(http.StatusConflict, "a later request took this upload over at byte %d", u.Offset)
		}
		buf := pl.buffer()
		if buf == nil {
			break // storing failed, or the request ended: said below
		}
		want := u.PartSize
		if total > 0 {
			want = min(u.PartSize, end-read)
		}
		n, err := io.ReadFull(in, buf[:want])
		last := false
		if total < 0 && in.ended && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) {
			// A body of a size not said ends where its reader says it does.
			if n == 0 && read == 0 {
				_ = pl.close()
				return Fail(http.StatusBadRequest, "the upload is empty")
			}
			last, err = true, nil
		}
		if err != nil {
			if perr := pl.close(); perr != nil {
				return perr
			}
			w.Header().Set(HeaderOffset, strconv.FormatInt(u.Offset, 10))
			if ended := bodyFailed(u.taken.Load(), err, u.Offset); ended != nil {
				return ended
			}
			// A cut connection: the stored parts are the offset to resume from.
			s.Log.Info("Upload interrupted", "key", u.key, "offset", u.Offset, "err", err)
			if total < 0 {
				return Fail(http.StatusBadRequest, "the body ended at byte %d before the form's end; send it again (%d bytes are stored)", read+int64(n), u.Offset)
			}
			return Fail(http.StatusBadRequest, "the body ended at byte %d of %d; resume from %d", read+int64(n), end, u.Offset)
		}
		if n == 0 {
			break
		}
		if total < 0 { // a form: its size is learnt as it comes
			release, err := s.reserve(ctx, ns, u.key, read+int64(n))
			if err != nil {
				_ = pl.close()
				s.abortAll(ctx, u.key)
				s.discard(ctx, u.key)
				return err
			}
			if !reserved { // one room per key, grown with each part
				reserved = true
				defer release()
			}
		}
		pl.store(buf[:n])
		read += int64(n)
		if last {
			break
		}
	}
	perr := pl.close()
	if ctx.Err() != nil {
		return Fail(http.StatusConflict, "a later request took this upload over at byte %d", u.Offset)
	}
	if perr != nil {
		return perr
	}
	if total < 0 {
		u.Total = u.Offset
	}
	if u.Offset < u.Total { // a piece: the next goes on from here
		w.Header().Set(HeaderOffset, strconv.FormatInt(u.Offset, 10))
		w.Header().Set(HeaderComplete, "false")
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	// The body has come: completing (and a door's wait for the disk) is not bound by its pace,
	// and a read deadline left would end the server's wait for the client's close.
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	return s.complete(ctx, w, u)
}

// bodyFailed is the answer to a body that failed other than by ending: stopped by a later
// request of the upload (409), too slow (408), or a door's form that is not one (its error);
// nil for others.
func bodyFailed(taken bool, err error, stored int64) error {
	if taken {
		return Fail(http.StatusConflict, "a later request took this upload over at byte %d", stored)
	}
	if slow, ok := errors.AsType[*pace.SlowError](err); ok {
		return Fail(http.StatusRequestTimeout, "%v: %d bytes are stored; resume from there", slow, stored)
	}
	if _, ok := errors.AsType[*httpError](err); ok {
		return err
	}
	return nil
}

// complete joins the parts, verifies the checksum from the hash of what came, and marks the
// upload whole.
func (s *Server) complete(ctx context.Context, w http.ResponseWriter, u *upload) error {
	core := minio.Core{Client: s.Store.Client}
	parts := make([]minio.CompletePart, len(u.Parts))
	for i, p := range u.Parts {
		parts[i] = minio.CompletePart{PartNumber: p.Number, ETag: p.ETag}
	}
	if _, err := core.CompleteMultipartUpload(ctx, uploads.Bucket, u.key, u.UploadID, parts, minio.PutObjectOptions{}); err != nil {
		// Completed already, by a request that stopped before its marker.
		if info, serr := s.Store.StatObject(ctx, uploads.Bucket, u.key, minio.StatObjectOptions{}); serr != nil || info.Size != u.Total {
			return err
		}
	}
	if err := u.sum.Verify(); err != nil {
		s.discard(ctx, u.key)
		return Fail(http.StatusUnprocessableEntity, "%v; the upload was discarded: upload the right image", err)
	}
	digest := u.sum.Digest()
	if _, got, _ := strings.Cut(digest, ":"); u.Claimed != "" && got != u.Claimed {
		s.discard(ctx, u.key)
		return Fail(http.StatusUnprocessableEntity, "the proxy's digest of the %d bytes it stored is %s, the client's of its file %s: the file was changed or damaged on the way; the upload was discarded: upload it again",
			u.Offset, digest, u.Claimed)
	}
	if err := u.alive(ctx); err != nil {
		s.discard(ctx, u.key)
		return err
	}
	if _, err := s.Store.PutObject(ctx, uploads.Bucket, uploads.MarkerKey(u.key), strings.NewReader(digest), int64(len(digest)), minio.PutObjectOptions{}); err != nil {
		return err
	}
	if err := s.Store.RemoveObject(ctx, uploads.Bucket, uploads.StateKey(u.key), minio.RemoveObjectOptions{}); err != nil {
		s.Log.Error("Could not remove a finished upload's state", "key", u.key, "err", err)
	}
	s.Log.Info("Upload complete", "key", u.key, "bytes", u.Offset, "digest", digest)
	w.Header().Set(HeaderOffset, strconv.FormatInt(u.Offset, 10))
	w.Header().Set(HeaderComplete, "true")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, "uploaded %d bytes, %s\n", u.Offset, digest)
	return nil
}

// discard removes a rejected upload's object and state.
func (s *Server) discard(ctx context.Context, key string) {
	for _, k := range []string{key, uploads.StateKey(key)} {
		if err := s.Store.RemoveObject(ctx, uploads.Bucket, k, minio.RemoveObjectOptions{}); err != nil {
			s.Log.Error("Could not remove a rejected upload", "key", k, "err", err)
		}
	}
}

// contentRange is where the body starts and ends (its last byte) and the upload's total
// size: from Content-Range, or the whole upload in one body of Content-Length bytes. A body
// that stops before the upload's end stops at a multiple of partSize.
func contentRange(r *http.Request, partSize int64) (start, end, total int64, err error) {
	cr := r.Header.Get("Content-Range")
	if cr == "" {
		if r.ContentLength < 0 {
			return 0, 0, 0, Fail(http.StatusLengthRequired, "Content-Length (or Content-Range) is required")
		}
		return 0, r.ContentLength - 1, r.ContentLength, nil
	}
	if _, err := fmt.Sscanf(cr, "bytes %d-%d/%d", &start, &end, &total); err != nil || start < 0 || end < start || end >= total {
		return 0, 0, 0, Fail(http.StatusBadRequest, "Content-Range %q must be bytes <first>-<last>/<total>", cr)
	}
	if r.ContentLength >= 0 && r.ContentLength != end-start+1 {
		return 0, 0, 0, Fail(http.StatusBadRequest, "Content-Range %q does not match Content-Length %d", cr, r.ContentLength)
	}
	if end != total-1 && (end+1)%partSize != 0 {
		return 0, 0, 0, Fail(http.StatusBadRequest, "a body must run to the end of the upload (byte %d) or stop at a multiple of the part size, %d bytes (%s)", total-1, partSize, HeaderPartSize)
	}
	return start, end, total, nil
}
