package manager_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/admission"
	cdipolicy "github.com/diskpipe/diskpipe/controllers/cdi/policy"
	"github.com/diskpipe/diskpipe/controllers/internal/ctrltest"
	"github.com/diskpipe/diskpipe/controllers/manager"
)

const (
	sharedNamespace = "diskpipe-system"
	sharedSecret    = "diskpipe-webhook-cert"
	// The upload proxy's certificate, issued by the same CA.
	sharedProxySecret = "diskpipe-uploadproxy-tls"
	sharedProxyHost   = "diskpipe-uploadproxy.diskpipe-system.svc"
)

// shared is one manager for the tests that need it running: with its metrics served and
// issuing its webhooks' certificate, as the chart runs it.
type shared struct {
	metricsAddr string
	port        int
	cfg         *admissionregistrationv1.ValidatingWebhookConfiguration
	webhook     *manager.WebhookOptions
	mgr         *ctrltest.Manager
}

var (
	sharedOnce    sync.Once
	sharedManager shared
)

func startShared(t *testing.T) *shared {
	t.Helper()
	sharedOnce.Do(func() {
		g := NewWithT(t)
		ctx := context.Background()
		h := &sharedManager
		g.Expect(env.EnsureNamespace(ctx, sharedNamespace)).To(Succeed())
		var err error
		h.port, err = strconv.Atoi(freeAddr(t)[len("127.0.0.1:"):])
		g.Expect(err).NotTo(HaveOccurred())
		// The chart's configuration, pointed at this process instead of a Service, without a CA.
		h.cfg = admission.Configuration(sharedNamespace, "diskpipe-manager", nil, cdipolicy.SourceKinds()...)
		h.cfg.Name = "diskpipe-test"
		for i, w := range h.cfg.Webhooks {
			h.cfg.Webhooks[i].ClientConfig = admissionregistrationv1.WebhookClientConfig{
				URL: ptr.To(fmt.Sprintf("https://127.0.0.1:%d%s", h.port, *w.ClientConfig.Service.Path))}
		}
		g.Expect(env.Client.Create(ctx, h.cfg)).To(Succeed())
		h.metricsAddr = freeAddr(t)
		h.webhook = &manager.WebhookOptions{Host: "127.0.0.1", Port: h.port, Configuration: h.cfg.Name,
			CertSecret: sharedSecret, Namespace: sharedNamespace, Hosts: []string{"127.0.0.1"}, CertSync: time.Second,
			Leaves: []admission.Leaf{{SecretName: sharedProxySecret, Hosts: []string{sharedProxyHost}}}}
		h.mgr, err = ctrltest.StartManager(env, manager.Options{Webhook: h.webhook, MetricsAddr: h.metricsAddr})
		g.Expect(err).NotTo(HaveOccurred())
	})
	if sharedManager.mgr == nil {
		t.Fatal("the shared manager did not start")
	}
	return &sharedManager
}

