package chart

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestUploadProxyTLS: the upload proxy serves HTTPS unless told not to, with the certificate
// diskpipe issues (the manager, or cert-manager) or one of the user's, and everything that
// reaches it (the manager's word to token requesters, the probes, the ingress) says so.
func TestUploadProxyTLS(t *testing.T) {
	const issued = "diskpipe-uploadproxy-tls"
	for _, c := range []struct {
		name   string
		set    []string
		scheme string
		secret string // mounted in the proxy; "" for none
		// managerIssues: the manager keeps the proxy's certificate (--upload-proxy-cert-secret).
		managerIssues, certificate bool
	}{
		{name: "default", scheme: "https", secret: issued, managerIssues: true},
		{name: "plain", set: []string{"uploadProxy.tls.issued=false"}, scheme: "http"},
		{name: "own certificate", set: []string{"uploadProxy.tls.secretName=mine"}, scheme: "https", secret: "mine"},
		{name: "cert-manager", set: []string{"webhook.certManager.enabled=true"}, scheme: "https", secret: issued, certificate: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var args []string
			for _, s := range c.set {
				args = append(args, "--set", s)
			}
			objs := render(t, "diskpipe-system", args...)
			manager, proxy := deployment(t, objs, "diskpipe-manager"), deployment(t, objs, "diskpipe-uploadproxy")
			flags := manager.Spec.Template.Spec.Containers[0].Args
			if want := "--upload-proxy-service=" + c.scheme + ":diskpipe-system/diskpipe-uploadproxy:upload"; !slices.Contains(flags, want) {
				t.Errorf("the manager's args lack %s: %v", want, flags)
			}
			if got := slices.Contains(flags, "--upload-proxy-cert-secret="+issued); got != c.managerIssues {
				t.Errorf("the manager issues the proxy's certificate: %v, want %v (%v)", got, c.managerIssues, flags)
			}
			ctr := proxy.Spec.Template.Spec.Containers[0]
			if got := ctr.ReadinessProbe.HTTPGet.Scheme; !strings.EqualFold(string(got), c.scheme) {
				t.Errorf("the readiness probe's scheme is %s, want %s", got, c.scheme)
			}
			if got := slices.Contains(ctr.Args, "--tls-cert-file=/var/run/diskpipe/tls/tls.crt"); got != (c.secret != "") {
				t.Errorf("the proxy serves TLS: %v, want %v (%v)", got, c.secret != "", ctr.Args)
			}
			var mounted *corev1.SecretVolumeSource
			for _, v := range proxy.Spec.Template.Spec.Volumes {
				if v.Name == "tls" {
					mounted = v.Secret
				}
			}
			switch {
			case c.secret == "" && mounted != nil:
				t.Errorf("plain HTTP mounts the Secret %s", mounted.SecretName)
			case c.secret != "" && (mounted == nil || mounted.SecretName != c.secret):
				t.Errorf("the proxy mounts %+v, want the Secret %s", mounted, c.secret)
			case c.secret != "":
				var keys []string
				for _, it := range mounted.Items {
					keys = append(keys, it.Key)
				}
				if !slices.Equal(keys, []string{"tls.crt", "tls.key"}) {
					t.Errorf("the proxy mounts %v of its Secret, want only its certificate and key (never a CA's key)", keys)
				}
			}
			var cert *unstructured.Unstructured
			for _, o := range objs {
				if o.GetKind() == "Certificate" && o.GetName() == "diskpipe-uploadproxy" {
					cert = o
				}
			}
			if (cert != nil) != c.certificate {
				t.Fatalf("a cert-manager Certificate for the proxy: %v, want %v", cert != nil, c.certificate)
			}
			if cert != nil {
				name, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
				hosts, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
				if name != issued || !slices.Contains(hosts, "diskpipe-uploadproxy.diskpipe-system.svc") {
					t.Errorf("the proxy's Certificate goes to %s for %v", name, hosts)
				}
			}
		})
	}

	// The ingress reaches an HTTPS backend: ingress-nginx is told so, unless the user says
	// otherwise; plain HTTP gets no such annotation.
	ingress := func(args ...string) map[string]string {
		t.Helper()
		objs := render(t, "diskpipe-system", append([]string{"--set", "uploadProxy.ingress.enabled=true,uploadProxy.ingress.host=upload.example.com"}, args...)...)
		for _, o := range objs {
			if o.GetKind() == "Ingress" && o.GetName() == "diskpipe-uploadproxy" {
				return o.GetAnnotations()
			}
		}
		t.Fatal("no Ingress for the proxy")
		return nil
	}
	const backend = "nginx.ingress.kubernetes.io/backend-protocol"
	if got := ingress(); got[backend] != "HTTPS" {
		t.Errorf("the ingress's annotations are %v, want %s: HTTPS", got, backend)
	}
	if got := ingress("--set", "uploadProxy.ingress.annotations.nginx\\.ingress\\.kubernetes\\.io/backend-protocol=GRPCS"); got[backend] != "GRPCS" {
		t.Errorf("the user's annotation was overridden: %v", got)
	}
	if got := ingress("--set", "uploadProxy.tls.issued=false"); got[backend] != "" {
		t.Errorf("a plain proxy's ingress says its backend protocol: %v", got)
	}
}

func deployment(t *testing.T, objs []*unstructured.Unstructured, name string) *appsv1.Deployment {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == "Deployment" && o.GetName() == name {
			dep := &appsv1.Deployment{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, dep); err != nil {
				t.Fatal(err)
			}
			return dep
		}
	}
	t.Fatalf("no Deployment %s", name)
	return nil
}
