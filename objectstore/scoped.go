package objectstore

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/signer"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// # Scoped credentials
//
// No pod gets the bundled store's root keys. A pod that writes one object (an exporter) gets
// an account of the store's own that may do nothing else: the manager creates it through the
// store's admin API (role "user": it owns no bucket and may create none) and lets it write
// that one object by a statement in the bucket's policy. Listing the bucket, reading or
// writing any other object, or making a bucket is refused; when the export ends the account
// and its statement are removed, and the keys stop working at once (the store keeps no cache
// of accounts).
//
// An account's keys are derived from the root secret and its name, so a manager that dies
// between creating the account and handing out its keys hands out the same keys again.

// ScopedActions are what a writer of one object may do: upload it in parts, list and abort
// its own parts, and tag it (the exporter tags the object with its sha256).
var ScopedActions = []string{"s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts", "s3:PutObjectTagging"}

// ScopedAccess is the access key of the account named id (e.g. an export's UID).
func ScopedAccess(id string) string {
	return "dpx" + strings.ReplaceAll(strings.ToLower(id), "-", "")
}

// ScopedSecret is the secret key of the account named id, derived from the root secret.
func ScopedSecret(rootSecret, id string) string { return accountSecret(rootSecret, ScopedAccess(id)) }

// accountSecret is the secret key of the account access, derived from the root secret.
func accountSecret(rootSecret, access string) string {
	mac := hmac.New(sha256.New, []byte(rootSecret))
	mac.Write([]byte("diskpipe-scoped-account:" + access))
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// policyMu serializes this process's read-modify-write of bucket policies.
var policyMu sync.Mutex

// Scope creates (or finds) the account named id, grants it actions on bucket/object and
// returns its keys. The bucket must exist; on a tenant's client (Tenant) it must be the
// tenant's own, since only a bucket's owner may change its policy.
func (c *Client) Scope(ctx context.Context, id, bucket, object string, actions []string) (access, secret string, err error) {
	root := c.rootClient()
	access, secret = ScopedAccess(id), ScopedSecret(root.cfg.SecretKey, id)
	if err := root.createAccount(ctx, access, secret, "user"); err != nil {
		return "", "", err
	}
	err = c.editPolicy(ctx, bucket, func(p *bucketPolicy) {
		p.remove(policySid(access))
		p.Statement = append(p.Statement, policyStatement{Sid: policySid(access), Effect: "Allow",
			Principal: awsPrincipal(access), Action: actions,
			Resource: []string{"arn:aws:s3:::" + bucket + "/" + object}})
	})
	return access, secret, err
}

// rootClient is the client with the root keys: c, or the one a tenant's client came from.
func (c *Client) rootClient() *Client {
	if c.root != nil {
		return c.root
	}
	return c
}

// Unscope removes the account named id and its statement in bucket's policy; either may be
// gone already.
func (c *Client) Unscope(ctx context.Context, id, bucket string) error {
	access := ScopedAccess(id)
	err := c.editPolicy(ctx, bucket, func(p *bucketPolicy) { p.remove(policySid(access)) })
	// A tenant that may not edit the bucket's policy cannot have granted anything in it.
	if err != nil && !isNoSuchBucket(err) && (c.tenant == "" || transfer.ReasonOf(err) != transfer.ReasonTargetForbidden) {
		return err
	}
	return c.deleteAccount(ctx, access)
}

// ScopedAccounts lists the accounts Scope made and Unscope has not removed yet.
func (c *Client) ScopedAccounts(ctx context.Context) ([]string, error) {
	accounts, err := c.accounts(ctx)
	var out []string
	for _, a := range accounts {
		if strings.HasPrefix(a.Access, "dpx") {
			out = append(out, a.Access)
		}
	}
	return out, err
}

func policySid(access string) string { return "diskpipe" + access }

// ownerSid is the statement that keeps a tenant's own access to its bucket in the policy.
const ownerSid = "diskpipeowner"

// bucketPolicy is a bucket's policy as diskpipe reads and writes it: what it does not edit
// (conditions, the Not- forms, the single-string forms) it keeps as it was written.
type bucketPolicy struct {
	Version   string            `json:"Version"`
	ID        string            `json:"Id,omitempty"`
	Statement []policyStatement `json:"Statement"`
}

type policyStatement struct {
	Sid          string          `json:"Sid,omitempty"`
	Effect       string          `json:"Effect"`
	Principal    *principal      `json:"Principal,omitempty"`
	NotPrincipal json.RawMessage `json:"NotPrincipal,omitempty"`
	Action       stringList      `json:"Action,omitempty"`
	NotAction    json.RawMessage `json:"NotAction,omitempty"`
	Resource     stringList      `json:"Resource,omitempty"`
	NotResource  json.RawMessage `json:"NotResource,omitempty"`
	Condition    json.RawMessage `json:"Condition,omitempty"`
}

// principal is a statement's Principal: "*" (anyone), or accounts by kind ("AWS").
type principal struct {
	Anyone bool
	ByKind map[string]stringList
}

func awsPrincipal(access ...string) *principal {
	return &principal{ByKind: map[string]stringList{"AWS": access}}
}

func (p *principal) UnmarshalJSON(b []byte) error {
	if string(b) == `"*"` {
		p.Anyone = true
		return nil
	}
	return json.Unmarshal(b, &p.ByKind)
}

func (p principal) MarshalJSON() ([]byte, error) {
	if p.Anyone {
		return []byte(`"*"`), nil
	}
	return json.Marshal(p.ByKind)
}

// stringList is a policy's list of strings, which may be written as one string.
type stringList []string

func (l *stringList) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		*l = stringList{one}
		return nil
	}
	return json.Unmarshal(b, (*[]string)(l))
}

