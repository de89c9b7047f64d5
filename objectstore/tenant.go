package objectstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
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

// TenantAccess is the access key of the account of the namespace whose UID is uid: a namespace
// made again under a name that was used before is another tenant, with another account.
func TenantAccess(uid string) string {
	return "dpn" + strings.ReplaceAll(strings.ToLower(uid), "-", "")
}

// legacyTenantAccess is the access key a namespace's account had before accounts were keyed by
// UID (a function of its name): SweepTenants moves such accounts to TenantAccess.
func legacyTenantAccess(ns string) string {
	sum := sha256.Sum256([]byte("diskpipe-namespace:" + ns))
	return "dpn" + hex.EncodeToString(sum[:])[:29]
}

// NamespaceUIDs answers the UID of namespace ns as it is now (the manager asks the apiserver,
// not a cache, so that a namespace made again under its name is not taken for the old one).
type NamespaceUIDs func(ctx context.Context, ns string) (string, error)

// ResolveNamespaces sets how c learns namespaces' UIDs; Tenant needs it.
func (c *Client) ResolveNamespaces(uids NamespaceUIDs) { c.uids = uids }

// Tenant returns a client that acts as namespace ns, making its account if there is none.
// Its Scope and Unscope make and remove accounts through c (the root keys) and edit bucket
// policies as the namespace, which only a bucket's owner may.
func (c *Client) Tenant(ctx context.Context, ns string) (*Client, error) {
	if c.root != nil {
		return nil, errors.New("a tenant's client cannot act for another tenant")
	}
	if c.uids == nil {
		return nil, errors.New("the object store's client cannot tell namespaces apart: it was given no way to learn their UIDs")
	}
	uid, err := c.uids(ctx, ns)
	if err != nil {
		return nil, fmt.Errorf("namespace %s: %w", ns, err)
	}
	if t, ok := c.tenants.Load(uid); ok && time.Since(t.(*tenantClient).made) < tenantTTL {
		return t.(*tenantClient).Client, nil
	}
	access := TenantAccess(uid)
	secret := accountSecret(c.cfg.SecretKey, access)
	if err := c.createAccount(ctx, access, secret, "userplus"); err != nil {
		return nil, fmt.Errorf("making namespace %s's account in the object store: %w", ns, err)
	}
	// Its buckets of before accounts were keyed by UID come with it; what cannot is the
	// sweep's to report.
	if err := c.moveLegacyOf(ctx, ns, access); err != nil {
		return nil, fmt.Errorf("moving namespace %s's account of before to the one of its UID: %w", ns, err)
	}
	t, err := c.WithKeys(access, secret)
	if err != nil {
		return nil, err
	}
	t.root, t.tenant = c, ns
	c.tenants.Store(uid, &tenantClient{Client: t, made: time.Now()})
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

// # Accounts of namespaces that are gone
//
// A namespace's account is keyed by its UID, so a namespace made again under an old name
// starts with nothing. What the old one left is dealt with by SweepTenants, which the manager
// runs now and then with the namespaces that exist:
//
//   - the account of a namespace that is gone is removed, and the statements of bucket
//     policies that name it with it; if it still owns buckets, it is kept for them but its
//     secret is replaced by one nobody knows and its role made "user", so that its keys stop
//     working and nothing is lost: an administrator moves or deletes the buckets (admin API,
//     list-buckets and change-bucket-owner, with the root keys);
//   - an account of the form before UIDs (legacyTenantAccess) of a namespace that exists is
//     moved to the namespace's account (moveLegacy, which Tenant does too, so that a namespace
//     never acts without its buckets): bucket policies name the new account where they named
//     the old, then its buckets change owner. A bucket whose policy diskpipe cannot read stays
//     the old account's, which is kept until it is moved too.

// Sweep is what SweepTenants did, by account.
type Sweep struct {
	// Moved are the namespaces whose account of the old form was moved since the last sweep,
	// by this one or by Tenant, with their new key.
	Moved map[string]string
	// Stuck are the buckets of old accounts that could not be moved, with why.
	Stuck map[string]error
	// Disabled are the accounts of gone namespaces that still own buckets, by bucket.
	Disabled map[string][]string
	// Removed are the accounts of gone namespaces that were removed.
	Removed []string
}

// SweepTenants removes or disables the accounts of namespaces that are not among those
// namespaces lists (UID → name) and moves those namespaces' accounts of the old form; see
// above. The namespaces are listed after the accounts: an account is made only for a
// namespace that exists, so one the store had before the list is of a namespace in it, or gone.
func (c *Client) SweepTenants(ctx context.Context, namespaces func(context.Context) (map[string]string, error)) (Sweep, error) {
	done := Sweep{Moved: map[string]string{}, Stuck: map[string]error{}, Disabled: map[string][]string{}}
	c.moved.Range(func(ns, access any) bool {
		done.Moved[ns.(string)] = access.(string)
		c.moved.Delete(ns)
		return true
	})
	accounts, err := c.accounts(ctx)
	if err != nil {
		return done, err
	}
	live, err := namespaces(ctx)
	if err != nil {
		return done, err
	}
	if len(live) == 0 {
		// A cluster has namespaces of its own (default, kube-system): an empty list is a
		// wrong answer, not a reason to remove every account.
		return done, errors.New("no namespaces were listed: the store's accounts are left as they are")
	}
	current := map[string]bool{}  // the keys of live namespaces
	legacy := map[string]string{} // old key → live namespace's UID
	for uid, ns := range live {
		current[TenantAccess(uid)] = true
		legacy[legacyTenantAccess(ns)] = uid
	}
	buckets, err := c.bucketOwners(ctx)
	if err != nil {
		return done, err
	}
	owned := map[string][]string{}
	for bucket, owner := range buckets {
		owned[owner] = append(owned[owner], bucket)
	}
	moves := map[string]legacyMove{} // old key → its namespace and new key
	gone := map[string]string{}      // accounts to drop from policies, then remove
	for _, a := range accounts {
		switch {
		case !strings.HasPrefix(a.Access, "dpn") || current[a.Access]:
		case legacy[a.Access] != "":
			uid := legacy[a.Access]
			access := TenantAccess(uid)
			if err := c.createAccount(ctx, access, accountSecret(c.cfg.SecretKey, access), "userplus"); err != nil {
				return done, err
			}
			moves[a.Access] = legacyMove{ns: live[uid], access: access}
		case len(owned[a.Access]) > 0:
			// The account of a namespace that is gone, which still owns buckets.
			if a.Role != "user" {
				if err := c.createAccount(ctx, a.Access, rand.Text(), "user"); err != nil {
					return done, err
				}
			}
			done.Disabled[a.Access] = owned[a.Access]
		default:
			gone[a.Access] = ""
		}
	}
	// One pass over every bucket's policy renames the moved accounts and drops the gone ones.
	rename := maps.Clone(gone)
	for old, m := range moves {
		rename[old] = m.access
	}
	// A policy diskpipe cannot read keeps naming a gone account; the store ignores it then.
	failed := c.renamePrincipals(ctx, slices.Collect(maps.Keys(buckets)), rename)
	stuck, err := c.moveLegacy(ctx, moves, buckets, failed)
	maps.Copy(done.Stuck, stuck)
	if err != nil {
		return done, err
	}
	for _, m := range moves {
		if _, ok := c.moved.LoadAndDelete(m.ns); ok { // moved, and reported now
			done.Moved[m.ns] = m.access
		}
	}
	for access := range gone {
		if err := c.deleteAccount(ctx, access); err != nil {
			return done, err
		}
		done.Removed = append(done.Removed, access)
	}
	return done, nil
}

// legacyMove is an account of the old form to move: its namespace and the key of its UID.
type legacyMove struct{ ns, access string }

// stuckFor counts the buckets of old among stuck.
func stuckFor(stuck map[string]error, buckets map[string]string, old string) int {
	n := 0
	for bucket := range stuck {
		if buckets[bucket] == old {
			n++
		}
	}
	return n
}

// moveLegacy moves the accounts of the old form in moves to their new ones (which exist),
// once renamePrincipals has made bucket policies name the new accounts (failed: the buckets
// where it could not): each bucket of an old account whose policy was rewritten changes
// owner, and an old account is removed once it owns none. buckets are the store's. It returns
// the buckets it could not move, with why.
func (c *Client) moveLegacy(ctx context.Context, moves map[string]legacyMove, buckets map[string]string, failed map[string]error) (map[string]error, error) {
	stuck := map[string]error{}
	for bucket, owner := range buckets {
		m, ok := moves[owner]
		if !ok {
			continue
		}
		if err := failed[bucket]; err != nil {
			// Its owner would be shut out by a policy that does not name it.
			stuck[bucket] = fmt.Errorf("bucket %s of namespace %s stays with its account of before (%s): its policy could not be rewritten: %w", bucket, m.ns, owner, err)
			continue
		}
		if err := c.admin(ctx, "/change-bucket-owner", url.Values{"bucket": {bucket}, "owner": {m.access}}, nil); err != nil {
			return stuck, fmt.Errorf("moving bucket %s to namespace %s's account: %w", bucket, m.ns, err)
		}
	}
	for old, m := range moves {
		if stuckFor(stuck, buckets, old) > 0 {
			continue
		}
		if err := c.deleteAccount(ctx, old); err != nil {
			return stuck, err
		}
		c.moved.Store(m.ns, m.access)
	}
	return stuck, nil
}

// moveLegacyOf moves namespace ns's account of the old form, if the store has one, to the
// account access (its UID's, which exists); for Tenant, on a namespace's first use.
func (c *Client) moveLegacyOf(ctx context.Context, ns, access string) error {
	old := legacyTenantAccess(ns)
	accounts, err := c.accounts(ctx)
	if err != nil || !slices.ContainsFunc(accounts, func(a account) bool { return a.Access == old }) {
		return err
	}
	buckets, err := c.bucketOwners(ctx)
	if err != nil {
		return err
	}
	failed := c.renamePrincipals(ctx, slices.Collect(maps.Keys(buckets)), map[string]string{old: access})
	_, err = c.moveLegacy(ctx, map[string]legacyMove{old: {ns: ns, access: access}}, buckets, failed)
	return err
}

// renamePrincipals rewrites, in the policy of each of buckets, the accounts named in rename:
// to their new key, or out of the policy ("": a statement left with no one goes). Everything
// else of a policy is kept as it was written. It returns the buckets whose policy it could not
// rewrite, with why.
func (c *Client) renamePrincipals(ctx context.Context, buckets []string, rename map[string]string) map[string]error {
	failed := map[string]error{}
	for _, bucket := range buckets {
		err := c.editPolicy(ctx, bucket, func(p *bucketPolicy) {
			kept := p.Statement[:0]
			for _, s := range p.Statement {
				if s.Principal != nil && !s.Principal.Anyone && s.Principal.ByKind["AWS"] != nil {
					aws := slices.Clone(s.Principal.ByKind["AWS"])
					for i, who := range aws {
						if to, ok := rename[who]; ok {
							aws[i] = to
						}
					}
					aws = slices.DeleteFunc(aws, func(who string) bool { return who == "" })
					if len(aws) == 0 && len(s.Principal.ByKind) == 1 {
						continue // it named no one else
					}
					s.Principal = &principal{ByKind: maps.Clone(s.Principal.ByKind)}
					s.Principal.ByKind["AWS"] = aws
				}
				kept = append(kept, s)
			}
			p.Statement = kept
		})
		if err != nil && !isNoSuchBucket(err) {
			failed[bucket] = err
		}
	}
	return failed
}

// account is an account of the store as its admin API lists it.
type account struct {
	Access string `xml:"Access"`
	Role   string `xml:"Role"`
}

// accounts lists the store's accounts.
func (c *Client) accounts(ctx context.Context) ([]account, error) {
	body, err := c.rootClient().adminBody(ctx, "/list-users", nil, nil)
	if err != nil {
		return nil, err
	}
	var res struct {
		Accounts []account `xml:"Accounts"`
	}
	if err := xml.Unmarshal(body, &res); err != nil {
		return nil, fmt.Errorf("the object store's account list: %w", err)
	}
	return res.Accounts, nil
}

// deleteAccount removes the account access; it may be gone already.
func (c *Client) deleteAccount(ctx context.Context, access string) error {
	err := c.rootClient().admin(ctx, "/delete-user", url.Values{"access": {access}}, nil)
	if err != nil && !strings.Contains(err.Error(), "not found") && !strings.Contains(err.Error(), "NoSuchUser") {
		return err
	}
	return nil
}

// bucketOwners lists every bucket of the store with the access key of its owner.
func (c *Client) bucketOwners(ctx context.Context) (map[string]string, error) {
	body, err := c.rootClient().adminBody(ctx, "/list-buckets", nil, nil)
	if err != nil {
		return nil, err
	}
	var res struct {
		Buckets []struct{ Name, Owner string }
	}
	if err := xml.Unmarshal(body, &res); err != nil {
		return nil, fmt.Errorf("the object store's list of buckets: %w", err)
	}
	owners := make(map[string]string, len(res.Buckets))
	for _, b := range res.Buckets {
		if !strings.HasPrefix(b.Name, ".") && b.Name != "lost+found" { // not the store's own directories (.diskpipe-iam)
			owners[b.Name] = b.Owner
		}
	}
	return owners, nil
}
