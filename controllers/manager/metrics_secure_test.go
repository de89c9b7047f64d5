package manager_test

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/diskpipe/diskpipe/controllers/manager"
)

// TestSecureMetrics: with MetricsSecure (the chart's default) the manager's metrics, which
// name objects of every namespace, are served over HTTPS only to a bearer of a token that may
// get /metrics: no token is 401, a service account without the right is 403, one bound to a
// role like the chart's metrics reader reads them.
func TestSecureMetrics(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	opts := manager.Options{MetricsAddr: freeAddr(t), MetricsSecure: true, ProbeAddr: "0", SkipNameValidation: true}
	mgr, err := manager.New(env.Config, opts)
	g.Expect(err).NotTo(HaveOccurred())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the manager stopped with %v", err)
		}
	}()

	ns, err := env.CreateNamespace(ctx, "metrics")
	g.Expect(err).NotTo(HaveOccurred())
	tokenOf := func(name string) string {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
		g.Expect(env.Client.Create(ctx, sa)).To(Succeed())
		tr := &authenticationv1.TokenRequest{}
		g.Expect(env.Client.SubResource("token").Create(ctx, sa, tr)).To(Succeed())
		return tr.Status.Token
	}
	reader, stranger := tokenOf("prometheus"), tokenOf("stranger")
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ns + "-metrics-reader"},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}
	g.Expect(env.Client.Create(ctx, role)).To(Succeed())
	g.Expect(env.Client.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: ns + "-metrics-reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "prometheus", Namespace: ns}}})).To(Succeed())

	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed
	scrape := func(token string) (int, string, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+opts.MetricsAddr+"/metrics", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	g.Eventually(func() (string, error) {
		_, body, err := scrape(reader)
		return body, err
	}, 30*time.Second, 200*time.Millisecond).Should(ContainSubstring("controller_runtime_"))
	for who, want := range map[string]int{"": http.StatusUnauthorized, stranger: http.StatusForbidden} {
		code, body, err := scrape(who)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(code).To(Equal(want), body)
		g.Expect(body).NotTo(ContainSubstring("diskpipe_"))
	}
	// Plain HTTP gets nothing either.
	_, body, _ := get("http://" + opts.MetricsAddr + "/metrics")
	g.Expect(body).NotTo(ContainSubstring("controller_runtime_"))
}
