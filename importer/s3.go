package importer

import (
	"context"
	"fmt"
	"io"

	"github.com/minio/minio-go/v7"

	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore"
)

// S3Source reads an object from an S3-compatible store: diskpipe's bundled store (a
// VirtualMachineImage's objectStore source, an upload) or any other. Objects are always read
// at random, several ranges at once, like an HTTP server with Range support.
type S3Source struct {
	// Config reaches the store.
	Config objectstore.ClientConfig
	// Bucket and Object name the image.
	Bucket, Object string
}

func (s *S3Source) String() string {
	return fmt.Sprintf("%s at %s", objectstore.ObjectURL(s.Bucket, s.Object), s.Config.Endpoint)
}

// Open checks the names and reads the object's size and ETag.
func (s *S3Source) Open(ctx context.Context) (Object, error) {
	if err := objectstore.CheckBucketName(s.Bucket); err != nil {
		return nil, err
	}
	if s.Object == "" {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "an object name is required")
	}
	c, err := objectstore.NewClient(s.Config)
	if err != nil {
		return nil, err
	}
	info, err := c.StatObject(ctx, s.Bucket, s.Object, minio.StatObjectOptions{})
	if err != nil {
		return nil, objectstore.Classify(err, "reading "+s.String())
	}
	return &s3Object{src: s, core: minio.Core{Client: c.Client}, size: info.Size, etag: info.ETag}, nil
}

type s3Object struct {
	src  *S3Source
	core minio.Core
	size int64
	etag string
}

func (o *s3Object) Size() int64        { return o.size }
func (o *s3Object) RandomAccess() bool { return true }
func (o *s3Object) Identity() string   { return fmt.Sprintf("etag %s size %d", o.etag, o.size) }
func (o *s3Object) Revision() string   { return o.etag }
func (o *s3Object) Close() error       { return nil }

// ReadRange reads a range of the object as it was when opened: if the object is replaced
// during the import, the ETag no longer matches and the import fails rather than mixing two
// images.
func (o *s3Object) ReadRange(ctx context.Context, off, n int64) (io.ReadCloser, error) {
	opts := minio.GetObjectOptions{}
	if err := opts.SetMatchETag(o.etag); err != nil {
		return nil, transfer.Permanent(transfer.ReasonInternal, "%w", err)
	}
	end := int64(0) // to the end
	if n > 0 {
		end = off + n - 1
	}
	if off > 0 || n > 0 {
		if err := opts.SetRange(off, end); err != nil {
			return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "%w", err)
		}
	}
	body, _, _, err := o.core.GetObject(ctx, o.src.Bucket, o.src.Object, opts)
	if err != nil {
		if minio.ToErrorResponse(err).Code == "PreconditionFailed" {
			return nil, transfer.Permanent(transfer.ReasonSourceUnavailable, "%s changed during the import", o.src)
		}
		return nil, objectstore.Classify(err, "reading "+o.src.String())
	}
	return body, nil
}
