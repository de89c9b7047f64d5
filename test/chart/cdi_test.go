package chart

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/controllers/cdi"
	cdipolicy "github.com/diskpipe/diskpipe/controllers/cdi/policy"
	"github.com/diskpipe/diskpipe/test/testenv"
	"github.com/diskpipe/diskpipe/uploadproxy"
	"github.com/diskpipe/diskpipe/uploadproxy/cdiupload"
)

// cdiKinds are the kinds of CDI's API the chart installs with cdi.compatibility.enabled.
var cdiKinds = []string{"datavolumes", "datasources", "dataimportcrons", "storageprofiles", "cdiconfigs", "cdis"}

// TestCDICompatibility: CDI's API is installed only when asked for: CDI's CRDs (the generated
// files, labelled and kept like diskpipe's own) and the policy that refuses what diskpipe does
// not serve, the same policy the manager's tests prove.
func TestCDICompatibility(t *testing.T) {
	for _, o := range render(t, "diskpipe-system") {
		if groupOf(o) == "cdi.kubevirt.io" || strings.HasPrefix(o.GetName(), cdipolicy.CDIPolicyName) {
			t.Errorf("default values render %s %s: CDI's API is off by default", o.GetKind(), o.GetName())
		}
	}
	objs := render(t, "diskpipe-system", "--set", "cdi.compatibility.enabled=true")
	var crds []string
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" || groupOf(o) != "cdi.kubevirt.io" {
			continue
		}
		crds = append(crds, pluralOf(o))
		if o.GetAnnotations()["helm.sh/resource-policy"] != "keep" || o.GetLabels()["app.kubernetes.io/instance"] != testenv.ChartRelease {
			t.Errorf("CRD %s is not kept on uninstall or not labelled as the release's: %v %v", o.GetName(), o.GetAnnotations(), o.GetLabels())
		}
	}
	if !slices.Equal(slices.Sorted(slices.Values(crds)), slices.Sorted(slices.Values(cdiKinds))) {
		t.Errorf("CDI's CRDs rendered: %v, want %v", crds, cdiKinds)
	}
	for _, k := range cdiKinds {
		readFile(t, "charts", "diskpipe", "files", "cdi", "cdi.kubevirt.io_"+k+".yaml") // fails when make manifests did not write it
	}

	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	for _, o := range []struct {
		kind string
		into any
	}{{"ValidatingAdmissionPolicy", &policy}, {"ValidatingAdmissionPolicyBinding", &binding}} {
		u := find(objs, o.kind)
		if u == nil {
			t.Fatalf("no %s rendered with cdi.compatibility.enabled", o.kind)
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, o.into); err != nil {
			t.Fatal(err)
		}
	}
	if want := cdipolicy.CDIPolicy(); policy.Name != want.Name || !equality.Semantic.DeepEqual(policy.Spec, want.Spec) {
		t.Errorf("the CDI policy differs:\nchart:   %+v\nmanager: %+v", policy.Spec, want.Spec)
	}
	if want := cdipolicy.CDIPolicyBinding(); binding.Name != want.Name || !equality.Semantic.DeepEqual(binding.Spec, want.Spec) {
		t.Errorf("the CDI policy binding differs:\nchart:   %+v\nmanager: %+v", binding.Spec, want.Spec)
	}

	// virtctl image-upload pvc's policy, on a cluster that has MutatingAdmissionPolicy.
	if find(objs, "MutatingAdmissionPolicy") != nil {
		t.Errorf("the upload PVC policy is rendered for a cluster without MutatingAdmissionPolicy")
	}
	withMAP := render(t, "diskpipe-system", "--set", "cdi.compatibility.enabled=true", "--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy")
	for _, want := range []client.Object{cdipolicy.UploadPVCPolicy(), cdipolicy.UploadPVCPolicyBinding()} {
		sameSpec(t, withMAP, want)
	}

	// CDI's upload token API, served by the manager as its own is.
	var api *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "APIService" && o.GetName() == uploadproxy.APIServiceName(cdiupload.GroupVersion) {
			api = o
		}
	}
	if api == nil {
		t.Fatalf("no APIService %s rendered with cdi.compatibility.enabled", uploadproxy.APIServiceName(cdiupload.GroupVersion))
	}
	gotSpec, _ := json.Marshal(api.Object["spec"])
	wantSpec, _ := json.Marshal(uploadproxy.APIService(cdiupload.GroupVersion, "diskpipe-system", testenv.ChartRelease+"-manager", 443, nil).Object["spec"])
	if string(gotSpec) != string(wantSpec) {
		t.Errorf("CDI's upload token APIService differs:\nchart:   %s\nmanager: %s", gotSpec, wantSpec)
	}
}

