package chart

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/diskpipe/diskpipe/test/testenv"
)

// TestGateway: the console's gateway is off unless asked for; on, it serves HTTPS with the
// certificate the manager issues for its Service (or the user's), and its own rights are only
// to impersonate, review tokens and list namespaces: everything else it does as its caller.
func TestGateway(t *testing.T) {
	for _, o := range render(t, "diskpipe-system") {
		if o.GetName() == "diskpipe-gateway" {
			t.Errorf("the default values render the gateway's %s", o.GetKind())
		}
	}
	for _, c := range []struct {
		name          string
		set           []string
		secret        string
		managerIssues bool
	}{
		{name: "issued", set: []string{"gateway.enabled=true"}, secret: "diskpipe-gateway-tls", managerIssues: true},
		{name: "own certificate", set: []string{"gateway.enabled=true", "gateway.tls.secretName=console"}, secret: "console"},
		{name: "plain", set: []string{"gateway.enabled=true", "gateway.tls.issued=false"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var args []string
			for _, s := range c.set {
				args = append(args, "--set", s)
			}
			objs := render(t, "diskpipe-system", args...)
			flags := deployment(t, objs, "diskpipe-manager").Spec.Template.Spec.Containers[0].Args
			issues := slices.Contains(flags, "--gateway-cert-secret=diskpipe-gateway-tls") && slices.Contains(flags, "--gateway-service=diskpipe-gateway.diskpipe-system.svc")
			if issues != c.managerIssues {
				t.Errorf("the manager issues the gateway's certificate: %v, want %v (%v)", issues, c.managerIssues, flags)
			}
			gw := deployment(t, objs, "diskpipe-gateway")
			spec := gw.Spec.Template.Spec
			if spec.ServiceAccountName != "diskpipe-gateway" || spec.Containers[0].Command[0] != "/gateway" {
				t.Errorf("the gateway runs %v as %s", spec.Containers[0].Command, spec.ServiceAccountName)
			}
			tls := slices.Contains(spec.Containers[0].Args, "--tls-cert-file=/var/run/diskpipe/tls/tls.crt")
			if tls != (c.secret != "") {
				t.Errorf("the gateway serves TLS: %v, want %v", tls, c.secret != "")
			}
			vols := map[string]corev1.Volume{}
			for _, v := range spec.Volumes {
				vols[v.Name] = v
			}
			if v, ok := vols["tls"]; c.secret != "" && (!ok || v.Secret.SecretName != c.secret || len(v.Secret.Items) != 2) {
				t.Errorf("the gateway mounts %+v, want the certificate and key of %s", spec.Volumes, c.secret)
			}
			// Uploads go to the proxy's Service, verified with its issued CA: that Secret's
			// ca.crt alone, never the proxy's key.
			if !slices.Contains(spec.Containers[0].Args, "--upload-proxy-url=https://diskpipe-uploadproxy.diskpipe-system.svc:443") ||
				!slices.Contains(spec.Containers[0].Args, "--upload-proxy-ca-file=/var/run/diskpipe/uploadproxy-ca/ca.crt") {
				t.Errorf("the gateway's upload proxy: %v", spec.Containers[0].Args)
			}
			if v, ok := vols["uploadproxy-ca"]; !ok || v.Secret.SecretName != "diskpipe-uploadproxy-tls" || len(v.Secret.Items) != 1 || v.Secret.Items[0].Key != "ca.crt" {
				t.Errorf("the upload proxy's CA volume: %+v", v)
			}
			var role *rbacv1.ClusterRole
			for _, o := range objs {
				if o.GetKind() == "ClusterRole" && o.GetName() == "diskpipe-gateway" {
					role = &rbacv1.ClusterRole{}
					if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, role); err != nil {
						t.Fatal(err)
					}
				}
			}
			if role == nil {
				t.Fatal("no ClusterRole diskpipe-gateway")
			}
			for _, r := range role.Rules {
				for _, v := range r.Verbs {
					ok := v == "impersonate" || (v == "create" && slices.Equal(r.Resources, []string{"tokenreviews"})) ||
						(v == "list" && slices.Equal(r.Resources, []string{"namespaces"}))
					if !ok {
						t.Errorf("the gateway's own rights include %s on %v: it reads and writes only as its callers", v, r.Resources)
					}
				}
			}
		})
	}
}

// TestGatewayOptions: the console's origins and pages reach the gateway's flags; an upload
// proxy serving the user's own certificate is verified with the system's roots, no CA mounted.
func TestGatewayOptions(t *testing.T) {
	objs := render(t, "diskpipe-system", "--set", "gateway.enabled=true", "--set", "gateway.corsOrigins={https://console.example.com,https://ks.example.com}",
		"--set", "gateway.pages=false", "--set", "uploadProxy.tls.secretName=mine")
	spec := deployment(t, objs, "diskpipe-gateway").Spec.Template.Spec
	for _, want := range []string{"--cors-origins=https://console.example.com,https://ks.example.com", "--pages=false", "--upload-proxy-url=https://diskpipe-uploadproxy.diskpipe-system.svc:443"} {
		if !slices.Contains(spec.Containers[0].Args, want) {
			t.Errorf("no %s in %v", want, spec.Containers[0].Args)
		}
	}
	for _, v := range spec.Volumes {
		if v.Name == "uploadproxy-ca" {
			t.Errorf("the proxy's own certificate's Secret is mounted: %+v", v)
		}
	}
	for _, bad := range []string{"console.example.com", "http://console.example.com"} {
		if _, _, err := testenv.RenderChart(t.Context(), testenv.ChartRelease, "diskpipe-system", "--set", "gateway.enabled=true", "--set", "gateway.corsOrigins={"+bad+"}"); err == nil {
			t.Errorf("the origin %s is accepted: only https (and http on localhost) may be", bad)
		}
	}
	// A CA of the user's for the proxy's own certificate; plain HTTP to the proxy only when
	// the proxy serves it, said in a flag of its own.
	spec = deployment(t, render(t, "diskpipe-system", "--set", "gateway.enabled=true", "--set", "uploadProxy.tls.secretName=mine", "--set", "gateway.uploadProxyCASecret=mine-ca"),
		"diskpipe-gateway").Spec.Template.Spec
	if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Secret != nil && v.Secret.SecretName == "mine-ca" }) {
		t.Errorf("the user's CA for the proxy is not mounted: %+v", spec.Volumes)
	}
	spec = deployment(t, render(t, "diskpipe-system", "--set", "gateway.enabled=true", "--set", "uploadProxy.tls.issued=false"), "diskpipe-gateway").Spec.Template.Spec
	if !slices.Contains(spec.Containers[0].Args, "--upload-proxy-allow-http") {
		t.Errorf("a plain-HTTP proxy without --upload-proxy-allow-http: %v", spec.Containers[0].Args)
	}
}
