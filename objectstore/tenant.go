package objectstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// # Tenants
//
// The bundled store has a boundary between namespaces: each namespace that uses it has an
// account of its own (role "userplus": it may make buckets, and owns the buckets it makes),
// and everything diskpipe does in the store for a namespace — reading an objectStore source,
// making an export's bucket, granting an exporter or a download URL one object — it does with
// that account's keys. So a namespace reaches its own buckets and those another namespace's
// owner shared with it (a statement naming its access key in the bucket's policy), and no
// other: the store, not diskpipe's code, refuses the rest. Users get the same keys in a Secret
// of their namespace, to upload with awscli. Only the manager and the store hold the root
// keys, with which the manager makes the accounts.

// TenantAccess is the access key of namespace ns's account.
func TenantAccess(ns string) string {
	sum := sha256.Sum256([]byte("diskpipe-namespace:" + ns))
	return "dpn" + hex.EncodeToString(sum[:])[:29]
}

// Tenant returns a client that acts as namespace ns, making its account if there is none.
// Its Scope and Unscope make and remove accounts through c (the root keys) and edit bucket
// policies as the namespace, which only a bucket's owner may.
func (c *Client) Tenant(ctx context.Context, ns string) (*Client, error) {
	if c.root != nil {
		return nil, errors.New("a tenant's client cannot act for another tenant")
	}
	if t, ok := c.tenants.Load(ns); ok && time.Since(t.(*tenantClient).made) < tenantTTL {
		return t.(*tenantClient).Client, nil
	}
	access := TenantAccess(ns)
	secret := accountSecret(c.cfg.SecretKey, access)
	if err := c.createAccount(ctx, access, secret, "userplus"); err != nil {
		return nil, fmt.Errorf("making namespace %s's account in the object store: %w", ns, err)
	}
	t, err := c.WithKeys(access, secret)
	if err != nil {
		return nil, err
	}
	t.root, t.tenant = c, ns
	c.tenants.Store(ns, &tenantClient{Client: t, made: time.Now()})
	return t, nil
}

// tenantTTL is how long a tenant's client is used before its account is made sure of again (a
// store that lost its data has lost the accounts too).
const tenantTTL = 10 * time.Minute

type tenantClient struct {
	*Client
	made time.Time
}

// Namespace returns a client that acts as namespace ns: its tenant's on the bundled store; on an
// external store in the bundled one's place, which has no accounts to make, c itself where the
// installation says it has a single tenant, else a permanent refusal of reason: the
// installation's keys reach every namespace's objects there.
func (c *Client) Namespace(ctx context.Context, ns string, reason transfer.Reason) (*Client, error) {
	if !c.cfg.Scoped {
		if !c.cfg.SingleTenant {
			return nil, transfer.Permanent(reason, "this installation's object store is an external one, whose keys reach every namespace's objects: "+
				"namespaces may not use it (exports, objectStore sources) unless the installation has a single tenant (the chart's objectStore.external.singleTenant); use s3 with keys of your own")
		}
		return c, nil
	}
	return c.Tenant(ctx, ns)
}

// Keys returns the client's access and secret keys (a tenant's, for its Secret).
func (c *Client) Keys() (access, secret string) { return c.cfg.AccessKey, c.cfg.SecretKey }

// CheckRead says whether the client may read bucket/object: nil, or a permanent
// SourceForbidden error that says the bucket is not the namespace's.
func (c *Client) CheckRead(ctx context.Context, bucket, object string) error {
	_, err := c.StatObject(ctx, bucket, object, minio.StatObjectOptions{})
	return c.Forbidden(err, transfer.ReasonSourceForbidden, "read", ObjectURL(bucket, object))
}

// Forbidden turns the store's refusal of a tenant's request into a permanent error of reason
// that names the namespace and what it may not do; other errors are classified as usual.
func (c *Client) Forbidden(err error, reason transfer.Reason, verb, what string) error {
	if err == nil {
		return nil
	}
	if e := minio.ToErrorResponse(err); c.tenant != "" && (e.Code == "AccessDenied" || e.StatusCode == 403) {
		return transfer.Permanent(reason, "namespace %s may not %s %s in the bundled object store: "+
			"the bucket belongs to another namespace, which can share it with this one in its bucket policy (principal %s)", c.tenant, verb, what, c.cfg.AccessKey)
	}
	return Classify(err, verb+" "+what)
}

// createAccount makes an account of the store, or sets the secret and role of the one that
// exists: its secret is derived from the root secret, which an administrator may have rotated.
func (c *Client) createAccount(ctx context.Context, access, secret, role string) error {
	body := fmt.Appendf(nil, "<Account><Access>%s</Access><Secret>%s</Secret><Role>%s</Role></Account>", access, secret, role)
	err := c.admin(ctx, "/create-user", nil, body)
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		return err
	}
	props := fmt.Appendf(nil, "<MutableProps><Secret>%s</Secret><Role>%s</Role></MutableProps>", secret, role)
	return c.admin(ctx, "/update-user", url.Values{"access": {access}}, props)
}
