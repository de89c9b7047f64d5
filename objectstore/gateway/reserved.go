package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/versity/versitygw/backend"
	"github.com/versity/versitygw/s3err"

	"github.com/diskpipe/diskpipe/objectstore"
)

// Names a tenant cannot take first: objectstore/reserved.go says why; the store's side is here.

// reserved refuses reserved bucket names to every account but root.
type reserved struct {
	backend.Backend
	root string
}

func (r *reserved) CreateBucket(ctx context.Context, in *s3.CreateBucketInput, defaultACL []byte) error {
	if bucket := deref(in.Bucket); strings.HasPrefix(bucket, objectstore.ReservedPrefix) {
		var acl struct{ Owner string }
		if err := json.Unmarshal(defaultACL, &acl); err != nil || acl.Owner != r.root {
			return s3err.APIError{Code: "AccessDenied", HTTPStatusCode: http.StatusForbidden,
				Description: fmt.Sprintf("bucket names beginning with %q are reserved for diskpipe: choose another name for %s", objectstore.ReservedPrefix, bucket)}
		}
	}
	return r.Backend.CreateBucket(ctx, in, defaultACL)
}