// TestWebhookCertificate runs the manager with the chart's default: it issues the webhooks'
// certificate itself. The apiserver then calls the webhooks over TLS with the caBundle the
// manager patched in, and keeps doing so after the certificate and then the CA are renewed.
func TestWebhookCertificate(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	h := startShared(t)
	port, cfg, opts := h.port, h.cfg, h.webhook
	const secretNS, secretName = sharedNamespace, sharedSecret

	// A user who may create disks in one namespace but not read images in another.
	vms, err := env.CreateNamespace(ctx, "certs")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(env.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "disks", Namespace: vms},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{diskvolume.GroupVersion.Group}, Resources: []string{"diskvolumes"}, Verbs: []string{"create"}}}})).To(Succeed())
	g.Expect(env.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "alice", Namespace: vms},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "disks"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "alice"}}})).To(Succeed())
	alice, err := env.User("alice")
	g.Expect(err).NotTo(HaveOccurred())
	// The webhook answers only when the apiserver trusts its certificate: the refusal is the
	// manager's own, and an administrator's disk (which it allows) is created.
	webhookWorks := func(attempt string) {
		t.Helper()
		d := &diskvolume.DiskVolume{ObjectMeta: metav1.ObjectMeta{GenerateName: "d-", Namespace: vms},
			Spec: diskvolume.DiskVolumeSpec{Source: diskvolume.DiskVolumeSource{Image: &diskvolume.ImageSource{
				Name: "secret-image", Namespace: "default", Kind: diskvolume.ImageKindVirtualMachineImage}}}}
		d.Spec.Resources.Requests.Storage = ctrltest.Quantity("1Gi")
		g.Eventually(func() string {
			err := alice.Create(ctx, d.DeepCopy())
			if err == nil {
				return "admitted"
			}
			return err.Error()
		}, 20*time.Second, 200*time.Millisecond).Should(ContainSubstring("alice may not copy the VirtualMachineImage default/secret-image"), attempt)
		g.Expect(env.Client.Create(ctx, d.DeepCopy())).To(Succeed(), attempt)
	}
	webhookWorks("first certificate")

	secret := &corev1.Secret{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: secretNS, Name: secretName}, secret)).To(Succeed())
	g.Expect(secret.Type).To(Equal(corev1.SecretTypeTLS))
	stored := func() *x509.Certificate {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(secret), secret)).To(Succeed())
		b, _ := pem.Decode(secret.Data["tls.crt"])
		c, err := x509.ParseCertificate(b.Bytes)
		g.Expect(err).NotTo(HaveOccurred())
		return c
	}
	served := func() *x509.Certificate {
		conn, err := tls.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reading what is served
		g.Expect(err).NotTo(HaveOccurred())
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0]
	}
	first := stored()
	g.Expect(served().SerialNumber).To(Equal(first.SerialNumber))
	g.Expect(first.NotAfter.Sub(first.NotBefore)).To(BeNumerically("~", admission.LeafLifetime, 2*time.Hour))
	bundle := func() []byte {
		got := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(cfg), got)).To(Succeed())
		return got.Webhooks[1].ClientConfig.CABundle
	}
	g.Expect(bundle()).To(Equal(secret.Data["ca.crt"]))

	// Eight months on (the certificate is made as if issued then), another replica's sync
	// renews it; this manager's own sync, every second here, picks it up and serves it.
	keeper := admission.CertKeeper{Client: env.Client, Reader: env.Client, Namespace: secretNS, SecretName: secretName,
		Configuration: cfg.Name, Hosts: opts.Hosts, Leaves: opts.Leaves}
	proxyCertVerifies(t, "first certificate")
	age(t, secret, "tls.crt", "ca.crt", "ca.key", admission.LeafLifetime*2/3+24*time.Hour)
	g.Expect(env.Client.Update(ctx, secret)).To(Succeed())
	g.Expect(keeper.Sync(ctx)).To(Succeed())
	renewed := stored()
	g.Expect(renewed.SerialNumber).NotTo(Equal(first.SerialNumber))
	g.Expect(renewed.NotBefore).To(BeTemporally("~", time.Now(), 2*time.Hour))
	g.Eventually(func() any { return served().SerialNumber }, 30*time.Second, 200*time.Millisecond).Should(Equal(renewed.SerialNumber))
	webhookWorks("renewed certificate")
	proxyCertVerifies(t, "renewed certificate")

	// Seven years on the CA is due: caBundle holds the new CA and the old one, which still
	// signs certificates in flight.
	age(t, secret, "ca.crt", "ca.crt", "ca.key", admission.CALifetime*2/3+24*time.Hour)
	g.Expect(env.Client.Update(ctx, secret)).To(Succeed())
	g.Expect(keeper.Sync(ctx)).To(Succeed())
	var cas int
	for rest := bundle(); ; cas++ {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
	}
	g.Expect(cas).To(Equal(2))
	g.Eventually(func() any { return served().SerialNumber }, 30*time.Second, 200*time.Millisecond).Should(Equal(stored().SerialNumber))
	webhookWorks("renewed CA")
	newCA, _ := pem.Decode(bundle())
	proxy := proxyCertVerifies(t, "renewed CA")
	g.Expect(proxy.CheckSignatureFrom(must(x509.ParseCertificate(newCA.Bytes)))).To(Succeed(), "the proxy's certificate is issued anew by the new CA")
}

