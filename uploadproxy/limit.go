package uploadproxy

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/minio/minio-go/v7"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/objectstore/uploads"
)

// # What a namespace's uploads may hold
//
// The uploads of a namespace, whole or not, are kept in the store (root's bucket, so no
// store quota sees them) until their images are deleted. Their bytes may not pass the smallest
// of the namespace's storage quota (the requests.storage of its ResourceQuotas: an upload is
// imported into a volume of at least its size, so what it cannot hold, it cannot import) and
// the proxy's own limit per namespace (MaxBytesPerNamespace, uploadProxy.maxBytesPerNamespace).
// An upload of a said size is refused before any byte is stored; one of a size not said (a
// form) when it reaches the limit, and what it stored is discarded. Uploads being written
// reserve their sizes in this proxy, so that two cannot both take the last room; replicas of
// the proxy do not see each other's reservations (one may pass the bound by what another is
// writing).

// bound is what a namespace's uploads may hold, and where that comes from, when set.
type bound struct {
	set   bool
	bytes int64
	from  string
}

func (s *Server) bound(ctx context.Context, ns string) (bound, error) {
	b := bound{}
	if s.MaxBytesPerNamespace > 0 {
		b = bound{set: true, bytes: s.MaxBytesPerNamespace, from: "the upload proxy's limit per namespace (uploadProxy.maxBytesPerNamespace)"}
	}
	quotas := &corev1.ResourceQuotaList{}
	if err := s.Kube.List(ctx, quotas, client.InNamespace(ns)); err != nil {
		return bound{}, fmt.Errorf("reading the ResourceQuotas of namespace %s: %w", ns, err)
	}
	for _, q := range quotas.Items {
		hard, ok := q.Spec.Hard[corev1.ResourceRequestsStorage]
		if !ok {
			continue
		}
		// A quota of 0 is a bound too: no storage, so no uploads.
		if n := hard.Value(); !b.set || n < b.bytes {
			b = bound{set: true, bytes: n, from: fmt.Sprintf("the requests.storage of ResourceQuota %s", q.Name)}
		}
	}
	return b, nil
}

// held is the bytes each upload of namespace ns keeps in the store, by key: a whole upload's
// object, an unfinished one's size (or its stored bytes while its size is not said).
func (s *Server) held(ctx context.Context, ns string) (map[string]int64, error) {
	held := map[string]int64{}
	for obj := range s.Store.ListObjects(ctx, uploads.Bucket, minio.ListObjectsOptions{Prefix: ns + "/", Recursive: true}) {
		if obj.Err != nil {
			if minio.ToErrorResponse(obj.Err).Code == "NoSuchBucket" {
				return nil, nil
			}
			return nil, fmt.Errorf("listing the uploads of namespace %s: %w", ns, obj.Err)
		}
		key, unfinished := strings.CutSuffix(obj.Key, ".state")
		switch {
		case strings.HasSuffix(obj.Key, ".complete"):
		case unfinished:
			st, err := s.readState(ctx, key)
			if err != nil {
				return nil, err
			}
			if st != nil {
				held[key] = max(held[key], st.Total, st.Offset)
			}
		default:
			held[key] = max(held[key], obj.Size)
		}
	}
	return held, nil
}

// reserve takes room for the size bytes of the upload at key of namespace ns (its total, or
// what a form has sent so far), or refuses with 413 saying what the namespace keeps and its
// bound. The requests writing at once are counted at what they reserved, not at what they
// stored. release gives the room back once the request ends.
func (s *Server) reserve(ctx context.Context, ns, key string, size int64) (release func(), err error) {
	b, err := s.bound(ctx, ns)
	if err != nil || !b.set {
		return func() {}, err
	}
	held, err := s.held(ctx, ns)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reserved == nil {
		s.reserved = map[string]int64{}
	}
	kept, writing := int64(0), int64(0)
	for k, n := range held {
		if _, ok := s.reserved[k]; !ok && k != key {
			kept += n
		}
	}
	for k, n := range s.reserved {
		if k != key && namespaceOf(k) == ns {
			writing += n
		}
	}
	if kept+writing+size > b.bytes {
		return nil, Fail(http.StatusRequestEntityTooLarge,
			"namespace %s may keep %d bytes of uploads (%s): %d are kept and %d being written, and this upload has %d; delete images whose uploads are done with, or raise the bound",
			ns, b.bytes, b.from, kept, writing, size)
	}
	s.reserved[key] = size
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.reserved, key)
	}, nil
}

// namespaceOf is the namespace of an upload's key.
func namespaceOf(key string) string {
	ns, _, _ := strings.Cut(key, "/")
	return ns
}
