package objectstore

import (
	"context"
	"strings"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// # Names a tenant cannot take first
//
// Bucket names are global to the store, and the first to make one owns it. The buckets
// diskpipe makes for itself (the upload proxy's) begin with ReservedPrefix, which only the
// store's root account may use: a namespace's account that asks for such a bucket is refused,
// so no tenant can make one before diskpipe does and read what others upload to it. Those
// who use a bucket check its owner too (OwnedBy, BucketOwner): diskpipe's own must be root's,
// an export's the namespace's own.

// ReservedPrefix begins the names of the buckets only diskpipe makes.
const ReservedPrefix = "diskpipe-"

// BucketOwner is the access key of the account that owns bucket ("" when there is no such
// bucket), asked of the store's admin API with the root keys (a tenant's client asks through
// the root client that made it).
func (c *Client) BucketOwner(ctx context.Context, bucket string) (string, error) {
	owners, err := c.bucketOwners(ctx)
	return owners[bucket], err
}

// CheckOwnBucket refuses, with a permanent error of reason, a bucket of the bundled store that
// exists and belongs to another account than the client's: one a tenant made first under a name diskpipe uses, or
// another namespace's that shares it. A writer that took such a bucket for its own would
// put its data where the bucket's owner reads it.
func (c *Client) CheckOwnBucket(ctx context.Context, bucket string, reason transfer.Reason) error {
	if !c.cfg.Scoped {
		return nil // an external store: no tenant makes buckets in it through diskpipe, and it has no admin API to ask
	}
	if at, ok := c.ownBuckets.Load(bucket); ok && time.Since(at.(time.Time)) < tenantTTL {
		return nil // asked lately: the admin API lists every bucket of the store
	}
	owner, err := c.BucketOwner(ctx, bucket)
	if owner == c.cfg.AccessKey {
		c.ownBuckets.Store(bucket, time.Now())
	}
	if err != nil || owner == "" || owner == c.cfg.AccessKey {
		return err
	}
	who := "another account of the store"
	if strings.HasPrefix(owner, "dpn") {
		who = "another namespace"
	}
	if c.tenant != "" {
		return transfer.Permanent(reason, "bucket %s belongs to %s (%s), not to namespace %s: diskpipe writes only to buckets the namespace owns; choose another name",
			bucket, who, owner, c.tenant)
	}
	return transfer.Permanent(reason, "bucket %s belongs to %s (%s), not to the store's root account, which diskpipe's own buckets must: "+
		"someone made it before diskpipe did; delete it (its objects are theirs) or give it to root with the store's admin API (change-bucket-owner)", bucket, who, owner)
}
