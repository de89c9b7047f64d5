package gateway

import (
	"context"
	"errors"
	"net/http"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// callerKey keys the caller in a request's context.
type callerKey struct{}

// withCaller is ctx acting as user.
func withCaller(ctx context.Context, user authenticationv1.UserInfo) context.Context {
	return context.WithValue(ctx, callerKey{}, user)
}

// callerOf is the user ctx acts as, or false.
func callerOf(ctx context.Context) (authenticationv1.UserInfo, bool) {
	u, ok := ctx.Value(callerKey{}).(authenticationv1.UserInfo)
	return u, ok && u.Username != ""
}

// errNoCaller refuses a request to the apiserver that acts for nobody.
var errNoCaller = errors.New("gateway: a request to the apiserver that acts for no caller is refused: the gateway acts only as its callers")

// impersonating sends each request to the apiserver as the caller of its context, with the
// caller's user, UID, groups and extra, and refuses a request with none.
type impersonating struct{ next http.RoundTripper }

func (t impersonating) RoundTrip(req *http.Request) (*http.Response, error) {
	u, ok := callerOf(req.Context())
	if !ok {
		return nil, errNoCaller
	}
	for h := range req.Header {
		if strings.HasPrefix(http.CanonicalHeaderKey(h), "Impersonate-") {
			return nil, errors.New("gateway: a request that already impersonates is refused")
		}
	}
	extra := map[string][]string{}
	for k, v := range u.Extra {
		extra[k] = v
	}
	return transport.NewImpersonatingRoundTripper(transport.ImpersonationConfig{
		UserName: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra}, t.next).RoundTrip(req)
}

// callerClient is a client that acts, for each request, as the caller in its context: the
// gateway's rights (cfg's) are spent on nothing but carrying the request.
func callerClient(cfg *rest.Config, opts client.Options) (client.WithWatch, error) {
	cfg = rest.CopyConfig(cfg)
	if cfg.Impersonate.UserName != "" {
		return nil, errors.New("gateway: its own configuration impersonates already")
	}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return impersonating{next: rt} })
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	opts.HTTPClient = hc
	return client.NewWithWatch(cfg, opts)
}