// TestRefuseBesideCDI: an install with cdi.compatibility.enabled into a cluster where CDI's
// operator made the DataVolume CRD fails, saying so, whether or not the chart installs CRDs; a
// CRD this release made (an upgrade) does not stop it. (The test environment's CRDs are not
// Helm's, hence crds.install=false.)
func TestRefuseBesideCDI(t *testing.T) {
	ctx := t.Context()
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "datavolumes.cdi.kubevirt.io", Labels: map[string]string{"cdi.kubevirt.io": "", "operator.cdi.kubevirt.io": ""}},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "cdi.kubevirt.io", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: "DataVolume", ListKind: "DataVolumeList", Plural: "datavolumes", Singular: "datavolume"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1beta1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object",
					XPreserveUnknownFields: ptr.To(true)}}}}},
	}
	scheme := runtime.NewScheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(env.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, crd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), crd) }) // t.Context() is done by now
	install := func() ([]byte, error) {
		return testenv.Helm(ctx, "install", testenv.ChartRelease, testenv.ChartPath(), "--namespace", "beside-cdi", "--kubeconfig", env.Kubeconfig,
			"--dry-run=server", "--set", "crds.install=false", "--set", "cdi.compatibility.enabled=true")
	}
	out, err := install()
	if err == nil || !strings.Contains(err.Error()+string(out), "the CRD datavolumes.cdi.kubevirt.io already exists and is not this release's") ||
		!strings.Contains(err.Error()+string(out), "diskpipe will not serve it beside a running CDI") {
		t.Fatalf("the install beside CDI was not refused with the reason: %v\n%s", err, out)
	}
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata": {"annotations": {"meta.helm.sh/release-name": "`+testenv.ChartRelease+`", "meta.helm.sh/release-namespace": "beside-cdi"}}}`))
	if err := c.Patch(ctx, crd, patch); err != nil {
		t.Fatal(err)
	}
	if out, err := install(); err != nil {
		t.Fatalf("the release's own CRD stopped the install: %v\n%s", err, out)
	}
	if out, err := testenv.Helm(ctx, "install", testenv.ChartRelease, testenv.ChartPath(), "--namespace", "beside-cdi", "--kubeconfig", env.Kubeconfig,
		"--dry-run=server", "--set", "crds.install=false"); err != nil {
		t.Fatalf("with cdi.compatibility.enabled=false CDI's CRD must not matter: %v\n%s", err, out)
	}
}

// sameSpec fails t unless objs hold an object of want's kind and name whose spec, read as
// want's type, is want's.
func sameSpec(t *testing.T, objs []*unstructured.Unstructured, want client.Object) {
	t.Helper()
	kind := want.GetObjectKind().GroupVersionKind().Kind
	for _, o := range objs {
		if o.GetKind() != kind || o.GetName() != want.GetName() {
			continue
		}
		got := reflect.New(reflect.TypeOf(want).Elem()).Interface()
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, got); err != nil {
			t.Fatal(err)
		}
		gotSpec := reflect.ValueOf(got).Elem().FieldByName("Spec").Interface()
		wantSpec := reflect.ValueOf(want).Elem().FieldByName("Spec").Interface()
		if !equality.Semantic.DeepEqual(gotSpec, wantSpec) {
			t.Errorf("the chart's %s %s differs from the manager's:\nchart:   %+v\nmanager: %+v", kind, want.GetName(), gotSpec, wantSpec)
		}
		return
	}
	t.Errorf("the chart renders no %s %s", kind, want.GetName())
}

// TestShortNames: no short name of diskpipe's kinds is also one of CDI's, which the chart
// installs beside them (KubeVirt's are checked against the real KubeVirt in test/e2e): kubectl
// would expand it to whichever it found first.
func TestShortNames(t *testing.T) {
	owner := map[string]string{}
	for _, o := range render(t, "diskpipe-system", "--set", "cdi.compatibility.enabled=true") {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		names, _, _ := unstructured.NestedStringSlice(o.Object, "spec", "names", "shortNames")
		if len(names) == 0 && groupOf(o) != "cdi.kubevirt.io" {
			t.Errorf("diskpipe's CRD %s has no short name", o.GetName())
		}
		for _, n := range names {
			if was, ok := owner[n]; ok {
				t.Errorf("short name %q names both %s and %s", n, was, o.GetName())
			}
			owner[n] = o.GetName()
		}
	}
	if owner["vmimage"] != "virtualmachineimages.hypercloud.tmaxanc.com" {
		t.Errorf("VirtualMachineImage's short name is not vmimage: %v", owner)
	}
}

