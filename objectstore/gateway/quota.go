package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/versity/versitygw/backend"
	"github.com/versity/versitygw/s3err"
	"github.com/versity/versitygw/s3response"
)

// # Quota
//
// Every account but root (the upload proxy's) is a namespace's, and the store is shared by
// them all, so each is bounded:
//   - bytes, with a quota: the bytes stored in the buckets an account owns may not grow past
//     it; a PUT or an uploaded part that would cross it is refused with 403 QuotaExceeded,
//     naming the quota and what is used; so is a copy (CopyObject, UploadPartCopy) of an object
//     or a range that would. What a bucket holds is summed from its directory (objects and
//     unfinished parts) when a write arrives, and the writes of the account still in flight
//     are counted too (reserved here until they end), so that parallel writes cannot pass the
//     quota together: a write being stored may be counted twice for a moment, which refuses
//     early rather than late;
//   - buckets: MaxBuckets an account may own (TooManyBuckets), so that no account's buckets
//     make the store's lists long for everyone;
//   - objects: MaxObjects files (objects, parts, unfinished uploads) in its buckets
//     (QuotaExceeded), so that zero-byte objects cannot take the volume's inodes.
//
// Who owns each bucket is read once from the buckets' ACLs and kept as buckets are made,
// deleted and given away, so a write reads only its own account's buckets.

// quota wraps the store's backend with the bounds per bucket owner.
type quota struct {
	backend.Backend
	dir  string
	root string
	// limit is the bytes an account's buckets may hold (0: no quota); buckets and objects
	// what it may own and store.
	limit, objects int64
	buckets        int

	mu       sync.Mutex
	owners   map[string]string // bucket: owner's access key; nil until read
	inflight map[string]int64  // owner: bytes being written
}

// Defaults of the bounds per account.
const (
	DefaultMaxBuckets = 100
	DefaultMaxObjects = 100000
)

func (q *quota) PutObject(ctx context.Context, in s3response.PutObjectInput) (s3response.PutObjectOutput, error) {
	done, err := q.reserve(ctx, deref(in.Bucket), deref(in.ContentLength))
	if err != nil {
		return s3response.PutObjectOutput{}, err
	}
	defer done()
	return q.Backend.PutObject(ctx, in)
}

func (q *quota) UploadPart(ctx context.Context, in *s3.UploadPartInput) (*s3.UploadPartOutput, error) {
	done, err := q.reserve(ctx, deref(in.Bucket), deref(in.ContentLength))
	if err != nil {
		return nil, err
	}
	defer done()
	return q.Backend.UploadPart(ctx, in)
}

func (q *quota) CreateMultipartUpload(ctx context.Context, in s3response.CreateMultipartUploadInput) (s3response.InitiateMultipartUploadResult, error) {
	done, err := q.reserve(ctx, deref(in.Bucket), 0)
	if err != nil {
		return s3response.InitiateMultipartUploadResult{}, err
	}
	defer done()
	return q.Backend.CreateMultipartUpload(ctx, in)
}

func (q *quota) CreateBucket(ctx context.Context, in *s3.CreateBucketInput, defaultACL []byte) error {
	var acl struct{ Owner string }
	_ = json.Unmarshal(defaultACL, &acl)
	bucket := deref(in.Bucket)
	if err := q.loadOwners(ctx); err != nil {
		return err
	}
	q.mu.Lock()
	owned := 0
	for _, o := range q.owners {
		if o == acl.Owner {
			owned++
		}
	}
	q.mu.Unlock()
	if acl.Owner != q.root && owned >= q.buckets {
		if _, exists := q.ownerOf(bucket); !exists { // the backend answers BucketAlreadyOwnedByYou
			return s3err.APIError{Code: "TooManyBuckets", HTTPStatusCode: http.StatusBadRequest,
				Description: fmt.Sprintf("account %s owns %d buckets, as many as the bundled object store lets an account own: delete one first", acl.Owner, owned)}
		}
	}
	if err := q.Backend.CreateBucket(ctx, in, defaultACL); err != nil {
		return err
	}
	q.setOwner(bucket, acl.Owner)
	return nil
}

func (q *quota) DeleteBucket(ctx context.Context, bucket string) error {
	if err := q.Backend.DeleteBucket(ctx, bucket); err != nil {
		return err
	}
	q.setOwner(bucket, "")
	return nil
}

func (q *quota) ChangeBucketOwner(ctx context.Context, bucket, owner string) error {
	if err := q.Backend.ChangeBucketOwner(ctx, bucket, owner); err != nil {
		return err
	}
	q.setOwner(bucket, owner)
	return nil
}

func (q *quota) CopyObject(ctx context.Context, in s3response.CopyObjectInput) (s3response.CopyObjectOutput, error) {
	size, err := q.sourceSize(ctx, deref(in.CopySource), "")
	if err != nil {
		return s3response.CopyObjectOutput{}, err
	}
	done, err := q.reserve(ctx, deref(in.Bucket), size)
	if err != nil {
		return s3response.CopyObjectOutput{}, err
	}
	defer done()
	return q.Backend.CopyObject(ctx, in)
}

