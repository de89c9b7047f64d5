package chart

import (
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

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

// TestKubeSphere: with gateway.kubesphere.enabled the chart renders KubeSphere's extension
// objects, which its own CRDs (copied from KubeSphere's ks-crds chart) take whole: applied for
// real and read back, no field the chart writes is pruned as unknown. The bundle is what
// ks-console loads: a SystemJS module whose default export routes /diskpipe to a frame of the
// pages under the ReverseProxy's path, run here in Node with a stand-in for the console's React
// and System.register (the loader's one step). The gateway reviews KubeSphere's tokens and
// follows its Clusters with only list and watch on them; the manager keeps the gateway's CA
// in the two objects that reach it, with rights on those two names alone.
func TestKubeSphere(t *testing.T) {
	ctx := t.Context()
	if err := env.InstallKubeSphereCRDs(); err != nil {
		t.Fatal(err)
	}
	objs := render(t, "diskpipe-system", "--set", "gateway.enabled=true", "--set", "gateway.kubesphere.enabled=true", "--set", "gateway.kubesphere.clusters=true")
	byKind := map[string]*unstructured.Unstructured{}
	var bundle string
	for _, o := range objs {
		if o.GetAPIVersion() == "extensions.kubesphere.io/v1alpha1" {
			byKind[o.GetKind()] = o
		}
		if o.GetKind() == "ConfigMap" && o.GetName() == "diskpipe-kubesphere-bundle" {
			bundle, _, _ = unstructured.NestedString(o.Object, "data", "index.js")
		}
	}
	for _, k := range []string{"APIService", "ReverseProxy", "JSBundle", "ExtensionEntry"} {
		o := byKind[k]
		if o == nil {
			t.Fatalf("no %s rendered", k)
		}
		if o.GetLabels()["kubesphere.io/extension-ref"] != "diskpipe" {
			t.Errorf("%s %s is not labelled as the extension diskpipe's: %v", k, o.GetName(), o.GetLabels())
		}
		kubectl(ctx, t, toYAML(t, o), "apply", "--server-side", "--field-manager=helm", "-f", "-")
		got := o.DeepCopy()
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(o), got); err != nil {
			t.Fatal(err)
		}
		for _, part := range []string{"spec", "status"} {
			want, _, _ := unstructured.NestedFieldCopy(o.Object, part)
			have, _, _ := unstructured.NestedFieldCopy(got.Object, part)
			if w, h := mustJSON(t, want), mustJSON(t, have); w != h { // numbers compared as JSON has them
				t.Errorf("%s %s: the CRD keeps %s %v of the chart's %v", k, o.GetName(), part, have, want)
			}
		}
	}
	if g, _, _ := unstructured.NestedString(byKind["APIService"].Object, "spec", "group"); g != "virtualization.kubesphere.io" {
		t.Errorf("the APIService routes %s", g)
	}
	if u, _, _ := unstructured.NestedString(byKind["ReverseProxy"].Object, "spec", "upstream", "url"); u != "https://diskpipe-gateway.diskpipe-system.svc:443" {
		t.Errorf("the ReverseProxy reaches %s", u)
	}

	// The bundle, loaded as ks-console loads it (System.import, then its default export).
	script := `
let registered;
globalThis.System = { register(deps, declare) { registered = { deps, declare }; } };
globalThis.window = { location: { search: '?namespace=team-a' } };
eval(require('fs').readFileSync(0, 'utf8'));
const React = { createElement: (type, props) => ({ type, props }) };
let config;
const m = registered.declare((name, value) => { if (name === 'default') config = value; });
registered.deps.forEach((d, i) => m.setters[i](d === 'react' ? { default: React } : {}));
m.execute();
const page = config.routes[0].element.type();
console.log(JSON.stringify({ deps: registered.deps, path: config.routes[0].path, frame: page.type, src: page.props.src, menus: config.menus, locales: Object.keys(config.locales) }));
`
	cmd := exec.CommandContext(ctx, "node", "-e", script)
	cmd.Stdin = strings.NewReader(bundle)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node: %v: %s", err, out)
	}
	var loaded struct {
		Deps        []string
		Path, Frame string
		Src         string
		Menus       []map[string]any
		Locales     []string
	}
	if err := json.Unmarshal(out, &loaded); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	entries, _, _ := unstructured.NestedSlice(byKind["ExtensionEntry"].Object, "spec", "entries")
	if !slices.Equal(loaded.Deps, []string{"react"}) || loaded.Path != "/diskpipe" || loaded.Frame != "iframe" || loaded.Src != "/proxy/diskpipe/?namespace=team-a" ||
		len(loaded.Menus) != 1 || len(entries) != 1 || loaded.Menus[0]["link"] != entries[0].(map[string]any)["link"] || !slices.Equal(loaded.Locales, []string{"en"}) {
		t.Errorf("the bundle's config: %+v; the entries %v", loaded, entries)
	}

	gw := deployment(t, objs, "diskpipe-gateway").Spec.Template.Spec.Containers[0].Args
	for _, want := range []string{"--kubesphere-clusters", "--kubesphere-url=http://ks-apiserver.kubesphere-system.svc", "--kubesphere-allow-http"} {
		if !slices.Contains(gw, want) {
			t.Errorf("no %s in the gateway's %v", want, gw)
		}
	}
	// The upload proxy takes KubeSphere's tokens too: the console's uploads carry them.
	proxy := deployment(t, objs, "diskpipe-uploadproxy").Spec.Template.Spec.Containers[0].Args
	if !slices.Contains(proxy, "--kubesphere-url=http://ks-apiserver.kubesphere-system.svc") {
		t.Errorf("the upload proxy reviews no KubeSphere token: %v", proxy)
	}
	mgr := deployment(t, objs, "diskpipe-manager").Spec.Template.Spec.Containers[0].Args
	if !slices.Contains(mgr, "--kubesphere-ca-objects=APIService/v1beta1.virtualization.kubesphere.io,ReverseProxy/diskpipe") {
		t.Errorf("the manager keeps no CA in KubeSphere's objects: %v", mgr)
	}
	for _, o := range objs {
		if o.GetKind() != "ClusterRole" {
			continue
		}
		role := &rbacv1.ClusterRole{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, role); err != nil {
			t.Fatal(err)
		}
		for _, r := range role.Rules {
			switch {
			case slices.Contains(r.APIGroups, "cluster.kubesphere.io") && (o.GetName() != "diskpipe-gateway" || !slices.Equal(r.Verbs, []string{"list", "watch"})):
				t.Errorf("%s may %v KubeSphere's Clusters", o.GetName(), r.Verbs)
			case slices.Contains(r.APIGroups, "extensions.kubesphere.io") && (len(r.ResourceNames) != 1 || !slices.Equal(r.Verbs, []string{"get", "patch"})):
				t.Errorf("%s may %v %v of KubeSphere's extensions %v", o.GetName(), r.Verbs, r.Resources, r.ResourceNames)
			}
		}
	}
	// A certificate of the user's: its CA is theirs to give, twice base64 as ks-apiserver reads it.
	if _, _, err := testenv.RenderChart(ctx, testenv.ChartRelease, "diskpipe-system", "--set", "gateway.enabled=true", "--set", "gateway.kubesphere.enabled=true",
		"--set", "gateway.tls.secretName=mine"); err == nil || !strings.Contains(err.Error(), "needs gateway.kubesphere.caBundle") {
		t.Errorf("a certificate of the user's with no caBundle: %v", err)
	}
	for _, o := range render(t, "diskpipe-system", "--set", "gateway.enabled=true", "--set", "gateway.kubesphere.enabled=true", "--set", "gateway.tls.secretName=mine",
		"--set", "gateway.kubesphere.caBundle=PEM") {
		if o.GetKind() == "APIService" && o.GetAPIVersion() == "extensions.kubesphere.io/v1alpha1" {
			if ca, _, _ := unstructured.NestedString(o.Object, "spec", "caBundle"); ca != "VUVWTg==" {
				t.Errorf("the APIService's caBundle %q, want PEM twice base64", ca)
			}
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
