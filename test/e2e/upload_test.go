package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/internal/uploadtoken"
	"github.com/diskpipe/diskpipe/test/testenv"
	"github.com/diskpipe/diskpipe/uploadproxy"
)

// uploaders makes, in ns, a service account allowed to upload images ("uploader") and one
// allowed only to read them ("viewer").
func uploaders(ns string) {
	GinkgoHelper()
	kubectl(`apiVersion: v1
kind: ServiceAccount
metadata: {name: uploader}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: viewer}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: uploader}
rules:
- apiGroups: [hypercloud.tmaxanc.com]
  resources: [virtualmachineimages]
  verbs: [get, list, watch, create]
- apiGroups: [hypercloud.tmaxanc.com]
  resources: [virtualmachineimages/upload]
  verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: viewer}
rules:
- apiGroups: [hypercloud.tmaxanc.com]
  resources: [virtualmachineimages]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: uploader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: uploader}
subjects: [{kind: ServiceAccount, name: uploader}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: viewer}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: viewer}
subjects: [{kind: ServiceAccount, name: viewer}]
`, "apply", "-n", ns, "-f", "-")
}

// saToken is a token of service account ns/name from the TokenRequest API.
func saToken(ns, name string) string {
	GinkgoHelper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	Expect(cluster.APIClient().SubResource("token").Create(context.Background(), sa, tr)).To(Succeed())
	return tr.Status.Token
}

// kubeconfigWith writes a kubeconfig of the cluster's apiserver for the user auth, in ns.
func kubeconfigWith(file, ns string, auth *clientcmdapi.AuthInfo) string {
	GinkgoHelper()
	cfg, err := clientcmd.LoadFromFile(cluster.KubeconfigFile())
	Expect(err).NotTo(HaveOccurred())
	current := cfg.Contexts[cfg.CurrentContext]
	Expect(current).NotTo(BeNil())
	out := clientcmdapi.NewConfig()
	out.Clusters["c"] = cfg.Clusters[current.Cluster]
	out.AuthInfos["u"] = auth
	out.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u", Namespace: ns}
	out.CurrentContext = "c"
	path := filepath.Join(work, file)
	Expect(clientcmd.WriteToFile(*out, path)).To(Succeed())
	return path
}

// execKubeconfig is a kubeconfig whose credential comes from an exec plugin, as cloud
// providers' (gke-gcloud-auth-plugin, aws eks get-token) do: a script printing an
// ExecCredential with the service account's token.
func execKubeconfig(ns, sa string) string {
	GinkgoHelper()
	script := filepath.Join(work, "credential-"+ns+"-"+sa)
	Expect(os.WriteFile(script, fmt.Appendf(nil, "#!/bin/sh\nprintf '%%s' '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"%s\"}}'\n",
		saToken(ns, sa)), 0o700)).To(Succeed())
	return kubeconfigWith("kubeconfig-exec-"+ns, ns, &clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{
		APIVersion: "client.authentication.k8s.io/v1", Command: script, InteractiveMode: clientcmdapi.NeverExecInteractiveMode}})
}

// randomDisk writes a raw disk of size random bytes: every part of an upload differs.
func randomDisk(name string, size int) string {
	GinkgoHelper()
	b := make([]byte, size)
	_, _ = rand.Read(b)
	path := filepath.Join(work, name)
	Expect(os.WriteFile(path, b, 0o600)).To(Succeed())
	return path
}

// flakyProxy stands between the plugin and the upload proxy as a load balancer or an ingress
// would: it cuts the connection of an upload once when the upload reaches each offset in
// cuts, can slow the body to rate bytes a second, and counts the body bytes it forwarded.
type flakyProxy struct {
	url       string
	mu        sync.Mutex
	cuts      []int64
	rate      int64
	forwarded atomic.Int64
}

func newFlakyProxy(cuts []int64, rate int64) *flakyProxy {
	GinkgoHelper()
	target, err := url.Parse(cluster.UploadURL())
	Expect(err).NotTo(HaveOccurred())
	p := &flakyProxy{cuts: cuts, rate: rate}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = cluster.UploadClient().Transport
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPut {
			rp.ServeHTTP(w, r)
			return
		}
		var start int64
		_, _ = fmt.Sscanf(r.Header.Get("Content-Range"), "bytes %d-", &start)
		body := &cutBody{r: r.Body, p: p, at: start}
		r.Body = body
		rp.ServeHTTP(&muted{ResponseWriter: w, mute: &body.cut}, r)
		if body.cut {
			panic(http.ErrAbortHandler) // the client sees its connection drop
		}
	}))
	DeferCleanup(srv.Close)
	p.url = srv.URL
	return p
}

