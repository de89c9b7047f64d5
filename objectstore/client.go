package objectstore

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/s3utils"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// HealthPath answers unauthenticated health checks with 200 on the bundled store.
const HealthPath = "/healthz"

// ClientConfig says how to reach an S3-compatible store.
type ClientConfig struct {
	// Endpoint is the store's URL, http:// or https://.
	Endpoint string
	// Region of the bucket; empty lets the client discover it.
	Region string
	// BucketLookup is "Auto" (default), "Path" or "VirtualHost".
	BucketLookup string
	// AccessKey and SecretKey sign requests; both empty means anonymous.
	AccessKey, SecretKey string
	// CAFile is a PEM bundle that replaces the system roots.
	CAFile string
	// Insecure skips verification of the store's certificate.
	Insecure bool
	// Scoped says the store is diskpipe's bundled one, which makes an account per writer
	// (scoped.go), so pods never get these keys.
	Scoped bool
	// SingleTenant, for a store that is not Scoped, says every namespace may use it with the
	// installation's keys (exports get them in a Secret of their namespace, objectStore
	// sources are presigned with them): a cluster of one tenant. Without it such a store
	// serves uploads only, and exports and objectStore sources naming it are refused.
	SingleTenant bool
	// Egress is where the client may connect (nil: anywhere): set in pods that reach a store a
	// user names.
	Egress *transfer.Egress
}

// BindFlags registers the --objectstore-* flags of the programs that reach the store (the
// manager, the upload proxy): endpoint, region, bucket lookup and CA into c, the directory of
// the mounted credentials Secret into credsDir.
func (c *ClientConfig) BindFlags(fs *flag.FlagSet, credsDir *string) {
	fs.StringVar(&c.Endpoint, "objectstore-endpoint", "", "URL of the object store (empty: none)")
	fs.StringVar(credsDir, "objectstore-credentials-dir", "/var/run/diskpipe/objectstore", "directory with the store's accessKeyId and secretAccessKey")
	fs.StringVar(&c.Region, "objectstore-region", "us-east-1", "region of the object store")
	fs.StringVar(&c.BucketLookup, "objectstore-bucket-lookup", "Path", "Auto, Path or VirtualHost")
	fs.StringVar(&c.CAFile, "objectstore-ca-file", "", "PEM bundle of the store's CA (empty: the system's roots)")
	fs.BoolVar(&c.Scoped, "objectstore-scoped-credentials", false, "the store is diskpipe's bundled one: exporter pods get an account that may write their one object, never these keys")
	fs.BoolVar(&c.SingleTenant, "objectstore-single-tenant", false, "an external store (not scoped) may be used by every namespace with these keys: the cluster has one tenant")
}

// LoadCredentials reads the keys "accessKeyId" and "secretAccessKey" of a Secret mounted at
// dir into c.
func (c *ClientConfig) LoadCredentials(dir string) error {
	ak, err1 := os.ReadFile(filepath.Join(dir, "accessKeyId"))     //nolint:gosec // a mounted Secret
	sk, err2 := os.ReadFile(filepath.Join(dir, "secretAccessKey")) //nolint:gosec // a mounted Secret
	if os.IsNotExist(err2) {
		sk, err2 = os.ReadFile(filepath.Join(dir, "secretKey")) //nolint:gosec // CDI's name of the key
	}
	// Neither file: an optional Secret volume of a Secret that does not exist.
	if os.IsNotExist(err1) && os.IsNotExist(err2) {
		return transfer.Transient(transfer.ReasonCredentialsNotFound,
			"no S3 keys in %s: the Secret that secretRef names does not exist in this namespace, or has neither accessKeyId nor secretAccessKey (or CDI's secretKey)", dir)
	}
	if err := errors.Join(err1, err2); err != nil {
		return transfer.Permanent(transfer.ReasonInvalidArgument, "reading S3 credentials: %w", err)
	}
	c.AccessKey, c.SecretKey = strings.TrimSpace(string(ak)), strings.TrimSpace(string(sk))
	return nil
}

