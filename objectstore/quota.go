package objectstore

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/versity/versitygw/backend"
	"github.com/versity/versitygw/s3err"
	"github.com/versity/versitygw/s3response"
)

// # Quota
//
// With a quota, the bytes stored in the buckets an account owns (a namespace's, made with its
// keys) may not grow past it: a PUT or an uploaded part that would cross it is refused with
// 403 QuotaExceeded, naming the quota and what is used; so is a copy (CopyObject, UploadPartCopy)
// of an object or a range that would. Buckets of the root account (the
// upload proxy's) have none. What a bucket holds is summed from its directory (objects and
// unfinished parts) when a write arrives; writes that race may overshoot by what is in flight.

// quota wraps the store's backend with a byte quota per bucket owner.
type quota struct {
	backend.Backend
	dir   string
	root  string
	limit int64
}

func (q *quota) PutObject(ctx context.Context, in s3response.PutObjectInput) (s3response.PutObjectOutput, error) {
	if err := q.check(ctx, deref(in.Bucket), deref(in.ContentLength)); err != nil {
		return s3response.PutObjectOutput{}, err
	}
	return q.Backend.PutObject(ctx, in)
}

func (q *quota) UploadPart(ctx context.Context, in *s3.UploadPartInput) (*s3.UploadPartOutput, error) {
	if err := q.check(ctx, deref(in.Bucket), deref(in.ContentLength)); err != nil {
		return nil, err
	}
	return q.Backend.UploadPart(ctx, in)
}

func (q *quota) CopyObject(ctx context.Context, in s3response.CopyObjectInput) (s3response.CopyObjectOutput, error) {
	size, err := q.sourceSize(ctx, deref(in.CopySource), "")
	if err == nil {
		err = q.check(ctx, deref(in.Bucket), size)
	}
	if err != nil {
		return s3response.CopyObjectOutput{}, err
	}
	return q.Backend.CopyObject(ctx, in)
}

func (q *quota) UploadPartCopy(ctx context.Context, in *s3.UploadPartCopyInput) (s3response.CopyPartResult, error) {
	size, err := q.sourceSize(ctx, deref(in.CopySource), deref(in.CopySourceRange))
	if err == nil {
		err = q.check(ctx, deref(in.Bucket), size)
	}
	if err != nil {
		return s3response.CopyPartResult{}, err
	}
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

// check refuses adding size bytes to bucket when its owner's buckets would hold more than
// the quota.
func (q *quota) check(ctx context.Context, bucket string, size int64) error {
	owner, err := q.owner(ctx, bucket)
	if err != nil || owner == "" || owner == q.root {
		return nil // the backend answers for a bucket that does not exist
	}
	entries, err := os.ReadDir(q.dir)
	if err != nil {
		return err
	}
	used := int64(0)
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if o, err := q.owner(ctx, e.Name()); err != nil || o != owner {
			continue
		}
		_ = filepath.WalkDir(filepath.Join(q.dir, e.Name()), func(_ string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if info, err := d.Info(); err == nil {
					used += info.Size()
				}
			}
			return nil
		})
	}
	if used+size > q.limit {
		return s3err.APIError{Code: "QuotaExceeded", HTTPStatusCode: http.StatusForbidden,
			Description: fmt.Sprintf("the quota of account %s in the bundled object store is %d bytes (objectStore.bundled.quotaPerNamespace): its buckets hold %d, and %d more were sent",
				owner, q.limit, used, size)}
	}
	return nil
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
