package chart

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	uploadapi "github.com/diskpipe/diskpipe/apis/upload/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/admission"
	cdipolicy "github.com/diskpipe/diskpipe/controllers/cdi/policy"
	"github.com/diskpipe/diskpipe/test/testenv"
	"github.com/diskpipe/diskpipe/uploadproxy"
)

// TestRBAC applies the chart's service accounts, roles and bindings and asks the apiserver,
// with SubjectAccessReviews, what each of diskpipe's identities may do.
func TestRBAC(t *testing.T) {
	ctx := t.Context()
	const release = "diskpipe-system"
	manager, err := env.ApplyChartRBAC(ctx, release)
	if err != nil {
		t.Fatal(err)
	}
	sa := func(ns, name string) string { return "system:serviceaccount:" + ns + ":" + name }
	importerHere, importerThere := sa(release, "diskpipe-importer"), sa("vms", "diskpipe-importer")
	uploads, store := sa(release, "diskpipe-uploadproxy"), sa(release, "diskpipe-objectstore")
	type check struct {
		user  string
		attrs authorizationv1.ResourceAttributes
		allow bool
	}
	res := func(ns, verb, group, resource string) authorizationv1.ResourceAttributes {
		return authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: group, Resource: resource}
	}
	var checks []check
	for _, nobody := range []string{importerHere, importerThere, store} {
		for _, a := range []authorizationv1.ResourceAttributes{
			res("vms", "get", "", "secrets"), res(release, "get", "", "secrets"), res("vms", "list", "", "pods"),
			res("vms", "get", "", "persistentvolumeclaims"), res("vms", "get", "hypercloud.tmaxanc.com", "virtualmachineimages"),
			res("", "create", "authentication.k8s.io", "tokenreviews"),
		} {
			checks = append(checks, check{nobody, a, false})
		}
	}
	for _, a := range []authorizationv1.ResourceAttributes{
		// what the controllers do, in any namespace
		res("vms", "create", "", "pods"), res("vms", "delete", "", "pods"), res("vms", "watch", "", "pods"),
		res("vms", "create", "", "secrets"), res("vms", "update", "", "secrets"), res("vms", "delete", "", "secrets"),
		{Namespace: "vms", Verb: "get", Resource: "secrets", Name: uploadproxy.DefaultKeysSecret}, // the store keys it wrote
		{Namespace: release, Verb: "get", Resource: "secrets", Name: "diskpipe-webhook-cert"},
		{Namespace: release, Verb: "get", Resource: "secrets", Name: "diskpipe-upload-token"},
		{Namespace: "kube-system", Verb: "get", Resource: "configmaps", Name: "extension-apiserver-authentication"},
		res("vms", "create", "", "persistentvolumeclaims"), res("vms", "create", "", "serviceaccounts"),
		res("vms", "create", "networking.k8s.io", "networkpolicies"),
		res("vms", "create", "snapshot.storage.k8s.io", "volumesnapshots"),
		res("", "list", "storage.k8s.io", "storageclasses"),
		res("vms", "update", "hypercloud.tmaxanc.com", "virtualmachineimages/status"),
		res("vms", "create", "diskvolume.kubesphere.io", "diskvolumes"),
		res("vms", "create", "kubevirt.io", "virtualmachines"),
		res("", "create", "authorization.k8s.io", "subjectaccessreviews"),
		res(release, "update", "coordination.k8s.io", "leases"),
		{Verb: "patch", Group: "admissionregistration.k8s.io", Resource: "validatingwebhookconfigurations", Name: "diskpipe"},
	} {
		checks = append(checks, check{manager, a, true})
	}
	for _, a := range []authorizationv1.ResourceAttributes{
		// No user's Secret, nor ConfigMap: the pods that need them mount them.
		res("vms", "get", "", "secrets"), res("vms", "list", "", "secrets"), res("vms", "watch", "", "secrets"),
		{Namespace: "vms", Verb: "get", Resource: "secrets", Name: "s3-credentials"},
		{Namespace: release, Verb: "get", Resource: "secrets", Name: "diskpipe-objectstore"}, // the store's root keys: a volume
		res("vms", "get", "", "configmaps"), res("kube-system", "get", "", "configmaps"),
		res("vms", "update", "", "persistentvolumeclaims"), res("vms", "delete", "", "namespaces"),
		res("vms", "update", "coordination.k8s.io", "leases"), // its Lease lives in the release namespace only
		{Verb: "patch", Group: "admissionregistration.k8s.io", Resource: "validatingwebhookconfigurations", Name: "someone-elses"},
		res("", "create", "rbac.authorization.k8s.io", "clusterrolebindings"),
		res("vms", "create", "", "pods/exec"),
	} {
		checks = append(checks, check{manager, a, false})
	}
	checks = append(checks,
		check{uploads, res("", "create", "authentication.k8s.io", "tokenreviews"), true},
		check{uploads, res("", "create", "authorization.k8s.io", "subjectaccessreviews"), true},
		check{uploads, res(release, "get", "", "secrets"), false},
		check{uploads, res("vms", "list", "", "pods"), false},
		// It reads the image an upload is for (found by the real cluster: the local one ran the
		// proxy as an administrator), and nothing more of it.
		check{uploads, res("vms", "get", "hypercloud.tmaxanc.com", "virtualmachineimages"), true},
		check{uploads, res("vms", "get", "virtualmachine.kubesphere.io", "imagetemplates"), true},
		check{uploads, res("vms", "list", "hypercloud.tmaxanc.com", "virtualmachineimages"), false},
		check{uploads, res("vms", "update", "hypercloud.tmaxanc.com", "virtualmachineimages"), false},
	)
	// The users' roles, bound in "vms": dora uses diskpipe there, vic reads it.
	if err := env.EnsureNamespace(ctx, "vms"); err != nil {
		t.Fatal(err)
	}
	for _, b := range []struct{ user, role string }{{"dora", "diskpipe-user"}, {"vic", "diskpipe-viewer"}} {
		if err := env.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: b.user, Namespace: "vms"},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: b.role},
			Subjects: []rbacv1.Subject{{Kind: "User", Name: b.user}}}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		attrs authorizationv1.ResourceAttributes
		dora  bool
		vic   bool
	}{
		{res("vms", "create", "hypercloud.tmaxanc.com", "virtualmachineimages"), true, false},
		{res("vms", "list", "hypercloud.tmaxanc.com", "virtualmachineimages"), true, true},
		{res("vms", "create", "virtualmachine.kubesphere.io", "virtualmachines"), true, false},
		{res("vms", "delete", "diskvolume.kubesphere.io", "diskvolumes"), true, false},
		{res("vms", "get", "hypercloud.tmaxanc.com", "virtualmachinevolumeexports"), true, true},
		{authorizationv1.ResourceAttributes{Namespace: "vms", Verb: "create", Group: "hypercloud.tmaxanc.com", Resource: "virtualmachineimages", Subresource: "upload"}, true, false},
		{authorizationv1.ResourceAttributes{Namespace: "vms", Verb: "update", Group: "hypercloud.tmaxanc.com", Resource: "virtualmachineimages", Subresource: "status"}, false, false},
		{res("other", "create", "hypercloud.tmaxanc.com", "virtualmachineimages"), false, false},
		{res("other", "list", "hypercloud.tmaxanc.com", "virtualmachineimages"), false, false},
		{res("vms", "get", "", "secrets"), false, false},
	} {
		checks = append(checks, check{"dora", c.attrs, c.dora}, check{"vic", c.attrs, c.vic})
	}
	// The apiserver's RBAC learns new bindings a moment after they are made.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		attrs := res("vms", "list", "hypercloud.tmaxanc.com", "virtualmachineimages")
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: "vic", ResourceAttributes: &attrs}}
		if err := env.Client.Create(ctx, sar); err == nil && sar.Status.Allowed {
			break
		}
	}
	for _, c := range checks {
		attrs := c.attrs
		name := fmt.Sprintf("%s %s %s/%s in %q", c.user, attrs.Verb, attrs.Group, attrs.Resource, attrs.Namespace)
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: c.user,
			Groups: []string{"system:serviceaccounts", "system:authenticated"}, ResourceAttributes: &attrs}}
		if err := env.Client.Create(ctx, sar); err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed != c.allow {
			t.Errorf("%s: allowed=%v, want %v (%s)", name, sar.Status.Allowed, c.allow, sar.Status.Reason)
		}
	}
	t.Logf("%d SubjectAccessReviews", len(checks))
}