// cutBody is an upload's body through the flaky proxy.
type cutBody struct {
	r   io.ReadCloser
	p   *flakyProxy
	at  int64
	cut bool
}

func (b *cutBody) Read(buf []byte) (int, error) {
	b.p.mu.Lock()
	limit := int64(len(buf))
	for i, c := range b.p.cuts {
		if c >= b.at && c < b.at+limit {
			if c == b.at {
				b.p.cuts = append(b.p.cuts[:i], b.p.cuts[i+1:]...)
				b.cut = true
				b.p.mu.Unlock()
				return 0, io.ErrUnexpectedEOF
			}
			limit = c - b.at
			break
		}
	}
	b.p.mu.Unlock()
	if b.p.rate > 0 {
		limit = min(limit, b.p.rate/20)
		time.Sleep(50 * time.Millisecond)
	}
	n, err := b.r.Read(buf[:limit])
	b.at += int64(n)
	b.p.forwarded.Add(int64(n))
	return n, err
}

func (b *cutBody) Close() error { return b.r.Close() }

// muted drops the reverse proxy's answer to a cut request.
type muted struct {
	http.ResponseWriter
	mute *bool
}

func (m *muted) WriteHeader(code int) {
	if !*m.mute {
		m.ResponseWriter.WriteHeader(code)
	}
}

func (m *muted) Write(b []byte) (int, error) {
	if *m.mute {
		return len(b), nil
	}
	return m.ResponseWriter.Write(b)
}

// tokenAPIAddress is where the manager serves the upload token API, as its APIService says:
// an ExternalName Service (the local cluster) or a Service's cluster IP (the real node).
func tokenAPIAddress() string {
	GinkgoHelper()
	api := &unstructured.Unstructured{}
	api.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIService"})
	Expect(cluster.APIClient().Get(context.Background(), client.ObjectKey{Name: uploadproxy.TokenAPIService}, api)).To(Succeed())
	ns, _, _ := unstructured.NestedString(api.Object, "spec", "service", "namespace")
	name, _, _ := unstructured.NestedString(api.Object, "spec", "service", "name")
	port, _, _ := unstructured.NestedInt64(api.Object, "spec", "service", "port")
	svc := &corev1.Service{}
	Expect(cluster.APIClient().Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, svc)).To(Succeed())
	host := svc.Spec.ClusterIP
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		host = svc.Spec.ExternalName
	}
	return net.JoinHostPort(host, strconv.FormatInt(port, 10))
}