// Client is a minio-go client with diskpipe's error handling.
type Client struct {
	*minio.Client
	endpoint *url.URL
	cfg      ClientConfig
	http     *http.Client
	// root is the client with the root keys this one came from, and tenant its namespace,
	// when this is a tenant's client (Tenant).
	root   *Client
	tenant string
	// tenants are the tenants' clients made from this one, by namespace UID, and uids how
	// those UIDs are learnt (ResolveNamespaces).
	tenants sync.Map
	uids    NamespaceUIDs
	// moved are the namespaces whose account of before UIDs Tenant moved, for the next
	// SweepTenants to report.
	moved sync.Map
	// ownBuckets are the buckets CheckOwnBucket found the client's, with when.
	ownBuckets sync.Map
}

// NewClient returns a client for c.
func NewClient(c ClientConfig) (*Client, error) {
	u, err := url.Parse(c.Endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "S3 endpoint %q must be an http:// or https:// URL", c.Endpoint)
	}
	if u.Path != "" && u.Path != "/" {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "S3 endpoint %q must not have a path", c.Endpoint)
	}
	lookup := minio.BucketLookupAuto
	switch c.BucketLookup {
	case "", "Auto":
	case "Path":
		lookup = minio.BucketLookupPath
	case "VirtualHost":
		lookup = minio.BucketLookupDNS
	default:
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "bucket lookup %q must be Auto, Path or VirtualHost", c.BucketLookup)
	}
	tr, err := transfer.HTTPTransport(c.CAFile, c.Insecure)
	if err != nil {
		return nil, err
	}
	rt := c.Egress.Apply(tr)
	creds := credentials.NewStaticV4(c.AccessKey, c.SecretKey, "")
	if c.AccessKey == "" && c.SecretKey == "" {
		creds = credentials.New(&credentials.Static{}) // anonymous
	}
	mc, err := minio.New(u.Host, &minio.Options{
		Creds: creds, Secure: u.Scheme == "https", Region: c.Region, BucketLookup: lookup, Transport: rt,
		MaxRetries: 1, // diskpipe retries with its own policy and reasons
	})
	if err != nil {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "S3 client for %s: %w", c.Endpoint, err)
	}
	return &Client{Client: mc, endpoint: u, cfg: c, http: &http.Client{Transport: rt, Timeout: time.Minute, CheckRedirect: transfer.RedirectPolicy(nil)}}, nil
}

// WithKeys is a client of the same store signing with other keys (a scoped account's); it
// keeps c's tenant, for its errors.
func (c *Client) WithKeys(access, secret string) (*Client, error) {
	cfg := c.cfg
	cfg.AccessKey, cfg.SecretKey = access, secret
	n, err := NewClient(cfg)
	if err != nil {
		return nil, err
	}
	n.tenant = c.tenant
	return n, nil
}

// CheckBucketName says clearly why a bucket name is not valid for S3.
func CheckBucketName(bucket string) error {
	if err := s3utils.CheckValidBucketNameStrict(bucket); err != nil {
		return transfer.Permanent(transfer.ReasonInvalidArgument,
			"bucket name %q is not valid: %v (S3 bucket names are 3 to 63 lower-case letters, digits, dots or hyphens)", bucket, err)
	}
	return nil
}

// EnsureBucket creates the bucket unless it exists.
func (c *Client) EnsureBucket(ctx context.Context, bucket string) error {
	if err := CheckBucketName(bucket); err != nil {
		return err
	}
	exists, err := c.BucketExists(ctx, bucket)
	if err != nil {
		return c.Forbidden(err, transfer.ReasonTargetForbidden, "use", "bucket "+bucket)
	}
	if exists {
		return nil
	}
	if err := c.MakeBucket(ctx, bucket, minio.MakeBucketOptions{}); err != nil {
		if e := minio.ToErrorResponse(err); e.Code == "BucketAlreadyOwnedByYou" {
			return nil
		}
		return c.Forbidden(err, transfer.ReasonTargetForbidden, "create", "bucket "+bucket)
	}
	return nil
}

