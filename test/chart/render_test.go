package chart

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/diskpipe/diskpipe/test/testenv"
)

func TestLint(t *testing.T) {
	for name, args := range valueSets(t) {
		t.Run(name, func(t *testing.T) {
			out, err := testenv.Helm(t.Context(), append([]string{"lint", "--strict", testenv.ChartPath()}, args...)...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		})
	}
}

// standInCRDs are cert-manager's kinds, which the chart renders with certManager.enabled.
// Their CRDs are not installed in this apiserver, so stand-ins that accept any spec are: the
// dry-run then checks apiVersion, kind, metadata and namespaces. Prometheus Operator's kinds
// get their real CRDs (test/crds/monitoring, generated from its Go types by make manifests).
var standInCRDs = func() string {
	var b strings.Builder
	for _, k := range []struct{ group, kind, plural string }{
		{"cert-manager.io", "Certificate", "certificates"},
		{"cert-manager.io", "Issuer", "issuers"},
	} {
		fmt.Fprintf(&b, `---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: %[3]s.%[1]s}
spec:
  group: %[1]s
  names: {kind: %[2]s, plural: %[3]s}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}}]
`, k.group, k.kind, k.plural)
	}
	return b.String()
}()

// TestDryRun renders the chart with each set of values and has the apiserver validate every
// object, CRDs first, by a server-side dry-run apply.
func TestDryRun(t *testing.T) {
	ctx := t.Context()
	kubectl(ctx, t, []byte(standInCRDs), "apply", "-f", "-")
	kubectl(ctx, t, nil, "apply", "--server-side", "-f", testenv.Path("test", "crds", "monitoring"))
	kubectl(ctx, t, nil, "wait", "--for=condition=Established", "--timeout=60s",
		"crd/servicemonitors.monitoring.coreos.com", "crd/prometheusrules.monitoring.coreos.com",
		"crd/certificates.cert-manager.io", "crd/issuers.cert-manager.io")
	for name, args := range valueSets(t) {
		t.Run(name, func(t *testing.T) {
			ns := "dry-" + name
			objs := render(t, ns, args...)
			for _, o := range objs {
				if o.GetNamespace() != "" {
					if err := env.EnsureNamespace(ctx, o.GetNamespace()); err != nil {
						t.Fatal(err)
					}
				}
			}
			var crds, rest []*unstructured.Unstructured
			for _, o := range objs {
				if o.GetKind() == "CustomResourceDefinition" {
					crds = append(crds, o)
				} else {
					rest = append(rest, o)
				}
			}
			for _, batch := range [][]*unstructured.Unstructured{crds, rest} {
				if len(batch) == 0 {
					continue
				}
				out := kubectl(ctx, t, toYAML(t, batch...), "apply", "--server-side", "--dry-run=server", "--field-manager=helm", "-f", "-")
				if got := strings.Count(out, "(server dry run)"); got != len(batch) {
					t.Fatalf("the apiserver validated %d of %d objects:\n%s", got, len(batch), out)
				}
			}
			t.Logf("%d objects validated: %v", len(objs), kinds(objs))
		})
	}
}

// TestRenderedParts checks what each set of values must turn on and off.
func TestRenderedParts(t *testing.T) {
	def := render(t, "diskpipe-system")
	got := kinds(def)
	for kind, n := range map[string]int{"CustomResourceDefinition": 6, "Deployment": 2, "StatefulSet": 1, "Secret": 1,
		"ValidatingWebhookConfiguration": 1, "APIService": 1, "NetworkPolicy": 3, "ServiceAccount": 4, "PodDisruptionBudget": 1} {
		if got[kind] != n {
			t.Errorf("default values render %d %s, want %d (all: %v)", got[kind], kind, n, got)
		}
	}
	for _, kind := range []string{"PrometheusRule", "ServiceMonitor", "Ingress", "Certificate"} {
		if got[kind] != 0 {
			t.Errorf("default values render a %s", kind)
		}
	}
	// The CRDs are the generated files, kept on uninstall.
	for _, o := range def {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		if o.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
			t.Errorf("CRD %s is not kept on uninstall", o.GetName())
		}
		file := readFile(t, "charts", "diskpipe", "files", "crds", groupOf(o)+"_"+pluralOf(o)+".yaml")
		var want map[string]any
		if err := yaml.Unmarshal(file, &want); err != nil {
			t.Fatal(err)
		}
		wantSpec, _ := yaml.Marshal(want["spec"])
		gotSpec, _ := yaml.Marshal(o.Object["spec"])
		if !bytes.Equal(wantSpec, gotSpec) {
			t.Errorf("CRD %s differs from its generated file", o.GetName())
		}
	}

	ext := kinds(render(t, "diskpipe-system", "-f", "testdata/external-store.yaml"))
	for _, kind := range []string{"CustomResourceDefinition", "StatefulSet", "ValidatingWebhookConfiguration", "NetworkPolicy", "Secret"} {
		if ext[kind] != 0 {
			t.Errorf("external-store values render %d %s", ext[kind], kind)
		}
	}
	if ext["Deployment"] != 1 {
		t.Errorf("external-store values render %d Deployments, want the manager's only", ext["Deployment"])
	}
	nd := render(t, "diskpipe-system", "-f", "testdata/nondefault.yaml")
	for kind, n := range map[string]int{"PrometheusRule": 1, "ServiceMonitor": 1, "Ingress": 2, "Certificate": 1, "Issuer": 1} {
		if kinds(nd)[kind] != n {
			t.Errorf("nondefault values render %d %s, want %d", kinds(nd)[kind], kind, n)
		}
	}
	if kinds(nd)["PodDisruptionBudget"] != 0 {
		t.Error("one manager replica has a PodDisruptionBudget, which would block every drain")
	}
	for _, o := range nd {
		if o.GetKind() == "CustomResourceDefinition" && o.GetAnnotations()["helm.sh/resource-policy"] != "" {
			t.Errorf("crds.keep=false still keeps %s", o.GetName())
		}
	}
}