// proxyCertVerifies checks the upload proxy's Secret as a client and the proxy see it: a
// kubernetes.io/tls Secret without the CA's key whose certificate, for the proxy's Service,
// verifies against its ca.crt, which is the webhooks' caBundle. It returns the certificate.
func proxyCertVerifies(t *testing.T, attempt string) *x509.Certificate {
	t.Helper()
	g := NewWithT(t)
	sec, webhook := &corev1.Secret{}, &corev1.Secret{}
	g.Expect(env.Client.Get(t.Context(), client.ObjectKey{Namespace: sharedNamespace, Name: sharedProxySecret}, sec)).To(Succeed(), attempt)
	g.Expect(env.Client.Get(t.Context(), client.ObjectKey{Namespace: sharedNamespace, Name: sharedSecret}, webhook)).To(Succeed(), attempt)
	g.Expect(sec.Type).To(Equal(corev1.SecretTypeTLS), attempt)
	g.Expect(sec.Data).To(HaveLen(3), attempt)
	g.Expect(sec.Data).To(HaveKey("tls.key"), attempt)
	g.Expect(sec.Data).NotTo(HaveKey("ca.key"), attempt)
	g.Expect(sec.Data["ca.crt"]).To(Equal(webhook.Data["ca.crt"]), attempt)
	pair, err := tls.X509KeyPair(sec.Data["tls.crt"], sec.Data["tls.key"])
	g.Expect(err).NotTo(HaveOccurred(), attempt)
	cert := must(x509.ParseCertificate(pair.Certificate[0]))
	roots := x509.NewCertPool()
	g.Expect(roots.AppendCertsFromPEM(sec.Data["ca.crt"])).To(BeTrue(), attempt)
	_, err = cert.Verify(x509.VerifyOptions{DNSName: sharedProxyHost, Roots: roots})
	g.Expect(err).NotTo(HaveOccurred(), attempt)
	_, err = cert.Verify(x509.VerifyOptions{DNSName: "diskpipe-manager.diskpipe-system.svc", Roots: roots})
	g.Expect(err).To(HaveOccurred(), "%s: the proxy's certificate names the proxy only", attempt)
	return cert
}

// age reissues the certificate under key of secret as if it had been issued ago, signed by
// the CA in caKey/caCertKey (itself for a CA).
func age(t *testing.T, secret *corev1.Secret, key, caCertKey, caKeyKey string, ago time.Duration) {
	t.Helper()
	block, _ := pem.Decode(secret.Data[key])
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	caBlock, _ := pem.Decode(secret.Data[caCertKey])
	ca, err := x509.ParseCertificate(caBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	keyBlock, _ := pem.Decode(secret.Data[caKeyKey])
	caKey, err := x509.ParseECPrivateKey(keyBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	life := cert.NotAfter.Sub(cert.NotBefore)
	cert.NotBefore = time.Now().Add(-ago)
	cert.NotAfter = cert.NotBefore.Add(life)
	parent := ca
	if key == caCertKey {
		parent = cert
	}
	der, err := x509.CreateCertificate(rand.Reader, cert, parent, cert.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	secret.Data[key] = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// must is v, failing the test's caller by panic on err (for values a test cannot go on without).
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestLeafFailureKeepsBundle: a leaf certificate that cannot be written (its Secret immutable
// here; held or refused in a cluster) is an error of the sync, but the webhooks' CA bundle is
// patched all the same: one component's Secret must not leave every webhook distrusting a
// renewed CA.
func TestLeafFailureKeepsBundle(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "leaf")
	g.Expect(err).NotTo(HaveOccurred())
	cfg := inertConfiguration(t, ns, "diskpipe-leaf-"+ns)
	held := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "held", Namespace: ns}, Immutable: ptr.To(true), Data: map[string][]byte{"other": []byte("x")}}
	g.Expect(env.Client.Create(ctx, held)).To(Succeed())
	keeper := admission.CertKeeper{Client: env.Client, Reader: env.Client, Namespace: ns, SecretName: "webhook-cert",
		Configuration: cfg.Name, Hosts: []string{"127.0.0.1"}, Leaves: []admission.Leaf{{SecretName: "held", Hosts: []string{"held.svc"}}}}
	g.Expect(keeper.Sync(ctx)).To(MatchError(ContainSubstring("held")))
	sec := &corev1.Secret{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "webhook-cert"}, sec)).To(Succeed())
	got := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(cfg), got)).To(Succeed())
	for _, w := range got.Webhooks {
		g.Expect(w.ClientConfig.CABundle).To(Equal(sec.Data["ca.crt"]), w.Name)
	}
}