// PresignGet returns a URL that downloads the object with a plain HTTP GET until it expires.
func (c *Client) PresignGet(ctx context.Context, bucket, object string, expiry time.Duration) (*url.URL, error) {
	u, err := c.PresignedGetObject(ctx, bucket, object, expiry, nil)
	if err != nil {
		return nil, Classify(err, fmt.Sprintf("presigning s3://%s/%s", bucket, object))
	}
	return u, nil
}

// AbortUploads aborts the unfinished multipart uploads of bucket/object (an earlier writer's
// that failed) and returns their IDs.
func (c *Client) AbortUploads(ctx context.Context, bucket, object string) ([]string, error) {
	core := minio.Core{Client: c.Client}
	res, err := core.ListMultipartUploads(ctx, bucket, object, "", "", "", 1000)
	if err != nil {
		return nil, Classify(err, "listing the uploads of "+ObjectURL(bucket, object))
	}
	var ids []string
	for _, u := range res.Uploads {
		if u.Key != object {
			continue
		}
		err := core.AbortMultipartUpload(ctx, bucket, object, u.UploadID)
		if minio.ToErrorResponse(err).Code == "NoSuchUpload" {
			continue // it ended (completed or aborted) since it was listed
		}
		if err != nil {
			return ids, Classify(err, "aborting an earlier upload of "+ObjectURL(bucket, object))
		}
		ids = append(ids, u.UploadID)
	}
	return ids, nil
}

// ObjectURL is the s3:// URL of an object, for status and logs.
func ObjectURL(bucket, object string) string { return "s3://" + bucket + "/" + object }

// Classify turns an S3 or transport error into a transfer error with S3's error code kept in
// the message.
func Classify(err error, what string) error {
	var te *transfer.Error
	if errors.As(err, &te) || errors.Is(err, context.Canceled) {
		return err
	}
	e := minio.ToErrorResponse(err)
	if e.Code == "" {
		return transfer.Transient(transfer.ReasonSourceUnavailable, "%s: %w", what, err)
	}
	msg := fmt.Sprintf("%s: %s (%s)", what, e.Message, e.Code)
	switch e.Code {
	case "NoSuchBucket":
		return transfer.Permanent(transfer.ReasonSourceNotFound, "%s: bucket %q does not exist (%s)", what, e.BucketName, e.Code)
	case "NoSuchKey", "NotFound":
		return transfer.Permanent(transfer.ReasonSourceNotFound, "%s", msg)
	case "AccessDenied", "SignatureDoesNotMatch", "InvalidAccessKeyId", "AllAccessDisabled", "ExpiredToken":
		return transfer.Permanent(transfer.ReasonSourceForbidden, "%s", msg)
	case "InvalidBucketName", "InvalidArgument", "InvalidRange":
		return transfer.Permanent(transfer.ReasonInvalidArgument, "%s", msg)
	case "EntityTooLarge", "QuotaExceeded", "XMinioStorageFull", "StorageFull", "InsufficientStorage":
		return transfer.Permanent(transfer.ReasonTargetError, "%s", msg)
	}
	if e.StatusCode >= 500 || e.StatusCode == http.StatusTooManyRequests || e.Code == "SlowDown" {
		return transfer.Transient(transfer.ReasonSourceUnavailable, "%s", msg)
	}
	return transfer.Permanent(transfer.ReasonInvalidArgument, "%s", msg)
}

// ErrNoSuchObject is ReadObject's error for an object that is not there.
var ErrNoSuchObject = errors.New("no such object")

// ReadObject reads a small object (an index, a list of digests) whole, or its first max bytes:
// a reader that refuses larger ones asks for one byte more than it takes. An object that is not
// there is ErrNoSuchObject; other errors are the store's, for the caller to classify.
func (c *Client) ReadObject(ctx context.Context, bucket, key string, max int64) ([]byte, error) {
	obj, err := c.GetObject(ctx, bucket, key, minio.GetObjectOptions{})
	var b []byte
	if err == nil {
		defer obj.Close()
		if b, err = io.ReadAll(io.LimitReader(obj, max)); err == nil {
			return b, nil
		}
	}
	if minio.ToErrorResponse(err).Code == "NoSuchKey" {
		return nil, ErrNoSuchObject
	}
	return nil, err
}
