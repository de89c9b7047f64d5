package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/gateway"
	realcluster "github.com/diskpipe/diskpipe/test/cluster"
)

var _ = Describe("the console's gateway", func() {
	It("answers each tenant as the apiserver would, over HTTPS with the certificate the manager issued", realProves, func() {
		if !real() {
			Skip("the gateway runs where the chart is installed: the real cluster")
		}
		ctx := context.Background()
		ns, other := namespace(), namespace()
		kubectl(vmi("listed", fmt.Sprintf("    http: %s/disk.qcow2", server)), "apply", "-n", ns, "-f", "-")
		// Callers with Kubernetes' own roles (diskpipe's are aggregated into them): an editor
		// and a viewer of ns, and an editor of another namespace only.
		token := func(name, role, in string) string {
			GinkgoHelper()
			kubectl(fmt.Sprintf(`apiVersion: v1
kind: ServiceAccount
metadata: {name: %[1]s, namespace: %[3]s}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: %[1]s, namespace: %[4]s}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: %[2]s}
subjects:
- {kind: ServiceAccount, name: %[1]s, namespace: %[3]s}
`, name, role, ns, in), "apply", "-f", "-")
			sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
			tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}
			Expect(cluster.APIClient().SubResource("token").Create(ctx, sa, tr)).To(Succeed())
			return tr.Status.Token
		}
		editor, viewer, outsider := token("editor", "edit", ns), token("viewer", "view", ns), token("outsider", "edit", other)

		// The gateway's Service, reached as a user who has the CA of its issued certificate.
		svc := &corev1.Service{}
		Expect(cluster.APIClient().Get(ctx, client.ObjectKey{Namespace: realcluster.ReleaseNamespace, Name: realcluster.Release + "-gateway"}, svc)).To(Succeed())
		hc := node().ServiceClient(realcluster.Release+"-gateway-tls", realcluster.Release+"-gateway")
		hc.Timeout = 30 * time.Second
		base := fmt.Sprintf("https://%s:%d%s", svc.Spec.ClusterIP, svc.Spec.Ports[0].Port, gateway.Prefix)
		call := func(bearer, method, path string) (int, http.Header, map[string]any) {
			GinkgoHelper()
			req, err := http.NewRequestWithContext(ctx, method, base+path, nil)
			Expect(err).NotTo(HaveOccurred())
			req.Header.Set("Authorization", "Bearer "+bearer)
			var resp *http.Response
			Eventually(func() error { resp, err = hc.Do(req); return err }, time.Minute, 2*time.Second).Should(Succeed())
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			var e map[string]any
			Expect(json.Unmarshal(raw, &e)).To(Succeed(), string(raw))
			return resp.StatusCode, resp.Header, e
		}

		code, _, e := call(editor, "GET", "/projects/"+ns+"/images")
		Expect(code).To(Equal(http.StatusOK), "%v", e)
		Expect(e["total"]).To(BeEquivalentTo(1))
		items := e["data"].([]any)
		Expect(items[0].(map[string]any)["object"].(map[string]any)["metadata"].(map[string]any)["name"]).To(Equal("listed"))
		Expect(items[0].(map[string]any)["actions"].(map[string]any)["delete"].(map[string]any)["allowed"]).To(BeTrue())

		code, h, e := call(viewer, "DELETE", "/projects/"+ns+"/images/listed?kind=VirtualMachineImage")
		Expect(code).To(Equal(http.StatusForbidden), "%v", e)
		Expect(h.Get(gateway.HeaderDenyReason)).To(ContainSubstring("may not delete virtualmachineimages.hypercloud.tmaxanc.com in namespace " + ns))
		Expect(kubectl("", "get", "vmimage", "listed", "-n", ns, "-o", "name")).To(ContainSubstring("listed"))

		code, _, e = call(outsider, "GET", "/projects/"+ns+"/images")
		Expect(code).To(Equal(http.StatusForbidden), "%v", e)
		code, _, e = call(outsider, "GET", "/images")
		Expect(code).To(Equal(http.StatusOK), "%v", e)
		Expect(fmt.Sprint(e["data"])).NotTo(ContainSubstring(ns))

		code, _, e = call(editor, "DELETE", "/projects/"+ns+"/images/listed?kind=VirtualMachineImage")
		Expect(code).To(Equal(http.StatusOK), "%v", e)
		Eventually(func() string {
			return kubectl("", "get", "vmimage", "-n", ns, "-o", "name", "--ignore-not-found")
		}, time.Minute, time.Second).ShouldNot(ContainSubstring("listed"))
	})
})