// TestRestrictedPodSecurity creates, by a server-side dry-run, a pod from each of the chart's
// workloads in a namespace that enforces the restricted Pod Security Standard.
func TestRestrictedPodSecurity(t *testing.T) {
	ctx := t.Context()
	const ns = "restricted"
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}}); err != nil {
		t.Fatal(err)
	}
	for name, args := range valueSets(t) {
		t.Run(name, func(t *testing.T) {
			objs := render(t, ns, args...)
			var accounts, pods []*unstructured.Unstructured
			for _, o := range objs {
				switch o.GetKind() {
				case "ServiceAccount":
					accounts = append(accounts, o)
				case "Deployment", "StatefulSet":
					pods = append(pods, podOf(t, o))
				}
			}
			kubectl(ctx, t, toYAML(t, accounts...), "apply", "-f", "-")
			if len(pods) == 0 {
				t.Fatal("no workloads rendered")
			}
			out := kubectl(ctx, t, toYAML(t, pods...), "create", "--dry-run=server", "-f", "-")
			t.Logf("admitted as restricted:\n%s", out)
		})
	}
}

// podOf is the pod a workload would make; a StatefulSet's claims become PVC volumes.
func podOf(t *testing.T, w *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	spec, _, _ := unstructured.NestedMap(w.Object, "spec", "template", "spec")
	claims, _, _ := unstructured.NestedSlice(w.Object, "spec", "volumeClaimTemplates")
	for _, c := range claims {
		name, _, _ := unstructured.NestedString(c.(map[string]any), "metadata", "name")
		vols, _, _ := unstructured.NestedSlice(spec, "volumes")
		spec["volumes"] = append(vols, map[string]any{"name": name, "persistentVolumeClaim": map[string]any{"claimName": name + "-0"}})
	}
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": w.GetName() + "-0", "namespace": w.GetNamespace()}, "spec": spec}}
}

