// Package authn asks the apiserver who bears a Kubernetes token, for the servers of diskpipe
// that take one (the upload proxy, the console's gateway). Anyone may send `Authorization:
// Bearer x`, and each such request would cost the apiserver a TokenReview: so answers are kept
// for a while, keyed by the token's hash (a client that sends many requests asks once), and
// reviews the cache does not answer are rate-limited across the server; a request over the
// rate is refused with 429.
package authn

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"
	authenticationv1 "k8s.io/api/authentication/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Defaults of the review cache and rate.
const (
	DefaultTTL   = 10 * time.Second
	DefaultKept  = 4096
	DefaultRate  = 20 // TokenReviews a second, across the server
	DefaultBurst = 40
)

// Error is a refusal of a token: its HTTP status (401, 429) and why.
type Error struct {
	Status  int
	Message string
}

func (e *Error) Error() string { return e.Message }

// Authority reviews the tokens the apiserver does not know: another issuer's (KubeSphere's,
// gateway.KubeSphereTokens). ok says the token is one of its users'; err that it could not
// be asked.
type Authority interface {
	Review(ctx context.Context, token string) (user authenticationv1.UserInfo, ok bool, err error)
}

// Reviewer reviews bearer tokens with the apiserver, keeping answers and bounding the rate.
type Reviewer struct {
	// Also, when set, is asked of the tokens the apiserver does not authenticate.
	Also Authority

	kube    client.Client
	what    string // the server, for messages ("the proxy")
	limiter *rate.Limiter
	ttl     time.Duration
	max     int

	mu     sync.Mutex
	byHash map[[32]byte]review
}

// review is one answer: the user, or why the token is not one.
type review struct {
	user  authenticationv1.UserInfo
	err   error
	until time.Time
}

// New is a Reviewer with the defaults, asking through kube (the server's own client, which
// may create TokenReviews); what names the server in messages.
func New(kube client.Client, what string) *Reviewer {
	return &Reviewer{kube: kube, what: what, limiter: rate.NewLimiter(DefaultRate, DefaultBurst), ttl: DefaultTTL, max: DefaultKept,
		byHash: map[[32]byte]review{}}
}

// User is the user bearer authenticates as, or an *Error that says why not (401), or that the
// server reviews no more tokens now (429); any other error is the apiserver's, not kept.
func (v *Reviewer) User(ctx context.Context, bearer string) (authenticationv1.UserInfo, error) {
	key := sha256.Sum256([]byte(bearer))
	now := time.Now()
	v.mu.Lock()
	if r, ok := v.byHash[key]; ok && now.Before(r.until) {
		v.mu.Unlock()
		return r.user, r.err
	}
	v.mu.Unlock()
	if !v.limiter.Allow() {
		return authenticationv1.UserInfo{}, &Error{http.StatusTooManyRequests,
			fmt.Sprintf("too many Kubernetes tokens to review at once (%d a second across %s): try again", DefaultRate, v.what)}
	}
	tr := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: bearer}}
	if err := v.kube.Create(ctx, tr); err != nil {
		return authenticationv1.UserInfo{}, fmt.Errorf("reviewing the token: %w", err) // not kept: the apiserver may answer next time
	}
	r := review{user: tr.Status.User, until: now.Add(v.ttl)}
	if !tr.Status.Authenticated && v.Also != nil {
		user, ok, err := v.Also.Review(ctx, bearer)
		if err != nil {
			return authenticationv1.UserInfo{}, fmt.Errorf("reviewing the token: %w", err) // not kept either
		}
		if ok {
			tr.Status.Authenticated, r.user = true, user
		}
	}
	if !tr.Status.Authenticated {
		r.err = &Error{http.StatusUnauthorized, "the token is not valid: " + tr.Status.Error}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.byHash) >= v.max { // full: drop what expired, then any, down to half
		for k, old := range v.byHash {
			if now.After(old.until) {
				delete(v.byHash, k)
			}
		}
		for k := range v.byHash {
			if len(v.byHash) < v.max/2 {
				break
			}
			delete(v.byHash, k)
		}
	}
	v.byHash[key] = r
	return r.user, r.err
}