func (q *quota) UploadPartCopy(ctx context.Context, in *s3.UploadPartCopyInput) (s3response.CopyPartResult, error) {
	size, err := q.sourceSize(ctx, deref(in.CopySource), deref(in.CopySourceRange))
	if err != nil {
		return s3response.CopyPartResult{}, err
	}
	done, err := q.reserve(ctx, deref(in.Bucket), size)
	if err != nil {
		return s3response.CopyPartResult{}, err
	}
	defer done()
	return q.Backend.UploadPartCopy(ctx, in)
}

// sourceSize is how many bytes a copy of source (x-amz-copy-source, read as the backend reads
// it) writes: those of rng ("bytes=first-last") or of the whole object. A source it cannot
// read is the copy's refusal: a copy of unknown size is not let past the quota.
func (q *quota) sourceSize(ctx context.Context, source, rng string) (int64, error) {
	bucket, key, _, err := backend.ParseCopySource(source)
	if err != nil {
		return 0, err
	}
	head, err := q.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &bucket, Key: &key})
	if err != nil {
		return 0, err
	}
	size := deref(head.ContentLength)
	if rng == "" {
		return size, nil
	}
	_, length, err := backend.ParseCopySourceRange(size, rng)
	return length, err
}

// reserve counts size bytes more being written to bucket, in one more file, for its owner until
// done, or refuses them when its owner's buckets, with what is in flight, would hold more than
// the quota or the files it may store.
func (q *quota) reserve(ctx context.Context, bucket string, size int64) (done func(), err error) {
	if err := q.loadOwners(ctx); err != nil {
		return nil, err
	}
	owner, _ := q.ownerOf(bucket)
	if owner == "" || owner == q.root {
		return func() {}, nil // the backend answers for a bucket that does not exist
	}
	used, stored := q.usage(owner)
	q.mu.Lock()
	defer q.mu.Unlock()
	inflight := q.inflight[owner]
	switch {
	case q.limit > 0 && used+inflight+size > q.limit:
		return nil, s3err.APIError{Code: "QuotaExceeded", HTTPStatusCode: http.StatusForbidden,
			Description: fmt.Sprintf("the quota of account %s in the bundled object store is %d bytes (objectStore.bundled.quotaPerNamespace): its buckets hold %d, %d more are being written, and %d more were sent",
				owner, q.limit, used, inflight, size)}
	case stored+1 > q.objects:
		return nil, s3err.APIError{Code: "QuotaExceeded", HTTPStatusCode: http.StatusForbidden,
			Description: fmt.Sprintf("account %s stores %d files (objects and parts) in the bundled object store, as many as it lets an account store: delete some first",
				owner, stored)}
	}
	if q.inflight == nil {
		q.inflight = map[string]int64{}
	}
	q.inflight[owner] += size
	return func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		if q.inflight[owner] -= size; q.inflight[owner] <= 0 {
			delete(q.inflight, owner)
		}
	}, nil
}

// usage is the bytes and files of owner's buckets.
func (q *quota) usage(owner string) (bytes, files int64) {
	q.mu.Lock()
	var buckets []string
	for b, o := range q.owners {
		if o == owner {
			buckets = append(buckets, b)
		}
	}
	q.mu.Unlock()
	for _, b := range buckets {
		_ = filepath.WalkDir(filepath.Join(q.dir, b), func(_ string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if info, err := d.Info(); err == nil {
					bytes += info.Size()
					files++
				}
			}
			return nil
		})
	}
	return bytes, files
}

// loadOwners reads the owner of every bucket, once.
func (q *quota) loadOwners(ctx context.Context) error {
	q.mu.Lock()
	loaded := q.owners != nil
	q.mu.Unlock()
	if loaded {
		return nil
	}
	entries, err := os.ReadDir(q.dir)
	if err != nil {
		return err
	}
	owners := map[string]string{}
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if o, err := q.owner(ctx, e.Name()); err == nil {
			owners[e.Name()] = o
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.owners == nil {
		q.owners = owners
	}
	return nil
}

func (q *quota) ownerOf(bucket string) (string, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	o, ok := q.owners[bucket]
	return o, ok
}

// setOwner keeps who owns bucket ("": none, it is deleted).
func (q *quota) setOwner(bucket, owner string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.owners == nil {
		return // read when first needed
	}
	if owner == "" {
		delete(q.owners, bucket)
	} else {
		// Cloned: the gateway's strings share its request buffers, which the next request
		// writes over.
		q.owners[strings.Clone(bucket)] = strings.Clone(owner)
	}
}

// owner is the access key of bucket's owner.
func (q *quota) owner(ctx context.Context, bucket string) (string, error) {
	b, err := q.GetBucketAcl(ctx, &s3.GetBucketAclInput{Bucket: &bucket})
	if err != nil {
		return "", err
	}
	var acl struct{ Owner string }
	if err := json.Unmarshal(b, &acl); err != nil {
		return "", err
	}
	return acl.Owner, nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
