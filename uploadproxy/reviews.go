package uploadproxy

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

// reviews asks the apiserver who bears a Kubernetes token, for the proxy's doors that take
// one. Anyone may send `Authorization: Bearer x`, and each such request would cost the
// apiserver a TokenReview: so answers are kept for reviewTTL, keyed by the token's hash (a
// client uploading a disk in parts asks once, not once a part), and reviews the cache does not
// answer are rate-limited across the proxy; a request over the rate gets 429.
type reviews struct {
	kube    client.Client
	limiter *rate.Limiter
	ttl     time.Duration
	max     int

	mu     sync.Mutex
	byHash map[[32]byte]tokenReview
}

// tokenReview is one answer: the user, or why the token is not one.
type tokenReview struct {
	user  authenticationv1.UserInfo
	err   error
	until time.Time
}

// Defaults of the review cache and rate.
const (
	reviewTTL     = 10 * time.Second
	reviewsCached = 4096
	reviewRate    = 20 // TokenReviews a second, across the proxy
	reviewBurst   = 40
)

func newReviews(kube client.Client) *reviews {
	return &reviews{kube: kube, limiter: rate.NewLimiter(reviewRate, reviewBurst), ttl: reviewTTL, max: reviewsCached,
		byHash: map[[32]byte]tokenReview{}}
}

// user is the user bearer authenticates as, or an error that says why not (401), or that the
// proxy reviews no more tokens now (429).
func (v *reviews) user(ctx context.Context, bearer string) (authenticationv1.UserInfo, error) {
	key := sha256.Sum256([]byte(bearer))
	now := time.Now()
	v.mu.Lock()
	if r, ok := v.byHash[key]; ok && now.Before(r.until) {
		v.mu.Unlock()
		return r.user, r.err
	}
	v.mu.Unlock()
	if !v.limiter.Allow() {
		return authenticationv1.UserInfo{}, Fail(http.StatusTooManyRequests,
			"too many Kubernetes tokens to review at once (%d a second across the proxy): try again, or use an upload token", reviewRate)
	}
	tr := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: bearer}}
	if err := v.kube.Create(ctx, tr); err != nil {
		return authenticationv1.UserInfo{}, fmt.Errorf("reviewing the token: %w", err) // not kept: the apiserver may answer next time
	}
	r := tokenReview{user: tr.Status.User, until: now.Add(v.ttl)}
	if !tr.Status.Authenticated {
		r.err = Fail(http.StatusUnauthorized, "the token is not valid: %s", tr.Status.Error)
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
