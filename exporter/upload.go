package exporter

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/tags"

	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore"
)

// S3 allows 10,000 parts; diskpipe keeps room to spare.
const maxParts = 9000

// MultipartSink streams the image into an S3 multipart upload: parts are cut as the stream
// arrives and uploaded several at once, so memory holds at most Parallel+1 parts and nothing
// touches a local disk. A failed export aborts the upload, leaving no object and no parts.
type MultipartSink struct {
	client         *objectstore.Client
	core           minio.Core
	bucket, object string
	uploadID       string
	partSize       int
	retry          transfer.RetryPolicy
	log            *slog.Logger

	cur  []byte
	part int
	sem  chan struct{}
	free chan []byte // part buffers, Parallel+1 of them, reused
	wg   sync.WaitGroup
	ctx  context.Context

	mu    sync.Mutex
	parts []minio.CompletePart
	err   error

	// OnPart, when set, is called after each part is stored (tests use it to fail mid-way).
	OnPart func(part int)
}

// SinkOptions configure a MultipartSink.
type SinkOptions struct {
	Bucket, Object string
	// Metadata is stored with the object (as x-amz-meta-*).
	Metadata map[string]string
	// ExpectedSize sizes the parts so the upload stays within S3's part limit.
	ExpectedSize int64
	// PartSize is the smallest part (default 16 MiB); Parallel the parts in flight (default 4).
	PartSize, Parallel int
	Retry              transfer.RetryPolicy
	Log                *slog.Logger
	// CreateBucket creates the bucket when it does not exist.
	CreateBucket bool
	// KeepStale leaves unfinished uploads of the object alone; by default they are aborted.
	KeepStale bool
}

// NewMultipartSink aborts any upload of the same object an earlier, failed export left behind
// and starts a new one.
func NewMultipartSink(ctx context.Context, c *objectstore.Client, o SinkOptions) (*MultipartSink, error) {
	if err := objectstore.CheckBucketName(o.Bucket); err != nil {
		return nil, err
	}
	if o.PartSize == 0 {
		o.PartSize = 16 << 20
	}
	if o.Parallel == 0 {
		o.Parallel = 4
	}
	if o.Retry.Attempts == 0 {
		o.Retry = transfer.DefaultRetryPolicy
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if need := (o.ExpectedSize + maxParts - 1) / maxParts; int64(o.PartSize) < need {
		o.PartSize = int((need + 1<<20 - 1) &^ (1<<20 - 1)) // whole MiB
	}
	s := &MultipartSink{
		client: c, core: minio.Core{Client: c.Client}, bucket: o.Bucket, object: o.Object, partSize: o.PartSize,
		retry: o.Retry, log: o.Log, sem: make(chan struct{}, o.Parallel), ctx: ctx,
		free: make(chan []byte, o.Parallel+1),
	}
	if o.CreateBucket {
		if err := c.EnsureBucket(ctx, o.Bucket); err != nil {
			return nil, err
		}
	}
	if !o.KeepStale {
		if err := s.abortStale(ctx); err != nil {
			return nil, err
		}
	}
	meta := map[string]string{}
	for k, v := range o.Metadata {
		meta[k] = v
	}
	err := s.retry.Do(ctx, s.log, "start upload", func() error {
		id, err := s.core.NewMultipartUpload(ctx, o.Bucket, o.Object, minio.PutObjectOptions{
			UserMetadata: meta, ContentType: "application/octet-stream"})
		s.uploadID = id
		return classify(err, "starting the upload of "+s.String())
	})
	if err != nil {
		return nil, err
	}
	s.cur = s.buffer()
	return s, nil
}

func (s *MultipartSink) String() string { return objectstore.ObjectURL(s.bucket, s.object) }

func classify(err error, what string) error {
	if err == nil {
		return nil
	}
	return transfer.AsTarget(objectstore.Classify(err, what))
}

// abortStale aborts incomplete uploads of this object, from exports that failed before.
func (s *MultipartSink) abortStale(ctx context.Context) error {
	ids, err := s.client.AbortUploads(ctx, s.bucket, s.object)
	for _, id := range ids {
		s.log.Info("Aborted an upload an earlier export left behind", "object", s.String(), "uploadID", id)
	}
	return transfer.AsTarget(err)
}

// Write cuts the stream into parts.
func (s *MultipartSink) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if err := s.failed(); err != nil {
			return 0, err
		}
		m := min(len(p), s.partSize-len(s.cur))
		s.cur = append(s.cur, p[:m]...)
		p = p[m:]
		if len(s.cur) == s.partSize {
			s.flush()
		}
	}
	return n, nil
}

