package uploadproxy

import (
	"context"
	"errors"
	"net/http"

	authenticationv1 "k8s.io/api/authentication/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/internal/authn"
)

// reviews asks the apiserver who bears a Kubernetes token, for the proxy's doors that take
// one (authn: kept a while, rate-limited across the proxy); its refusals are the proxy's.
type reviews struct{ *authn.Reviewer }

// The review rate and burst across the proxy.
const (
	reviewRate  = authn.DefaultRate
	reviewBurst = authn.DefaultBurst
)

func newReviews(kube client.Client, also authn.Authority) *reviews {
	r := &reviews{authn.New(kube, "the proxy")}
	r.Also = also
	return r
}

// user is the user bearer authenticates as, or an error that says why not (401), or that the
// proxy reviews no more tokens now (429: use an upload token).
func (v *reviews) user(ctx context.Context, bearer string) (authenticationv1.UserInfo, error) {
	u, err := v.User(ctx, bearer)
	if e := (*authn.Error)(nil); errors.As(err, &e) {
		msg := e.Message
		if e.Status == http.StatusTooManyRequests {
			msg += ", or use an upload token"
		}
		return u, Fail(e.Status, "%s", msg)
	}
	return u, err
}