func (p *bucketPolicy) remove(sid string) {
	p.Statement = slices.DeleteFunc(p.Statement, func(s policyStatement) bool { return s.Sid == sid })
}

// editPolicy reads bucket's policy, lets edit change it, and writes it back (deleting it when
// no statement is left).
func (c *Client) editPolicy(ctx context.Context, bucket string, edit func(*bucketPolicy)) error {
	policyMu.Lock()
	defer policyMu.Unlock()
	cur, err := c.GetBucketPolicy(ctx, bucket)
	if err != nil && minio.ToErrorResponse(err).Code != "NoSuchBucketPolicy" {
		return c.Forbidden(err, transfer.ReasonTargetForbidden, "read the policy of", "bucket "+bucket)
	}
	p := &bucketPolicy{Version: "2012-10-17"}
	if cur != "" {
		if err := json.Unmarshal([]byte(cur), p); err != nil {
			return transfer.Permanent(transfer.ReasonInvalidArgument,
				"the policy of bucket %s is not one diskpipe can edit (%v): remove it or use spec.s3 with your own store", bucket, err)
		}
	}
	before, err := json.Marshal(p)
	if err != nil {
		return err
	}
	edit(p)
	if c.tenant != "" && len(p.Statement) > 0 {
		// The store applies a bucket's policy to its owner too: without a statement of its own
		// the namespace would lock itself out of its bucket.
		p.remove(ownerSid)
		p.Statement = append([]policyStatement{{Sid: ownerSid, Effect: "Allow", Principal: awsPrincipal(c.cfg.AccessKey),
			Action: []string{"s3:*"}, Resource: []string{"arn:aws:s3:::" + bucket, "arn:aws:s3:::" + bucket + "/*"}}}, p.Statement...)
		if len(p.Statement) == 1 {
			p.Statement = nil
		}
	}
	after, err := json.Marshal(p)
	if err != nil {
		return err
	}
	if string(after) == string(before) {
		return nil // nothing changed: the policy is left as it was written
	}
	doc := ""
	if len(p.Statement) > 0 {
		doc = string(after)
	}
	if err := c.SetBucketPolicy(ctx, bucket, doc); err != nil {
		return c.Forbidden(err, transfer.ReasonTargetForbidden, "write the policy of", "bucket "+bucket)
	}
	return nil
}

func isNoSuchBucket(err error) bool { return strings.Contains(err.Error(), "NoSuchBucket") }

// admin sends a request signed with the root keys to the store's admin API.
func (c *Client) admin(ctx context.Context, path string, query url.Values, body []byte) error {
	_, err := c.adminBody(ctx, path, query, body)
	return err
}

// adminBody is admin that returns the answer's body.
func (c *Client) adminBody(ctx context.Context, path string, query url.Values, body []byte) ([]byte, error) {
	u := *c.endpoint
	u.Path, u.RawQuery = path, query.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	req.Header.Set("X-Amz-Content-Sha256", hex.EncodeToString(sum[:]))
	region := c.cfg.Region
	if region == "" {
		region = "us-east-1"
	}
	req = signer.SignV4(*req, c.cfg.AccessKey, c.cfg.SecretKey, "", region)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, transfer.Transient(transfer.ReasonSourceUnavailable, "the object store's admin API: %w", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if resp.StatusCode >= 300 {
		return nil, fmt.Errorf("the object store's admin API %s: %s: %s", path, resp.Status, strings.TrimSpace(string(msg)))
	}
	return msg, nil
}