func (s *MultipartSink) failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// buffer returns a free part buffer, or a new one while fewer than Parallel+1 exist.
func (s *MultipartSink) buffer() []byte {
	select {
	case b := <-s.free:
		return b[:0]
	default:
		return make([]byte, 0, s.partSize)
	}
}

// flush uploads the current part in the background, once a slot is free.
func (s *MultipartSink) flush() {
	s.sem <- struct{}{}
	s.part++
	num, data := s.part, s.cur
	s.cur = s.buffer()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() { <-s.sem }()
		defer func() {
			select {
			case s.free <- data:
			default:
			}
		}()
		var part minio.ObjectPart
		err := s.retry.Do(s.ctx, s.log, fmt.Sprintf("upload part %d", num), func() error {
			var err error
			part, err = s.core.PutObjectPart(s.ctx, s.bucket, s.object, s.uploadID, num,
				bytes.NewReader(data), int64(len(data)), minio.PutObjectPartOptions{})
			return classify(err, fmt.Sprintf("uploading part %d of %s", num, s))
		})
		s.mu.Lock()
		defer s.mu.Unlock()
		if err != nil {
			if s.err == nil {
				s.err = err
			}
			return
		}
		s.parts = append(s.parts, minio.CompletePart{PartNumber: num, ETag: part.ETag})
		if s.OnPart != nil {
			s.OnPart(num)
		}
	}()
}

// Complete uploads the last part and completes the upload; the digest becomes the object's
// tag "diskpipe-sha256".
func (s *MultipartSink) Complete(ctx context.Context, digest string) error {
	if len(s.cur) > 0 || s.part == 0 {
		s.flush()
	}
	s.wg.Wait()
	if err := s.failed(); err != nil {
		return err
	}
	sort.Slice(s.parts, func(i, j int) bool { return s.parts[i].PartNumber < s.parts[j].PartNumber })
	err := s.retry.Do(ctx, s.log, "complete upload", func() error {
		_, err := s.core.CompleteMultipartUpload(ctx, s.bucket, s.object, s.uploadID, s.parts, minio.PutObjectOptions{})
		return classify(err, "completing the upload of "+s.String())
	})
	if err != nil {
		return err
	}
	t, err := tags.MapToObjectTags(map[string]string{"diskpipe-sha256": strings.TrimPrefix(digest, "sha256:")})
	if err != nil {
		return transfer.Permanent(transfer.ReasonInternal, "%w", err)
	}
	if err := s.client.PutObjectTagging(ctx, s.bucket, s.object, t, minio.PutObjectTaggingOptions{}); err != nil {
		// The object is complete; the digest is in the result and the status as well.
		s.log.Info("Could not tag the object with its sha256", "object", s.String(), "err", err)
	}
	return nil
}

// Abort waits for the parts in flight and aborts the upload, so no parts are left behind.
func (s *MultipartSink) Abort(ctx context.Context) error {
	s.wg.Wait()
	return s.retry.Do(ctx, s.log, "abort upload", func() error {
		return classify(s.core.AbortMultipartUpload(ctx, s.bucket, s.object, s.uploadID), "aborting the upload of "+s.String())
	})
}