// TestKubeSphereCABundle: the gateway's CA goes into KubeSphere's APIService and ReverseProxy
// (their CRDs as KubeSphere installs them) as ks-apiserver reads it: the field's bytes are
// base64 once more, decoded before use, so decoding twice gives the CA's PEM.
func TestKubeSphereCABundle(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	g.Expect(env.InstallKubeSphereCRDs()).To(Succeed())
	ns, err := env.CreateNamespace(ctx, "ks")
	g.Expect(err).NotTo(HaveOccurred())
	cfg := inertConfiguration(t, ns, "diskpipe-ks-"+ns)
	objs := map[string]string{
		"APIService": `{"apiVersion":"extensions.kubesphere.io/v1alpha1","kind":"APIService","metadata":{"name":"v1beta1.virtualization.kubesphere.io"},
			"spec":{"group":"virtualization.kubesphere.io","version":"v1beta1","url":"https://diskpipe-gateway.diskpipe-system.svc:443"}}`,
		"ReverseProxy": `{"apiVersion":"extensions.kubesphere.io/v1alpha1","kind":"ReverseProxy","metadata":{"name":"diskpipe"},
			"spec":{"matcher":{"path":"/proxy/diskpipe/*","method":"*"},"upstream":{"url":"https://diskpipe-gateway.diskpipe-system.svc:443"},"directives":{"stripPathPrefix":"/proxy/diskpipe"}}}`,
	}
	var named []admission.KubeSphereObject
	for kind, o := range objs {
		u := &unstructured.Unstructured{}
		g.Expect(json.Unmarshal([]byte(o), &u.Object)).To(Succeed())
		g.Expect(env.Client.Create(ctx, u)).To(Succeed())
		named = append(named, admission.KubeSphereObject{Kind: kind, Name: u.GetName()})
	}
	keeper := admission.CertKeeper{Client: env.Client, Reader: env.Client, Namespace: ns, SecretName: "webhook-cert",
		Configuration: cfg.Name, Hosts: []string{"127.0.0.1"}, KubeSphere: named}
	g.Expect(keeper.Sync(ctx)).To(Succeed())
	sec := &corev1.Secret{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "webhook-cert"}, sec)).To(Succeed())
	for _, o := range named {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("extensions.kubesphere.io/v1alpha1")
		u.SetKind(o.Kind)
		g.Expect(env.Client.Get(ctx, client.ObjectKey{Name: o.Name}, u)).To(Succeed())
		field, _, _ := unstructured.NestedString(u.Object, admission.KubeSphereKinds[o.Kind]...)
		once, err := base64.StdEncoding.DecodeString(field) // the []byte, as JSON holds it
		g.Expect(err).NotTo(HaveOccurred(), o.Kind)
		pemBytes, err := base64.StdEncoding.DecodeString(string(once)) // ks-apiserver's own decoding
		g.Expect(err).NotTo(HaveOccurred(), o.Kind)
		g.Expect(pemBytes).To(Equal(sec.Data["ca.crt"]), o.Kind)
	}
	// The spec the chart wrote stays as it was (the patch touches caBundle only).
	rp := &unstructured.Unstructured{}
	rp.SetAPIVersion("extensions.kubesphere.io/v1alpha1")
	rp.SetKind("ReverseProxy")
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Name: "diskpipe"}, rp)).To(Succeed())
	url, _, _ := unstructured.NestedString(rp.Object, "spec", "upstream", "url")
	g.Expect(url).To(Equal("https://diskpipe-gateway.diskpipe-system.svc:443"))
}

// inertConfiguration is a webhook configuration of the manager's webhooks, named name, that
// calls nothing: only its caBundle is kept.
func inertConfiguration(t *testing.T, ns, name string) *admissionregistrationv1.ValidatingWebhookConfiguration {
	t.Helper()
	cfg := admission.Configuration(ns, "diskpipe-manager", nil)
	cfg.Name = name
	for i := range cfg.Webhooks {
		cfg.Webhooks[i].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://127.0.0.1:1/none")}
		cfg.Webhooks[i].NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"no-such": "namespace"}}
	}
	NewWithT(t).Expect(env.Client.Create(t.Context(), cfg)).To(Succeed())
	return cfg
}