// TestProfileHookConfiguration: with CDI's API on, the chart's StorageProfile webhook is the one
// the manager serves (cdi.ProfileHookConfiguration), pointed at the chart's Service, and the
// manager may keep its caBundle; without it, there is none.
func TestProfileHookConfiguration(t *testing.T) {
	if o := find(render(t, "diskpipe-system"), "MutatingWebhookConfiguration"); o != nil {
		t.Errorf("a MutatingWebhookConfiguration is rendered without CDI's API: %s", o.GetName())
	}
	objs := render(t, "diskpipe-system", "--set", "cdi.compatibility.enabled=true")
	o := find(objs, "MutatingWebhookConfiguration")
	if o == nil {
		t.Fatal("no MutatingWebhookConfiguration rendered with cdi.compatibility.enabled")
	}
	var got admissionregistrationv1.MutatingWebhookConfiguration
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &got); err != nil {
		t.Fatal(err)
	}
	want := cdiv1hook("diskpipe-system", testenv.ChartRelease+"-manager")
	if got.Name != want.Name || !equality.Semantic.DeepEqual(got.Webhooks, want.Webhooks) {
		t.Errorf("the chart's StorageProfile webhook differs:\nchart:   %+v\nmanager: %+v", got.Webhooks, want.Webhooks)
	}
	patchable := false
	for _, r := range objs {
		if r.GetKind() != "ClusterRole" {
			continue
		}
		rules, _, _ := unstructured.NestedSlice(r.Object, "rules")
		for _, rule := range rules {
			m, _ := rule.(map[string]any)
			res, _, _ := unstructured.NestedStringSlice(m, "resources")
			names, _, _ := unstructured.NestedStringSlice(m, "resourceNames")
			if slices.Contains(res, "mutatingwebhookconfigurations") && slices.Equal(names, []string{want.Name}) {
				patchable = true
			}
		}
	}
	if !patchable {
		t.Errorf("the manager may not patch the caBundle of %s", want.Name)
	}
}

// cdiv1hook is cdi.ProfileHookConfiguration as the chart points it: at port 443.
func cdiv1hook(ns, service string) *admissionregistrationv1.MutatingWebhookConfiguration {
	want := cdi.ProfileHookConfiguration(ns, service, nil)
	for i := range want.Webhooks {
		want.Webhooks[i].ClientConfig.Service.Port = ptr.To[int32](443)
	}
	return want
}

// TestCloneSourcer: CDI's clone-sourcer ClusterRole (CDI v1.66's
// pkg/operator/resources/cluster/rbac.go), which manifests written for CDI bind in a source's
// namespace, is there with CDI's API: create on datavolumes/source and nothing else, aggregated
// nowhere; bound in a namespace it consents to clones from there only.
func TestCloneSourcer(t *testing.T) {
	ctx := t.Context()
	for _, o := range render(t, "diskpipe-system") {
		if o.GetName() == "cdi.kubevirt.io:clone-sourcer" {
			t.Error("the default values render CDI's clone-sourcer role")
		}
	}
	var role *rbacv1.ClusterRole
	for _, o := range render(t, "diskpipe-system", "--set", "cdi.compatibility.enabled=true") {
		if o.GetKind() == "ClusterRole" && o.GetName() == "cdi.kubevirt.io:clone-sourcer" {
			role = &rbacv1.ClusterRole{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, role); err != nil {
				t.Fatal(err)
			}
		}
	}
	if role == nil {
		t.Fatal("no ClusterRole cdi.kubevirt.io:clone-sourcer with cdi.compatibility.enabled")
	}
	want := []rbacv1.PolicyRule{{APIGroups: []string{"cdi.kubevirt.io"}, Resources: []string{"datavolumes/source"}, Verbs: []string{"create"}}}
	if !reflect.DeepEqual(role.Rules, want) {
		t.Errorf("the clone-sourcer's rules: %+v", role.Rules)
	}
	for k := range role.Labels {
		if strings.HasPrefix(k, "rbac.authorization.k8s.io/aggregate-to-") {
			t.Errorf("the clone-sourcer is aggregated: %s", k)
		}
	}
	role.ResourceVersion = ""
	if err := env.Client.Create(ctx, role); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, ns := range []string{"golden", "elsewhere"} {
		if err := env.EnsureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "sam-clone-sourcer", Namespace: "golden"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "sam"}}}); err != nil {
		t.Fatal(err)
	}
	may := func(ns string) bool {
		attrs := authorizationv1.ResourceAttributes{Namespace: ns, Verb: "create", Group: "cdi.kubevirt.io", Resource: "datavolumes", Subresource: "source", Name: "golden-disk"}
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: "sam", ResourceAttributes: &attrs}}
		if err := env.Client.Create(ctx, sar); err != nil {
			t.Fatal(err)
		}
		return sar.Status.Allowed
	}
	deadline := time.Now().Add(10 * time.Second) // RBAC learns a binding a moment after it is made
	for !may("golden") && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if !may("golden") || may("elsewhere") {
		t.Errorf("sam, bound to the clone-sourcer in golden, may clone from golden: %v, from elsewhere: %v", may("golden"), may("elsewhere"))
	}
}