// selfSignedClientCert is a client certificate for cn from a CA of its own.
func selfSignedClientCert(cn string) tls.Certificate {
	GinkgoHelper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	Expect(err).NotTo(HaveOccurred())
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	Expect(err).NotTo(HaveOccurred())
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

var uploaded = regexp.MustCompile(`uploaded, (sha256:[0-9a-f]{64})`)

var _ = Describe("kubectl diskpipe upload", func() {
	It("uploads with a client certificate, an exec plugin's token, or a plain token, and refuses a user without the right, naming it", func() {
		ns := namespace()
		uploaders(ns)
		// The administrator's client certificate.
		out, errOut, code := plugin("upload", "by-cert", "--file", images["qcow2"], "--create", "-n", ns)
		Expect(code).To(Equal(0), errOut)
		Expect(out).To(Equal("virtualmachineimage/by-cert: Ready, Imported\n"))
		Expect(errOut).To(ContainSubstring("virtualmachineimage/by-cert made, with an upload source"))
		Expect(uploaded.FindStringSubmatch(errOut)).To(HaveLen(2))
		Expect(uploaded.FindStringSubmatch(errOut)[1]).To(Equal("sha256:"+sha256Of(images["qcow2"])), "the proxy's digest is the file's")
		sameDisk(golden(ns, "by-cert"))

		// A service account's token from an exec credential plugin, with only the upload right.
		_, errOut, code = pluginAs(execKubeconfig(ns, "uploader"), "upload", "by-exec", "--file", images["vmdk"], "--create")
		Expect(code).To(Equal(0), errOut)
		sameDisk(golden(ns, "by-exec"))

		// A token that may read images but not upload: refused, with the right it lacks.
		viewer := kubeconfigWith("kubeconfig-viewer-"+ns, ns, &clientcmdapi.AuthInfo{Token: saToken(ns, "viewer")})
		kubectl(vmi("refused", "    upload: {}"), "apply", "-n", ns, "-f", "-")
		_, errOut, code = pluginAs(viewer, "upload", "refused", "--file", images["qcow2"])
		Expect(code).To(Equal(1))
		Expect(errOut).To(ContainSubstring(fmt.Sprintf("system:serviceaccount:%s:viewer may not upload to virtualmachineimages %s/refused: it needs create on virtualmachineimages/upload", ns, ns)))
		// A token request needs no dry run, and nothing of it is stored.
		token, _, err := cluster.Kubectl(context.Background(), []byte(`apiVersion: upload.diskpipe.io/v1alpha1
kind: UploadTokenRequest
metadata: {name: not-stored}
spec: {kind: VirtualMachineImage, name: refused}
`), "create", "-n", ns, "-f", "-", "-o", "jsonpath={.status.token}")
		Expect(err).NotTo(HaveOccurred())
		Expect(token).To(HavePrefix(uploadtoken.Prefix))
		_, stderr, err := cluster.Kubectl(context.Background(), nil, "get", "uploadtokenrequests", "-n", ns)
		Expect(err).To(HaveOccurred())
		Expect(stderr).To(ContainSubstring("none is stored"))
	})

	It("issues no token to a request that reaches the manager's port without the apiserver, whatever it claims", func() {
		ns := namespace()
		kubectl(vmi("target", "    upload: {}"), "apply", "-n", ns, "-f", "-")
		addr := tokenAPIAddress()
		review := fmt.Sprintf(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","kind":{"group":"upload.diskpipe.io","version":"v1alpha1","kind":"UploadTokenRequest"},`+
			`"resource":{"group":"upload.diskpipe.io","version":"v1alpha1","resource":"uploadtokenrequests"},"namespace":%q,"operation":"CREATE","dryRun":true,`+
			`"userInfo":{"username":"system:admin","groups":["system:masters"]},"object":{"apiVersion":"upload.diskpipe.io/v1alpha1","kind":"UploadTokenRequest",`+
			`"metadata":{"name":"forged","namespace":%q},"spec":{"kind":"VirtualMachineImage","name":"target"}}}}`, ns, ns)
		request := `{"apiVersion":"upload.diskpipe.io/v1alpha1","kind":"UploadTokenRequest","metadata":{"name":"forged"},"spec":{"kind":"VirtualMachineImage","name":"target"}}`
		api := "/apis/upload.diskpipe.io/v1alpha1/namespaces/" + ns + "/uploadtokenrequests"
		// A client certificate of the front-proxy's name, but from a CA of the attacker's.
		forgedCert := selfSignedClientCert("front-proxy-client")
		for _, cert := range []*tls.Certificate{nil, &forgedCert} {
			c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, //nolint:gosec // an attacker's client
				GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
					if cert == nil {
						return &tls.Certificate{}, nil
					}
					return cert, nil
				}}}}
			for _, path := range []string{api, "/mutate-uploadtokenrequests", "/validate-sources", "/validate-pods", "/validate-virtualmachines", "/", "/apis"} {
				for _, body := range []string{review, request} {
					req, err := http.NewRequest(http.MethodPost, "https://"+addr+path, strings.NewReader(body))
					Expect(err).NotTo(HaveOccurred())
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("X-Remote-User", "system:admin")
					req.Header.Set("X-Remote-Group", "system:masters")
					resp, err := c.Do(req)
					Expect(err).NotTo(HaveOccurred())
					got, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					Expect(string(got)).NotTo(ContainSubstring(uploadtoken.Prefix), "POST %s with a client certificate: %v", path, cert != nil)
					if path == api {
						Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized))
						Expect(string(got)).To(ContainSubstring("only requests forwarded by kube-apiserver are served here"))
					}
				}
			}
		}
		// The same request through the apiserver, as the administrator, gets one.
		token, _, err := cluster.Kubectl(context.Background(), []byte(request), "create", "-n", ns, "-f", "-", "-o", "jsonpath={.status.token}")
		Expect(err).NotTo(HaveOccurred())
		Expect(token).To(HavePrefix(uploadtoken.Prefix))
	})

	It("goes on by itself after its connection is cut at 10, 50 and 90 %, and the disk is identical", localProves, func() {
		ns := namespace()
		const size = 40 << 20 // three parts of the proxy's 16 MiB
		file := randomDisk("cut-"+ns+".raw", size)
		flaky := newFlakyProxy([]int64{size / 10, size / 2, size * 9 / 10}, 0)
		out, errOut, code := plugin("upload", "cut", "--file", file, "--create", "--url", flaky.url, "-n", ns)
		Expect(code).To(Equal(0), errOut)
		Expect(out).To(Equal("virtualmachineimage/cut: Ready, Imported\n"))
		Expect(strings.Count(errOut, "the upload was interrupted")).To(Equal(3), "each cut was seen and resumed")
		Expect(errOut).To(ContainSubstring("resuming at 32.0 MiB of 40.0 MiB"), "the last cut resumes after the parts stored")
		Expect(errOut).NotTo(ContainSubstring("\r"), "into a pipe, progress is plain lines")
		Expect(uploaded.FindStringSubmatch(errOut)[1]).To(Equal("sha256:" + sha256Of(file)))
		run("qemu-img", "compare", "-f", "raw", "-F", "raw", file, golden(ns, "cut"))
	})

	It("resumes with --resume after it was killed, without sending again what was stored", localProves, func() {
		ns := namespace()
		const size = 40 << 20
		file := randomDisk("killed-"+ns+".raw", size)
		slow := newFlakyProxy(nil, 8<<20)
		cmd := pluginCommand(context.Background(), cluster.KubeconfigFile(), "upload", "killed", "--file", file, "--create", "--url", slow.url, "-n", ns)
		Expect(cmd.Start()).To(Succeed())
		Eventually(slow.forwarded.Load, time.Minute, 100*time.Millisecond).Should(BeNumerically(">", 24<<20))
		Expect(cmd.Process.Signal(syscall.SIGKILL)).To(Succeed())
		_ = cmd.Wait()

		_, errOut, code := plugin("upload", "killed", "--file", file, "--url", slow.url, "-n", ns)
		Expect(code).To(Equal(2))
		Expect(errOut).To(ContainSubstring("are stored already: run again with --resume to continue it"))

		counted := newFlakyProxy(nil, 0)
		_, errOut, code = plugin("upload", "killed", "--file", file, "--resume", "--url", counted.url, "-n", ns)
		Expect(code).To(Equal(0), errOut)
		sent := counted.forwarded.Load()
		Expect(size-sent).To(BeNumerically(">=", 16<<20), "at least one stored part was not sent again")
		Expect((size-sent)%(16<<20)).To(BeZero(), "exactly the stored parts were skipped")
		Expect(uploaded.FindStringSubmatch(errOut)[1]).To(Equal("sha256:"+sha256Of(file)), "the digest covers the bytes of both runs")
		run("qemu-img", "compare", "-f", "raw", "-F", "raw", file, golden(ns, "killed"))
	})

	It("draws a live bar in a terminal", localProves, func() {
		if _, err := exec.LookPath("tmux"); err != nil {
			Fail("tmux is missing: hack/setup.sh installs it")
		}
		ns := namespace()
		file := randomDisk("tmux-"+ns+".raw", 24<<20)
		slow := newFlakyProxy(nil, 4<<20)
		cmd := pluginCommand(context.Background(), cluster.KubeconfigFile(), "upload", "bar", "--file", file, "--create", "--url", slow.url, "-n", ns, "--no-wait")
		session := "diskpipe-" + ns
		shell := fmt.Sprintf("env PATH=%q KUBECONFIG=%q %s; sleep 60", testenv.Path("bin")+":"+os.Getenv("PATH"),
			cluster.KubeconfigFile(), strings.Join(cmd.Args, " "))
		run("tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "12", shell)
		DeferCleanup(func() { _ = exec.Command("tmux", "kill-session", "-t", session).Run() })
		bar := regexp.MustCompile(`\[(=*) *\] upload bar +([0-9.]+)% `)
		seen := map[string]bool{}
		Eventually(func() int {
			screen, _ := exec.Command("tmux", "capture-pane", "-p", "-t", session).Output()
			for _, m := range bar.FindAllStringSubmatch(string(screen), -1) {
				seen[m[2]] = true
			}
			GinkgoWriter.Printf("%s\n", screen)
			return len(seen)
		}, time.Minute, 300*time.Millisecond).Should(BeNumerically(">=", 3), "the bar moves in place")
		Eventually(func() string {
			screen, _ := exec.Command("tmux", "capture-pane", "-p", "-t", session).Output()
			return string(screen)
		}, time.Minute, time.Second).Should(ContainSubstring("virtualmachineimage/bar: uploaded; the import goes on"))
	})
})
