package uploadproxy_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/diskpipe/diskpipe/test/pki"
	"github.com/diskpipe/diskpipe/uploadproxy"
)

// TestFrontProxy: the user named in the request headers is believed only from a client
// certificate of the apiserver's requestheader CA, to one of its allowed names; every other
// request is refused with the reason, whatever headers it sends.
func TestFrontProxy(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.New(filepath.Join(dir, "front-proxy"), "front-proxy-ca")
	if err != nil {
		t.Fatal(err)
	}
	attacker, err := pki.New(filepath.Join(dir, "attacker"), "front-proxy-ca")
	if err != nil {
		t.Fatal(err)
	}
	pair := func(a *pki.Authority, name, cn string) *tls.Certificate {
		crt, key, err := a.Issue(name, cn, nil)
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.LoadX509KeyPair(crt, key)
		if err != nil {
			t.Fatal(err)
		}
		return &c
	}
	caPEM, err := os.ReadFile(ca.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	list := func(v ...string) string { b, _ := json.Marshal(v); return string(b) }
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "extension-apiserver-authentication"},
		Data: map[string]string{"requestheader-client-ca-file": string(caPEM), "requestheader-allowed-names": list("front-proxy-client"),
			"requestheader-username-headers": list("X-Remote-User"), "requestheader-group-headers": list("X-Remote-Group"),
			"requestheader-extra-headers-prefix": list("X-Remote-Extra-")}}
	auth := &uploadproxy.FrontProxy{Reader: fake.NewClientBuilder().WithObjects(cm).Build()}

	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, err := auth.Authenticate(r.Context(), r)
		if err != nil {
			http.Error(w, err.Error(), uploadproxy.StatusOf(err))
			return
		}
		_ = json.NewEncoder(w).Encode(u)
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	for _, tc := range []struct {
		name string
		cert *tls.Certificate
		want authenticationv1.UserInfo
		code int
		msg  string
	}{
		{name: "the apiserver's certificate", cert: pair(ca, "front-proxy-client", "front-proxy-client"), code: http.StatusOK,
			want: authenticationv1.UserInfo{Username: "alice", Groups: []string{"team-a", "system:authenticated"},
				Extra: map[string]authenticationv1.ExtraValue{"scopes.example.com/x": {"1"}}}},
		{name: "no client certificate", code: http.StatusUnauthorized, msg: "(no client certificate)"},
		{name: "a certificate of another CA, of the allowed name", cert: pair(attacker, "forged", "front-proxy-client"),
			code: http.StatusUnauthorized, msg: "is not the apiserver's front-proxy certificate"},
		{name: "a certificate of the CA, of another name", cert: pair(ca, "other", "some-client"),
			code: http.StatusUnauthorized, msg: `client certificate "some-client" is not one of the apiserver's --requestheader-allowed-names`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			pool := x509.NewCertPool()
			pool.AddCert(srv.Certificate())
			c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool,
				GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
					if tc.cert == nil {
						return &tls.Certificate{}, nil
					}
					return tc.cert, nil
				}}}}
			req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
			req.Header.Set("X-Remote-User", "alice")
			req.Header.Add("X-Remote-Group", "team-a")
			req.Header.Add("X-Remote-Group", "system:authenticated")
			req.Header.Set("X-Remote-Extra-Scopes.example.com%2fx", "1")
			resp, err := c.Do(req)
			g.Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			g.Expect(resp.StatusCode).To(Equal(tc.code))
			if tc.code != http.StatusOK {
				body := make([]byte, 4096)
				n, _ := resp.Body.Read(body)
				g.Expect(string(body[:n])).To(And(ContainSubstring("only requests forwarded by kube-apiserver are served here"), ContainSubstring(tc.msg)))
				return
			}
			var got authenticationv1.UserInfo
			g.Expect(json.NewDecoder(resp.Body).Decode(&got)).To(Succeed())
			g.Expect(got).To(Equal(tc.want))
		})
	}

	t.Run("an apiserver without a front-proxy", func(t *testing.T) {
		bare := cm.DeepCopy()
		delete(bare.Data, "requestheader-client-ca-file")
		a := &uploadproxy.FrontProxy{Reader: fake.NewClientBuilder().WithObjects(bare).Build()}
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{srv.Certificate()}}
		_, err := a.Authenticate(t.Context(), req)
		NewWithT(t).Expect(err).To(MatchError(ContainSubstring("kube-apiserver runs without --requestheader-client-ca-file")))
	})
}
