package authn

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
)

// KubeSphere reviews KubeSphere's own tokens (the JWTs ks-apiserver issues its users,
// which it forwards unchanged to an extension's APIService, and which the Kubernetes
// apiserver does not know) with ks-apiserver's token review, POST /oauth/authenticate. A user
// it vouches for is impersonated under their KubeSphere name: KubeSphere writes its project
// roles as Kubernetes RoleBindings to that name (kind User), so Kubernetes' RBAC decides, as
// for any caller. The gateway never trusts ks-apiserver's X-Remote-User headers, which any
// client that reaches the gateway could send. The upload proxy takes them so too, for the
// console's uploads.
type KubeSphere struct {
	// URL is ks-apiserver's (http://ks-apiserver.kubesphere-system.svc).
	URL    string
	Client *http.Client
}

// kubesphereName is what a KubeSphere user's name is (KubeSphere's own rule); any other name
// it vouched for — above all system:… or one with a colon, which name Kubernetes' own
// users, groups and service accounts — is refused rather than impersonated.
var kubesphereName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,62}[a-z0-9])?$`)

// Review asks ks-apiserver who bears token.
func (k *KubeSphere) Review(ctx context.Context, token string) (authenticationv1.UserInfo, bool, error) {
	body, err := json.Marshal(map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": map[string]string{"token": token}})
	if err != nil {
		return authenticationv1.UserInfo{}, false, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(k.URL, "/")+"/oauth/authenticate", bytes.NewReader(body))
	if err != nil {
		return authenticationv1.UserInfo{}, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := k.Client.Do(req)
	if err != nil {
		return authenticationv1.UserInfo{}, false, fmt.Errorf("asking KubeSphere: %w", err)
	}
	defer resp.Body.Close()
	var tr struct {
		Status struct {
			Authenticated bool `json:"authenticated"`
			User          struct {
				Username string `json:"username"`
			} `json:"user"`
		} `json:"status"`
	}
	switch {
	case resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusUnauthorized:
		return authenticationv1.UserInfo{}, false, nil // ks-apiserver's answer to a token it did not issue, or one expired
	case resp.StatusCode != http.StatusOK:
		return authenticationv1.UserInfo{}, false, fmt.Errorf("KubeSphere's token review answered %s", resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&tr); err != nil {
		return authenticationv1.UserInfo{}, false, fmt.Errorf("KubeSphere's token review: %w", err)
	}
	name := tr.Status.User.Username
	if !tr.Status.Authenticated {
		return authenticationv1.UserInfo{}, false, nil
	}
	if !kubesphereName.MatchString(name) {
		return authenticationv1.UserInfo{}, false, &Error{Status: http.StatusUnauthorized,
			Message: fmt.Sprintf("KubeSphere vouches for the user %q, a name the gateway does not act as: a KubeSphere user's name is lowercase letters, digits, '-' and '.', and any other (system:…, or one with a colon) would name a Kubernetes user, group or service account", name)}
	}
	return authenticationv1.UserInfo{Username: name, Groups: []string{"system:authenticated"}}, true, nil
}

// TokenClient is a client of the server at url (named by the flag flagName), to which a server
// sends its callers' tokens: its certificate verified with the CA in caFile (none: the
// system's), plain HTTP refused unless allowed, and no redirect followed (the token would go
// wherever it points).
func TokenClient(flagName, url, caFile string, allowHTTP bool) (*http.Client, error) {
	if !strings.HasPrefix(url, "https://") && (!allowHTTP || !strings.HasPrefix(url, "http://")) {
		return nil, fmt.Errorf("%s %q: it is sent callers' tokens, so it must be https:// (or http:// with %s-allow-http)", flagName, url, strings.TrimSuffix(flagName, "-url"))
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s holds no PEM certificate", caFile)
		}
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	}
	return &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error {
		return fmt.Errorf("%s answered with a redirect, which is not followed with callers' tokens", url)
	}}, nil
}
