package objectstore

import (
	"context"
	"net/url"
)

// SetAccountSecret sets the secret of the account access, as the store's admin API does, for
// tests of accounts whose secret went stale.
func (c *Client) SetAccountSecret(ctx context.Context, access, secret, role string) error {
	return c.admin(ctx, "/update-user", url.Values{"access": {access}},
		[]byte("<MutableProps><Secret>"+secret+"</Secret><Role>"+role+"</Role></MutableProps>"))
}

// ChangeBucketOwner gives bucket to the account access, as the store's admin API does.
func (c *Client) ChangeBucketOwner(ctx context.Context, bucket, access string) error {
	return c.admin(ctx, "/change-bucket-owner", url.Values{"bucket": {bucket}, "owner": {access}}, nil)
}

// LegacyTenantAccess is the access key a namespace's account had before UIDs.
var LegacyTenantAccess = legacyTenantAccess

// CreateAccount makes an account as the store's admin API does.
func (c *Client) CreateAccount(ctx context.Context, access, secret, role string) error {
	return c.createAccount(ctx, access, secret, role)
}
