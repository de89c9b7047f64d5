// Package uploadtoken issues and verifies upload tokens: the manager's token API (diskpipe's
// UploadTokenRequest and CDI's) issues them, the upload proxy verifies them.
package uploadtoken

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/internal/secretkey"
)

// Upload tokens are what the manager's webhook issues for an UploadTokenRequest, and what
// the proxy accepts besides Kubernetes bearer tokens: the claims below, signed with
// HMAC-SHA256 under a key only the manager and the proxy can read (a Secret of the release
// namespace). A token names one image by namespace, resource, name and UID, so it uploads to
// nothing else, not even a later image of the same name; it is accepted for a new request
// until it expires (Lifetime); a request begun in time runs to its end.

// Prefix starts every upload token, so the proxy tells it from a Kubernetes token.
const Prefix = "dpu1."

// Header carries an upload token. Authorization: Bearer works too, but the apiserver's
// service proxy removes Authorization, so the plugin uses this header.
const Header = "Diskpipe-Upload-Token"

// Lifetime is how long an upload token is accepted for a new request.
const Lifetime = 5 * time.Minute

// Claims are what a token says.
type Claims struct {
	Namespace string `json:"ns"`
	Resource  string `json:"res"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	// User is who asked for it, for the proxy's log.
	User    string `json:"user"`
	Expires int64  `json:"exp"`
}

// Issue signs c with key.
func Issue(key []byte, c Claims) (string, error) {
	payload, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	p := base64.RawURLEncoding.EncodeToString(payload)
	return Prefix + p + "." + base64.RawURLEncoding.EncodeToString(sign(key, p)), nil
}

func sign(key []byte, payload string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(Prefix + payload))
	return m.Sum(nil)
}

// errBadToken is a token the proxy does not accept; the reason is for the caller.
var errBadToken = errors.New("the upload token is not valid")

// Verify checks token's signature under key and its expiry at now, and returns its claims.
func Verify(key []byte, token string, now time.Time) (Claims, error) {
	var c Claims
	rest, ok := strings.CutPrefix(token, Prefix)
	p, sig, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 {
		return c, fmt.Errorf("%w: it is not an upload token", errBadToken)
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, sign(key, p)) {
		return c, fmt.Errorf("%w: its signature does not match (was it issued by another installation?)", errBadToken)
	}
	payload, err := base64.RawURLEncoding.DecodeString(p)
	if err != nil || json.Unmarshal(payload, &c) != nil {
		return c, fmt.Errorf("%w: its claims do not parse", errBadToken)
	}
	if now.Unix() >= c.Expires {
		return c, fmt.Errorf("%w: it expired at %s; ask for a new one", errBadToken, time.Unix(c.Expires, 0).UTC().Format(time.RFC3339))
	}
	return c, nil
}

// Key is the signing key, kept in a Secret: the manager makes it (Ensure), the proxy
// reads it (Get).
type Key struct {
	Client          client.Client
	Namespace, Name string

	mu      sync.Mutex
	key     []byte
	fetched time.Time
}

// Ensure returns the key, making the Secret with a random one if there is none.
func (k *Key) Ensure(ctx context.Context) ([]byte, error) {
	if key, err := k.Get(ctx); err == nil || !apierrors.IsNotFound(err) {
		return key, err
	}
	if _, err := secretkey.Ensure(ctx, k.Client, types.NamespacedName{Namespace: k.Namespace, Name: k.Name}, "the upload token key"); err != nil {
		return nil, err
	}
	k.mu.Lock()
	k.key = nil // another replica may have won the race: read what is stored
	k.mu.Unlock()
	return k.Get(ctx)
}

// IssueFor signs c for lifetime (0: Lifetime) from now, under the key it makes if need be,
// and returns the token and when it expires.
func (k *Key) IssueFor(ctx context.Context, c Claims, lifetime time.Duration) (string, time.Time, error) {
	key, err := k.Ensure(ctx)
	if err != nil {
		return "", time.Time{}, err
	}
	if lifetime == 0 {
		lifetime = Lifetime
	}
	expires := time.Now().Add(lifetime).Truncate(time.Second)
	c.Expires = expires.Unix()
	token, err := Issue(key, c)
	return token, expires, err
}

// Get returns the key, read again at most once a minute.
func (k *Key) Get(ctx context.Context) ([]byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.key != nil && time.Since(k.fetched) < time.Minute {
		return k.key, nil
	}
	sec := &corev1.Secret{}
	if err := k.Client.Get(ctx, client.ObjectKey{Namespace: k.Namespace, Name: k.Name}, sec); err != nil {
		return nil, err
	}
	key := sec.Data[secretkey.Field]
	if len(key) < 32 {
		return nil, fmt.Errorf("the upload token key %s/%s holds %d bytes under %q, fewer than 32", k.Namespace, k.Name, len(key), secretkey.Field)
	}
	k.key, k.fetched = key, time.Now()
	return key, nil
}