// TestWebhookConfiguration: the chart's webhooks are the ones the manager serves
// (admission.Configuration), and its upload token APIService the one the manager serves
// (uploadproxy.APIService), pointed at the chart's Service.
func TestWebhookConfiguration(t *testing.T) {
	objs := map[string]map[string]any{}
	for _, o := range render(t, "diskpipe-system", "--show-only", "templates/webhook.yaml") {
		objs[o.GetKind()] = o.Object
	}
	var got admissionregistrationv1.ValidatingWebhookConfiguration
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(objs["ValidatingWebhookConfiguration"], &got); err != nil {
		t.Fatal(err)
	}
	want := admission.Configuration("diskpipe-system", testenv.ChartRelease+"-manager", nil, cdipolicy.SourceKinds()...)
	if len(got.Webhooks) != len(want.Webhooks) {
		t.Fatalf("the chart has %d webhooks, the manager serves %d", len(got.Webhooks), len(want.Webhooks))
	}
	for i := range want.Webhooks {
		want.Webhooks[i].ClientConfig.Service.Port = ptr.To[int32](443)
		if !equality.Semantic.DeepEqual(got.Webhooks[i], want.Webhooks[i]) {
			t.Errorf("webhook %s differs:\nchart:   %+v\nmanager: %+v", want.Webhooks[i].Name, got.Webhooks[i], want.Webhooks[i])
		}
	}
	if objs["MutatingWebhookConfiguration"] != nil {
		t.Errorf("the chart has a MutatingWebhookConfiguration: upload tokens are an aggregated API, not a webhook")
	}
	// The hooks called for many pods may fail open on their own, the others staying closed.
	var apart admissionregistrationv1.ValidatingWebhookConfiguration
	o := find(render(t, "diskpipe-system", "--show-only", "templates/webhook.yaml", "--set", "webhook.podsFailurePolicy=Ignore"), "ValidatingWebhookConfiguration")
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &apart); err != nil {
		t.Fatal(err)
	}
	for _, h := range apart.Webhooks {
		want := admissionregistrationv1.Fail
		if h.Name == "golden-pvcs.diskpipe.io" || h.Name == "diskpipe-pods-exec.diskpipe.io" {
			want = admissionregistrationv1.Ignore
		}
		if *h.FailurePolicy != want {
			t.Errorf("with podsFailurePolicy=Ignore, %s fails %s", h.Name, *h.FailurePolicy)
		}
	}
	gotAPI, wantAPI := objs["APIService"], uploadproxy.APIService(uploadapi.GroupVersion, "diskpipe-system", testenv.ChartRelease+"-manager", 443, nil).Object
	if gotAPI == nil {
		t.Fatalf("the chart has no APIService for upload tokens")
	}
	gotName, _, _ := unstructured.NestedString(gotAPI, "metadata", "name")
	gotSpec, _ := json.Marshal(gotAPI["spec"])
	wantSpec, _ := json.Marshal(wantAPI["spec"])
	if string(gotSpec) != string(wantSpec) || gotName != uploadproxy.TokenAPIService {
		t.Errorf("the upload token APIService differs:\nchart:   %v\nmanager: %v", gotAPI, wantAPI)
	}
}

