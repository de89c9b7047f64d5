package uploadproxy

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// AuthenticationConfigMap is where kube-apiserver publishes how it authenticates itself to
// aggregated APIs (its front-proxy, --requestheader-* flags), readable with the built-in Role
// extension-apiserver-authentication-reader.
var AuthenticationConfigMap = client.ObjectKey{Namespace: "kube-system", Name: "extension-apiserver-authentication"}

// FrontProxy authenticates the requests kube-apiserver forwards to an aggregated API: the
// apiserver has authenticated the user (with any credential kind), and forwards the request
// over TLS with its front-proxy client certificate, naming the user in request headers. The
// headers are believed only from a connection whose client certificate was issued by the
// requestheader CA, to one of the allowed names: anything else that reaches the port is
// unauthenticated, whatever headers or body it sends.
type FrontProxy struct {
	// Reader reads AuthenticationConfigMap.
	Reader client.Reader
	// Every is how long what was read is used before it is read again (default a minute), so
	// a rotated front-proxy CA is learnt without a restart.
	Every time.Duration

	mu     sync.Mutex
	read   time.Time
	config *requestHeader
}

// requestHeader is the apiserver's front-proxy configuration.
type requestHeader struct {
	roots        *x509.CertPool
	allowedNames []string
	userHeaders  []string
	groupHeaders []string
	extraPrefix  []string
}

// errNotForwarded is the refusal of every request that did not come from the apiserver.
var errNotForwarded = errors.New("only requests forwarded by kube-apiserver are served here: ask the apiserver " +
	"(kubectl diskpipe upload, or kubectl create -f on an UploadTokenRequest)")

// Authenticate returns the user the apiserver forwarded r for: a *httpError 401 when r did
// not come from the apiserver's front-proxy, 500 when the apiserver's configuration cannot be
// read.
func (f *FrontProxy) Authenticate(ctx context.Context, r *http.Request) (authenticationv1.UserInfo, error) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return authenticationv1.UserInfo{}, Fail(http.StatusUnauthorized, "%v (no client certificate)", errNotForwarded)
	}
	cfg, err := f.load(ctx)
	if err != nil {
		return authenticationv1.UserInfo{}, err
	}
	certs := r.TLS.PeerCertificates
	intermediates := x509.NewCertPool()
	for _, c := range certs[1:] {
		intermediates.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: cfg.roots, Intermediates: intermediates,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return authenticationv1.UserInfo{}, Fail(http.StatusUnauthorized, "%v (the client certificate is not the apiserver's front-proxy certificate: %v)", errNotForwarded, err)
	}
	if len(cfg.allowedNames) > 0 && !slices.Contains(cfg.allowedNames, certs[0].Subject.CommonName) {
		return authenticationv1.UserInfo{}, Fail(http.StatusUnauthorized, "%v (client certificate %q is not one of the apiserver's --requestheader-allowed-names)", errNotForwarded, certs[0].Subject.CommonName)
	}
	return cfg.user(r.Header)
}

// user reads who the apiserver says the user is.
func (c *requestHeader) user(h http.Header) (authenticationv1.UserInfo, error) {
	u := authenticationv1.UserInfo{}
	for _, name := range c.userHeaders {
		if v := h.Get(name); v != "" {
			u.Username = v
			break
		}
	}
	if u.Username == "" {
		return u, Fail(http.StatusUnauthorized, "the apiserver forwarded the request without a user")
	}
	for _, name := range c.groupHeaders {
		u.Groups = append(u.Groups, h.Values(name)...)
	}
	for name, values := range h {
		for _, prefix := range c.extraPrefix {
			if len(name) > len(prefix) && strings.EqualFold(name[:len(prefix)], prefix) {
				// Keys are lower case and percent-encoded in the header's name.
				key, err := url.PathUnescape(strings.ToLower(name[len(prefix):]))
				if err != nil {
					continue
				}
				if u.Extra == nil {
					u.Extra = map[string]authenticationv1.ExtraValue{}
				}
				u.Extra[key] = append(u.Extra[key], values...)
			}
		}
	}
	return u, nil
}

// load returns the apiserver's front-proxy configuration, read at most every f.Every.
func (f *FrontProxy) load(ctx context.Context) (*requestHeader, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	every := f.Every
	if every == 0 {
		every = time.Minute
	}
	if f.config != nil && time.Since(f.read) < every {
		return f.config, nil
	}
	cm := &corev1.ConfigMap{}
	if err := f.Reader.Get(ctx, AuthenticationConfigMap, cm); err != nil {
		return nil, fmt.Errorf("reading the apiserver's front-proxy configuration (ConfigMap %s): %w", AuthenticationConfigMap, err)
	}
	cfg, err := parseRequestHeader(cm.Data)
	if err != nil {
		return nil, fmt.Errorf("the apiserver's front-proxy configuration (ConfigMap %s): %w", AuthenticationConfigMap, err)
	}
	f.config, f.read = cfg, time.Now()
	return cfg, nil
}

func parseRequestHeader(data map[string]string) (*requestHeader, error) {
	ca := data["requestheader-client-ca-file"]
	if ca == "" {
		return nil, errors.New("it has no requestheader-client-ca-file: kube-apiserver runs without --requestheader-client-ca-file " +
			"and --proxy-client-cert-file, so it cannot forward requests to aggregated APIs")
	}
	c := &requestHeader{roots: x509.NewCertPool()}
	if !c.roots.AppendCertsFromPEM([]byte(ca)) {
		return nil, errors.New("its requestheader-client-ca-file holds no certificate")
	}
	for key, into := range map[string]*[]string{"requestheader-allowed-names": &c.allowedNames,
		"requestheader-username-headers": &c.userHeaders, "requestheader-group-headers": &c.groupHeaders,
		"requestheader-extra-headers-prefix": &c.extraPrefix} {
		if v := data[key]; v != "" {
			if err := json.Unmarshal([]byte(v), into); err != nil {
				return nil, fmt.Errorf("%s: %w", key, err)
			}
		}
	}
	if len(c.userHeaders) == 0 {
		return nil, errors.New("it names no requestheader-username-headers")
	}
	return c, nil
}
