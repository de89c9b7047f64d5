package cdi_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/controllers/cdi"
	"github.com/diskpipe/diskpipe/controllers/internal/ctrltest"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/test/pki"
)

// TestImportProxy: a CDI user's CDIConfig spec.importProxy carries diskpipe's imports: the
// importer pods get the proxy, the cluster's own destinations besides the user's noProxy, and
// the CA of the trustedCAProxy ConfigMap in diskpipe's namespace (read with the chart's RBAC);
// the status repeats the spec, as CDI's does. Without it, the pods connect directly.
func TestImportProxy(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ca, err := pki.New(filepath.Join(t.TempDir(), "pki"), "proxy-ca")
	g.Expect(err).NotTo(HaveOccurred())
	pem, err := os.ReadFile(ca.CAFile)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(env.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "proxy-ca", Namespace: "diskpipe-system"},
		Data: map[string]string{cdi.ProxyCAKey: string(pem)}})).To(Succeed())

	config := &cdiv1.CDIConfig{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKey{Name: cdi.CDIConfigName}, config) }, 20*time.Second).Should(Succeed())
	proxy := &cdiv1.ImportProxy{HTTPProxy: ptr.To("http://proxy.corp:3128"), HTTPSProxy: ptr.To("http://proxy.corp:3128"),
		NoProxy: ptr.To("mirror.corp"), TrustedCAProxy: ptr.To("proxy-ca")}
	g.Expect(ctrltest.Update(ctx, env.Client, config, func() { config.Spec.ImportProxy = proxy })).To(Succeed())
	t.Cleanup(func() {
		_ = ctrltest.Update(ctx, env.Client, config, func() { config.Spec.ImportProxy = nil })
	})
	g.Eventually(func() *cdiv1.ImportProxy {
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(config), config)
		return config.Status.ImportProxy
	}, 20*time.Second).Should(Equal(proxy), "the status says the proxy, as CDI's does")

	ns, err := env.CreateNamespace(ctx, "dv-proxy")
	g.Expect(err).NotTo(HaveOccurred())
	envOf := func(pod *corev1.Pod) map[string]string {
		env := map[string]string{}
		for _, e := range pod.Spec.Containers[0].Env {
			env[e.Name] = e.Value
		}
		return env
	}
	g.Expect(env.Client.Create(ctx, dataVolume(ns, "proxied", &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://images.example.com/fedora.qcow2"}}, "1Gi"))).To(Succeed())
	podEnv := envOf(ctrltest.Pod(t, env, ns, "vmim-dv-proxied-probe-0"))
	g.Expect(podEnv).To(HaveKeyWithValue("HTTP_PROXY", "http://proxy.corp:3128"))
	g.Expect(podEnv).To(HaveKeyWithValue("HTTPS_PROXY", "http://proxy.corp:3128"))
	g.Expect(podEnv).To(HaveKeyWithValue("NO_PROXY", HavePrefix("mirror.corp,")))
	g.Expect(podEnv["NO_PROXY"]).To(ContainSubstring(".svc"), "what is inside the cluster is reached directly")
	g.Expect(podEnv).To(HaveKeyWithValue(transfer.ProxyCAEnv, string(pem)), "the pods trust the proxy's CA")

	// Without a proxy in the CDIConfig, the next pods connect directly.
	g.Expect(ctrltest.Update(ctx, env.Client, config, func() { config.Spec.ImportProxy = nil })).To(Succeed())
	g.Eventually(func() *cdiv1.ImportProxy {
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(config), config)
		return config.Status.ImportProxy
	}, 20*time.Second).Should(BeNil())
	g.Expect(env.Client.Create(ctx, dataVolume(ns, "direct", &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://images.example.com/fedora.qcow2"}}, "1Gi"))).To(Succeed())
	g.Expect(envOf(ctrltest.Pod(t, env, ns, "vmim-dv-direct-probe-0"))).To(BeEmpty())
}
