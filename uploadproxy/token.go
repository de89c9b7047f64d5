package uploadproxy

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Upload tokens are what the manager's webhook issues for an UploadTokenRequest, and what
// the proxy accepts besides Kubernetes bearer tokens: the claims below, signed with
// HMAC-SHA256 under a key only the manager and the proxy can read (a Secret of the release
// namespace). A token names one image by namespace, resource, name and UID, so it uploads to
// nothing else, not even a later image of the same name; it is accepted for a new request
// until it expires (TokenLifetime); a request begun in time runs to its end.

// TokenPrefix starts every upload token, so the proxy tells it from a Kubernetes token.
const TokenPrefix = "dpu1."

// HeaderToken carries an upload token. Authorization: Bearer works too, but the apiserver's
// service proxy removes Authorization, so the plugin uses this header.
const HeaderToken = "Diskpipe-Upload-Token"

// TokenLifetime is how long an upload token is accepted for a new request.
const TokenLifetime = 5 * time.Minute

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

// IssueToken signs c with key.
func IssueToken(key []byte, c Claims) (string, error) {
	payload, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	p := base64.RawURLEncoding.EncodeToString(payload)
	return TokenPrefix + p + "." + base64.RawURLEncoding.EncodeToString(sign(key, p)), nil
}

func sign(key []byte, payload string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(TokenPrefix + payload))
	return m.Sum(nil)
}

// errBadToken is a token the proxy does not accept; the reason is for the caller.
var errBadToken = errors.New("the upload token is not valid")

// VerifyToken checks token's signature under key and its expiry at now, and returns its claims.
func VerifyToken(key []byte, token string, now time.Time) (Claims, error) {
	var c Claims
	rest, ok := strings.CutPrefix(token, TokenPrefix)
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

// TokenKey is the signing key, kept in a Secret: the manager makes it (Ensure), the proxy
// reads it (Get).
type TokenKey struct {
	Client          client.Client
	Namespace, Name string

	mu      sync.Mutex
	key     []byte
	fetched time.Time
}

const tokenKeyField = "key"

// Ensure returns the key, making the Secret with a random one if there is none.
func (k *TokenKey) Ensure(ctx context.Context) ([]byte, error) {
	if key, err := k.Get(ctx); err == nil || !apierrors.IsNotFound(err) {
		return key, err
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name,
		Labels: map[string]string{"app.kubernetes.io/part-of": "diskpipe"}},
		Data: map[string][]byte{tokenKeyField: key}}
	if err := k.Client.Create(ctx, sec); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("making the upload token key %s/%s: %w", k.Namespace, k.Name, err)
	}
	k.mu.Lock()
	k.key = nil // another replica may have won the race: read what is stored
	k.mu.Unlock()
	return k.Get(ctx)
}

// Get returns the key, read again at most once a minute.
func (k *TokenKey) Get(ctx context.Context) ([]byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.key != nil && time.Since(k.fetched) < time.Minute {
		return k.key, nil
	}
	sec := &corev1.Secret{}
	if err := k.Client.Get(ctx, client.ObjectKey{Namespace: k.Namespace, Name: k.Name}, sec); err != nil {
		return nil, err
	}
	key := sec.Data[tokenKeyField]
	if len(key) < 32 {
		return nil, fmt.Errorf("the upload token key %s/%s holds %d bytes under %q, fewer than 32", k.Namespace, k.Name, len(key), tokenKeyField)
	}
	k.key, k.fetched = key, time.Now()
	return key, nil
}