func groupOf(o *unstructured.Unstructured) string {
	g, _, _ := unstructured.NestedString(o.Object, "spec", "group")
	return g
}

func pluralOf(o *unstructured.Unstructured) string {
	p, _, _ := unstructured.NestedString(o.Object, "spec", "names", "plural")
	return p
}

// TestSchemaRejects renders bad values: each is refused with a message that names the key.
func TestSchemaRejects(t *testing.T) {
	for _, c := range []struct {
		set  []string
		want []string
	}{
		{[]string{"manager.replicas=0"}, []string{"manager.replicas", "minimum"}},
		{[]string{"cloneStrategy.default=Fastest"}, []string{"cloneStrategy.default", "Automatic", "CSIClone", "Snapshot", "HostAssisted"}},
		{[]string{"cloneStrategy.storageClasses.nfs=Copy"}, []string{"cloneStrategy.storageClasses.nfs"}},
		{[]string{"webhook.failurePolicy=Maybe"}, []string{"webhook.failurePolicy", "Fail", "Ignore"}},
		{[]string{"manager.replica=2"}, []string{"manager", "replica"}}, // a typo is not ignored
		{[]string{"objectStore.external.endpoint=s3.example.com"}, []string{"objectStore.external.endpoint"}},
		{[]string{"objectStore.external.endpoint=https://s3.example.com"}, []string{"credentialsSecret"}},
		{[]string{"objectStore.bundled.storage.size=lots"}, []string{"objectStore.bundled.storage.size"}},
		{[]string{"importer.serviceAccountName=Importer_SA"}, []string{"importer.serviceAccountName"}},
		{[]string{"uploadProxy.ingress.enabled=true"}, []string{"uploadProxy.ingress.host is required"}},
		{[]string{"webhook.enabled=false"}, []string{"uploadProxy.tls.issued needs webhook.enabled", "uploadProxy.tls.secretName"}},
		{[]string{"webhook.enabled=false", "uploadProxy.tls.issued=false", "gateway.enabled=true"}, []string{"gateway.tls.issued needs webhook.enabled", "gateway.tls.secretName"}},
		{[]string{"gateway.replica=2"}, []string{"gateway", "replica"}},
	} {
		t.Run(strings.Join(c.set, ","), func(t *testing.T) {
			var args []string
			for _, s := range c.set {
				args = append(args, "--set", s)
			}
			_, _, err := testenv.RenderChart(t.Context(), "bad", "ns", args...)
			if err == nil {
				t.Fatalf("%v rendered", c.set)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error does not name %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestInstallUpgradeUninstall installs the chart into the apiserver with helm, upgrades and
// uninstalls it: the bundled store's keys are generated at install, read back on the upgrade
// (so the store's data stays readable) and left behind by the uninstall, like the CRDs.
func TestInstallUpgradeUninstall(t *testing.T) {
	ctx := t.Context()
	const ns = "installed"
	helm := func(args ...string) {
		t.Helper()
		// The CRDs are already in this apiserver, installed by the test environment.
		args = append(args, "--namespace", ns, "--kubeconfig", env.Kubeconfig)
		if out, err := testenv.Helm(ctx, args...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	keys := func() map[string][]byte {
		t.Helper()
		s := &corev1.Secret{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "diskpipe-objectstore"}, s); err != nil {
			t.Fatal(err)
		}
		return s.Data
	}
	helm("install", testenv.ChartRelease, testenv.ChartPath(), "--create-namespace", "--set", "crds.install=false")
	installed := keys()
	if len(installed["secretAccessKey"]) < 40 || len(installed["accessKeyId"]) < 12 {
		t.Fatalf("weak generated keys: %q", installed)
	}
	helm("upgrade", testenv.ChartRelease, testenv.ChartPath(), "--set", "crds.install=false", "--set", "manager.concurrency=16")
	if upgraded := keys(); !maps.EqualFunc(installed, upgraded, bytes.Equal) {
		t.Fatalf("the upgrade changed the store's keys: %q -> %q", installed, upgraded)
	}
	dep := &appsv1.Deployment{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "diskpipe-manager"}, dep); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(dep.Spec.Template.Spec.Containers[0].Args, "--concurrency=16") {
		t.Fatalf("the upgrade did not reach the manager: %v", dep.Spec.Template.Spec.Containers[0].Args)
	}
	helm("uninstall", testenv.ChartRelease)
	if kept := keys(); !maps.EqualFunc(installed, kept, bytes.Equal) {
		t.Fatal("the uninstall removed or changed the store's keys")
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(dep), dep); !apierrors.IsNotFound(err) {
		t.Fatalf("the manager's Deployment outlived the uninstall: %v", err)
	}
}

// TestManagerArgs: values reach the manager's flags. (The configuration file the chart
// renders is loaded by the real manager in controllers/manager's TestLoadChartConfig.)
func TestManagerArgs(t *testing.T) {
	objs := render(t, "diskpipe-system", "-f", "testdata/nondefault.yaml", "--show-only", "templates/manager.yaml")
	var dep appsv1.Deployment
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(find(objs, "Deployment").Object, &dep); err != nil {
		t.Fatal(err)
	}
	flags := dep.Spec.Template.Spec.Containers[0].Args
	for _, want := range []string{"--leader-elect=false", "--config=/etc/diskpipe/config.yaml", "--zap-log-level=debug",
		"--objectstore-public-endpoint=https://downloads.example.com"} {
		if !slices.Contains(flags, want) {
			t.Errorf("the manager's args lack %s: %v", want, flags)
		}
	}
	if slices.ContainsFunc(flags, func(f string) bool { return strings.HasPrefix(f, "--webhook-cert-secret") }) {
		t.Error("with cert-manager the manager must not issue its own certificate")
	}
}

// TestStoreQuota: objectStore.bundled.quotaPerNamespace reaches the store's command line, and
// without it the store runs with no quota.
func TestStoreQuota(t *testing.T) {
	args := func(objs []*unstructured.Unstructured) string {
		sts := find(objs, "StatefulSet")
		if sts == nil {
			t.Fatal("no StatefulSet")
		}
		containers, _, _ := unstructured.NestedSlice(sts.Object, "spec", "template", "spec", "containers")
		a, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
		return strings.Join(a, " ")
	}
	if got := args(render(t, "diskpipe-system", "--set", "objectStore.bundled.quotaPerNamespace=20Gi")); !strings.Contains(got, "--quota-per-namespace=20Gi") {
		t.Errorf("the store's args with a quota: %s", got)
	}
	if got := args(render(t, "diskpipe-system")); strings.Contains(got, "quota") {
		t.Errorf("the store's args without a quota: %s", got)
	}
}

// TestPortsServeWhomTheyServe: the manager's metrics are served over HTTPS to bearers of a
// token that may get /metrics by default, with the ClusterRole to bind Prometheus to; the
// webhook port admits only the peers webhookFrom names, where it names any.
func TestPortsServeWhomTheyServe(t *testing.T) {
	def := render(t, "diskpipe-system")
	reader := false
	for _, o := range def {
		if o.GetKind() == "ClusterRole" && o.GetName() == testenv.ChartRelease+"-metrics-reader" {
			rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
			reader = fmt.Sprint(rules) == "[map[nonResourceURLs:[/metrics] verbs:[get]]]"
		}
		if o.GetKind() == "Deployment" && strings.HasSuffix(o.GetName(), "-manager") {
			if args := fmt.Sprint(o.Object["spec"].(map[string]any)["template"]); !strings.Contains(args, "--metrics-secure=true") {
				t.Errorf("the manager does not serve its metrics securely by default: %s", args)
			}
		}
	}
	if !reader {
		t.Errorf("no ClusterRole %s-metrics-reader that may get /metrics and nothing else", testenv.ChartRelease)
	}
	bound := ""
	for _, o := range render(t, "diskpipe-system", "-f", "testdata/nondefault.yaml") {
		if o.GetKind() == "ClusterRoleBinding" && strings.HasSuffix(o.GetName(), "-metrics-readers") {
			subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
			bound = fmt.Sprint(subjects)
		}
	}
	if bound != "[map[kind:ServiceAccount name:prometheus-k8s namespace:monitoring]]" {
		t.Errorf("metrics.readers binds %q to the metrics reader, want monitoring/prometheus-k8s", bound)
	}
	for _, c := range []struct {
		values []string
		from   string
	}{{nil, "[]"}, {[]string{"-f", "testdata/nondefault.yaml"}, "[map[ipBlock:map[cidr:10.0.0.0/28]]]"}} {
		for _, o := range render(t, "diskpipe-system", c.values...) {
			if o.GetKind() != "NetworkPolicy" || !strings.HasSuffix(o.GetName(), "-manager") {
				continue
			}
			rules, _, _ := unstructured.NestedSlice(o.Object, "spec", "ingress")
			for _, r := range rules {
				rule := r.(map[string]any)
				if fmt.Sprint(rule["ports"]) == "[map[port:webhook]]" {
					from, _ := rule["from"].([]any)
					if got := fmt.Sprint(from); got != c.from {
						t.Errorf("values %v: the webhook port admits %s, want %s", c.values, got, c.from)
					}
				}
			}
		}
	}
}