// TestFinalizerPolicy: on Kubernetes 1.36 and later the chart installs the finalizer policy the
// manager's code defines (admission.FinalizerPolicy) and binds it; on an older cluster, or
// with finalizerPolicy.enabled=false, it installs neither.
func TestFinalizerPolicy(t *testing.T) {
	const api = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
	objs := render(t, "diskpipe-system", "--api-versions", api, "--show-only", "templates/finalizerpolicy.yaml")
	if len(objs) != 2 {
		t.Fatalf("the chart has %d objects for the finalizer policy, want a policy and its binding", len(objs))
	}
	var policy admissionregistrationv1.MutatingAdmissionPolicy
	var binding admissionregistrationv1.MutatingAdmissionPolicyBinding
	for _, o := range []struct {
		u    *unstructured.Unstructured
		into any
	}{{find(objs, "MutatingAdmissionPolicy"), &policy}, {find(objs, "MutatingAdmissionPolicyBinding"), &binding}} {
		if o.u == nil {
			t.Fatalf("missing from the chart: %v", objs)
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.u.Object, o.into); err != nil {
			t.Fatal(err)
		}
	}
	if want := admission.FinalizerPolicy(); policy.Name != want.Name || !equality.Semantic.DeepEqual(policy.Spec, want.Spec) {
		t.Errorf("the finalizer policy differs:\nchart:   %+v\nmanager: %+v", policy.Spec, want.Spec)
	}
	if want := admission.FinalizerPolicyBinding(); binding.Name != want.Name || !equality.Semantic.DeepEqual(binding.Spec, want.Spec) {
		t.Errorf("the finalizer policy binding differs:\nchart:   %+v\nmanager: %+v", binding.Spec, want.Spec)
	}
	for _, args := range [][]string{{}, {"--api-versions", api, "--set", "finalizerPolicy.enabled=false"}} {
		out, err := testenv.Helm(t.Context(), append([]string{"template", testenv.ChartRelease, testenv.ChartPath(), "--show-only", "templates/finalizerpolicy.yaml"}, args...)...)
		if err == nil || !strings.Contains(err.Error(), "could not find template") {
			t.Errorf("helm template %v rendered the finalizer policy (%v):\n%s", args, err, out)
		}
	}
}
