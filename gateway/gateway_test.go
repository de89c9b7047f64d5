package gateway_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/gateway"
	"github.com/diskpipe/diskpipe/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.RunTests(m, &env) }

// fixture is a gateway acting with only the rights the chart would give it (impersonate, review
// tokens, list namespaces' names), two namespaces, and callers with tokens: an editor and a
// viewer of the first, an editor of the second, and one with no rights at all.
type fixture struct {
	url      string
	root     string // the gateway's root, where its pages are
	server   *gateway.Server
	ns, ns2  string
	tokens   map[string]string // caller: bearer token
	direct   map[string]client.Client
	audit    *bytes.Buffer
	auditMu  *sync.Mutex
	registry *prometheus.Registry
}

// callers are the fixture's callers.
var callers = []string{"editor", "viewer", "other", "nobody"}

func newFixture(t *testing.T, configure ...func(*gateway.Server)) *fixture {
	t.Helper()
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "gw-")
	must(t, err)
	ns2, err := env.CreateNamespace(ctx, "gw-other-")
	must(t, err)
	f := &fixture{ns: ns, ns2: ns2, tokens: map[string]string{}, direct: map[string]client.Client{}, audit: &bytes.Buffer{}, auditMu: &sync.Mutex{}}
	groups := []string{"diskvolume.kubesphere.io", "hypercloud.tmaxanc.com", "virtualmachine.kubesphere.io"}
	all := []string{"diskvolumes", "virtualmachinepvcs", "virtualmachineimages", "imagetemplates"}
	mkRole := func(ns, name string, verbs ...string) {
		must(t, env.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Rules: []rbacv1.PolicyRule{{APIGroups: groups, Resources: all, Verbs: verbs}}}))
	}
	mkRole(ns, "edit", "get", "list", "watch", "create", "update", "patch", "delete")
	mkRole(ns, "view", "get", "list", "watch")
	mkRole(ns2, "edit", "get", "list", "watch", "create", "update", "patch", "delete")
	bind := map[string][2]string{"editor": {ns, "edit"}, "viewer": {ns, "view"}, "other": {ns2, "edit"}}
	for _, name := range callers {
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
		must(t, env.Client.Create(ctx, sa))
		if b, ok := bind[name]; ok {
			must(t, env.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b[0]},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: b[1]},
				Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}}}))
		}
		tr := &authenticationv1.TokenRequest{}
		must(t, env.Client.SubResource("token").Create(ctx, sa, tr))
		f.tokens[name] = tr.Status.Token
		cfg := rest.CopyConfig(env.Config)
		cfg.CertData, cfg.KeyData, cfg.BearerToken = nil, nil, tr.Status.Token
		c, err := client.New(cfg, client.Options{Scheme: env.Client.Scheme()})
		must(t, err)
		f.direct[name] = c
	}
	// The gateway's own identity: a user with only these rights.
	own := "gateway-" + ns
	must(t, env.Client.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: own}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"users", "groups", "serviceaccounts"}, Verbs: []string{"impersonate"}},
		// Every extra a caller may carry (RBAC matches no "userextras/*"); dropping one could
		// lift a restriction it carries (a token's scopes), so all are sent.
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"*"}, Verbs: []string{"impersonate"}},
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"list"}},
	}}))
	must(t, env.Client.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: own},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: own},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: own}}}))
	cfg, err := env.UserConfig(own)
	must(t, err)
	f.registry = prometheus.NewRegistry()
	s, err := gateway.New(cfg, slog.New(slog.NewJSONHandler(lockedWriter{f.audit, f.auditMu}, nil)), gateway.NewMetrics(f.registry))
	must(t, err)
	for _, c := range configure {
		c(s)
	}
	f.server = s
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	f.root = srv.URL
	f.url = srv.URL + gateway.Prefix
	// One disk and one image in the first namespace, one disk in the second.
	for _, o := range []string{disk(ns, "disk-a"), disk(ns, "disk-b"), image(ns, "img"), disk(ns2, "theirs")} {
		u := &unstructured.Unstructured{}
		must(t, json.Unmarshal([]byte(o), &u.Object))
		must(t, env.Client.Create(ctx, u))
	}
	return f
}

func disk(ns, name string) string {
	return fmt.Sprintf(`{"apiVersion":"diskvolume.kubesphere.io/v1alpha1","kind":"DiskVolume","metadata":{"name":%q,"namespace":%q,"labels":{"os":"linux"}},
		"spec":{"source":{"blank":{}},"resources":{"requests":{"storage":"1Gi"}}}}`, name, ns)
}

func image(ns, name string) string {
	return fmt.Sprintf(`{"apiVersion":"hypercloud.tmaxanc.com/v1alpha1","kind":"VirtualMachineImage","metadata":{"name":%q,"namespace":%q},
		"spec":{"source":{"http":"https://images.example.com/disk.qcow2"}}}`, name, ns)
}

type lockedWriter struct {
	b  *bytes.Buffer
	mu *sync.Mutex
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// answer is the envelope as a client reads it.
type answer struct {
	status                            int
	header                            http.Header
	Data                              json.RawMessage
	Total                             *int
	Message, Reason, TraceID, AuditID string
	Unreachable                       map[string]string
	Actions                           map[string]struct {
		Allowed bool
		Reason  string
	}
}

func (f *fixture) do(t *testing.T, caller, method, path, body string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, f.url+path, strings.NewReader(body))
	must(t, err)
	if caller != "" {
		req.Header.Set("Authorization", "Bearer "+f.tokens[caller])
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	a := send(t, req, caller)
	if a.TraceID == "" || a.header.Get(gateway.HeaderTraceID) != a.TraceID {
		t.Errorf("%s %s: trace id %q, header %q", method, path, a.TraceID, a.header.Get(gateway.HeaderTraceID))
	}
	return a
}

// send sends req and reads the gateway's envelope, which every answer is; a 403 must say
// the right the caller lacks.
func send(t *testing.T, req *http.Request, caller string) answer {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, header: resp.Header}
	if err := json.Unmarshal(raw, &a); err != nil {
		t.Fatalf("%s %s: not the envelope: %v: %s", req.Method, req.URL.Path, err, raw)
	}
	if a.status == http.StatusForbidden && resp.Header.Get(gateway.HeaderDenyReason) == "" {
		t.Errorf("%s %s as %s: 403 with no %s: %s", req.Method, req.URL.Path, caller, gateway.HeaderDenyReason, raw)
	}
	return a
}

// TestCallersTable: every caller × every route is answered as the apiserver answers that
// caller asking directly (the oracle: the same request with the caller's own token), a 403
// with X-Deny-Reason naming the verb, resource and namespace it lacks.
func TestCallersTable(t *testing.T) {
	f := newFixture(t)
	ns, ns2 := f.ns, f.ns2
	dvols := func() *unstructured.UnstructuredList {
		l := &unstructured.UnstructuredList{}
		l.SetAPIVersion("diskvolume.kubesphere.io/v1alpha1")
		l.SetKind("DiskVolumeList")
		return l
	}
	obj := func(ns, name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("diskvolume.kubesphere.io/v1alpha1")
		u.SetKind("DiskVolume")
		u.SetNamespace(ns)
		u.SetName(name)
		return u
	}
	code := func(err error) int {
		if err == nil {
			return http.StatusOK
		}
		return int(err.(apierrors.APIStatus).Status().Code)
	}
	for _, caller := range callers {
		c := f.direct[caller]
		ctx := t.Context()
		// Reads.
		for _, n := range []string{ns, ns2} {
			want := code(c.List(ctx, dvols(), client.InNamespace(n)))
			a := f.do(t, caller, "GET", "/projects/"+n+"/disks?kind=DiskVolume", "")
			if a.status != want {
				t.Errorf("%s lists the disks of %s: %d, the apiserver answers %d: %s", caller, n, a.status, want, a.Message)
			}
			if a.status == http.StatusForbidden && !strings.Contains(a.header.Get(gateway.HeaderDenyReason), "may not list diskvolumes.diskvolume.kubesphere.io in namespace "+n) {
				t.Errorf("%s: deny reason %q", caller, a.header.Get(gateway.HeaderDenyReason))
			}
			name := map[string]string{ns: "disk-a", ns2: "theirs"}[n]
			want = code(c.Get(ctx, client.ObjectKey{Namespace: n, Name: name}, obj(n, name)))
			if a := f.do(t, caller, "GET", "/projects/"+n+"/disks/"+name+"?kind=DiskVolume", ""); a.status != want {
				t.Errorf("%s gets %s/%s: %d, the apiserver answers %d: %s", caller, n, name, a.status, want, a.Message)
			}
		}
		// A create and a delete of their own, in the first namespace; the oracle's dry run.
		name := "made-by-" + caller
		u := &unstructured.Unstructured{}
		must(t, json.Unmarshal([]byte(disk(ns, name)), &u.Object))
		want := code(c.Create(ctx, u.DeepCopy(), client.DryRunAll))
		if want == http.StatusOK {
			want = http.StatusCreated
		}
		a := f.do(t, caller, "POST", "/projects/"+ns+"/disks", disk(ns, name))
		if a.status != want {
			t.Errorf("%s creates a disk in %s: %d, the apiserver answers %d: %s", caller, ns, a.status, want, a.Message)
		}
		if a.AuditID == "" {
			t.Errorf("%s's create has no audit id", caller)
		}
		want = code(c.Delete(ctx, obj(ns, "disk-b"), client.DryRunAll))
		if a := f.do(t, caller, "DELETE", "/projects/"+ns+"/disks/disk-b?kind=DiskVolume", ""); a.status != want {
			t.Errorf("%s deletes %s/disk-b: %d, the apiserver answers %d: %s", caller, ns, a.status, want, a.Message)
		}
	}
	// The editor's create and delete happened; the viewer's did not.
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "made-by-editor"}, obj(ns, "made-by-editor")); err != nil {
		t.Errorf("the editor's disk: %v", err)
	}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "made-by-viewer"}, obj(ns, "made-by-viewer")); !apierrors.IsNotFound(err) {
		t.Errorf("the viewer's disk: %v", err)
	}
	// Audit lines: the editor's create succeeded, the viewer's failed, each with its ids.
	f.auditMu.Lock()
	lines := f.audit.String()
	f.auditMu.Unlock()
	for _, want := range []string{`"user":"system:serviceaccount:` + ns + `:editor","namespace":"` + ns + `","operation":"create","resource":"disks","name":"","status":201,"outcome":"Success"`,
		`"user":"system:serviceaccount:` + ns + `:viewer","namespace":"` + ns + `","operation":"create","resource":"disks","name":"","status":403,"outcome":"Failure`} {
		if !strings.Contains(lines, want) {
			t.Errorf("no audit line with %s in:\n%s", want, lines)
		}
	}
	if got := counter(t, f.registry, "create", "disks", "403"); got < 1 {
		t.Errorf("diskpipe_gateway_requests_total{create,disks,403} = %v", got)
	}
}

// counter is diskpipe_gateway_requests_total of op, resource and code in reg.
func counter(t *testing.T, reg *prometheus.Registry, op, resource, code string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	must(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "diskpipe_gateway_requests_total" {
			continue
		}
		for _, m := range mf.Metric {
			got := map[string]string{}
			for _, l := range m.Label {
				got[l.GetName()] = l.GetValue()
			}
			if got["operation"] == op && got["resource"] == resource && got["code"] == code {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestListsAndRefusals: the envelope, paging, sorting and filters; the actions each item
// carries for its caller; the cluster-wide view holding only what the caller may read; and
// each malformed or unauthenticated request refused with its reason.
func TestListsAndRefusals(t *testing.T) {
	f := newFixture(t)
	ns := f.ns
	type listed struct {
		Cluster, Kind string
		Object        struct{ Metadata metav1.ObjectMeta }
		Actions       map[string]struct {
			Allowed bool
			Reason  string
		}
	}
	items := func(a answer) []listed {
		t.Helper()
		var out []listed
		if err := json.Unmarshal(a.Data, &out); err != nil {
			t.Fatalf("data: %v: %s", err, a.Data)
		}
		return out
	}
	names := func(ls []listed) []string {
		var out []string
		for _, l := range ls {
			out = append(out, l.Object.Metadata.Namespace+"/"+l.Object.Metadata.Name)
		}
		return out
	}
	// Both kinds of images; both of disks, by name, then paged.
	a := f.do(t, "editor", "GET", "/projects/"+ns+"/images", "")
	if a.status != 200 || *a.Total != 1 || items(a)[0].Kind != "VirtualMachineImage" || items(a)[0].Cluster != "host" {
		t.Errorf("images: %d %s", a.status, a.Data)
	}
	a = f.do(t, "editor", "GET", "/projects/"+ns+"/disks?sortBy=name", "")
	if got := names(items(a)); strings.Join(got, ",") != ns+"/disk-a,"+ns+"/disk-b" || *a.Total != 2 {
		t.Errorf("disks by name: %v (total %v)", got, *a.Total)
	}
	a = f.do(t, "editor", "GET", "/projects/"+ns+"/disks?sortBy=name&ascending=false&limit=1&page=2", "")
	if got := names(items(a)); strings.Join(got, ",") != ns+"/disk-a" || *a.Total != 2 {
		t.Errorf("the second page of one, z to a: %v (total %v)", got, *a.Total)
	}
	a = f.do(t, "editor", "GET", "/projects/"+ns+"/disks?name=-b", "")
	if got := names(items(a)); strings.Join(got, ",") != ns+"/disk-b" {
		t.Errorf("name filter: %v", got)
	}
	a = f.do(t, "editor", "GET", "/projects/"+ns+"/disks?labelSelector=os%3Dwindows", "")
	if *a.Total != 0 || string(a.Data) != "[]" {
		t.Errorf("a label no disk has: %s", a.Data)
	}
	// What each may do: the editor everything, the viewer reads with the reason of the rest.
	if acts := items(f.do(t, "editor", "GET", "/projects/"+ns+"/disks", ""))[0].Actions; !acts["delete"].Allowed || !acts["update"].Allowed {
		t.Errorf("the editor's actions: %+v", acts)
	}
	v := f.do(t, "viewer", "GET", "/projects/"+ns+"/disks", "")
	acts := items(v)[0].Actions
	if !acts["get"].Allowed || acts["delete"].Allowed || !strings.Contains(acts["delete"].Reason, "system:serviceaccount:"+ns+":viewer may not delete diskvolumes.diskvolume.kubesphere.io in namespace "+ns) {
		t.Errorf("the viewer's actions: %+v", acts)
	}
	if c := v.Actions["create DiskVolume"]; c.Allowed || c.Reason == "" {
		t.Errorf("the viewer's create: %+v", c)
	}
	// A rule naming one disk: the hints are that object's, not only the namespace's.
	must(t, env.Client.Create(t.Context(), &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "delete-disk-b", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"diskvolume.kubesphere.io"}, Resources: []string{"diskvolumes"}, ResourceNames: []string{"disk-b"}, Verbs: []string{"delete"}}}}))
	must(t, env.Client.Create(t.Context(), &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "viewer-delete-disk-b", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "delete-disk-b"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "viewer", Namespace: ns}}}))
	byName := map[string]map[string]struct {
		Allowed bool
		Reason  string
	}{}
	for _, it := range items(f.do(t, "viewer", "GET", "/projects/"+ns+"/disks?kind=DiskVolume", "")) {
		byName[it.Object.Metadata.Name] = it.Actions
	}
	if !byName["disk-b"]["delete"].Allowed || byName["disk-a"]["delete"].Allowed || byName["disk-b"]["update"].Allowed {
		t.Errorf("the viewer's actions with delete on disk-b alone: %+v", byName)
	}
	var one listed
	if g := f.do(t, "viewer", "GET", "/projects/"+ns+"/disks/disk-b?kind=DiskVolume", ""); json.Unmarshal(g.Data, &one) != nil || !one.Actions["delete"].Allowed {
		t.Errorf("the viewer's actions on disk-b, got: %s", g.Data)
	}
	// The cluster-wide view: each sees what they may read, and nothing else.
	for caller, want := range map[string]string{"editor": ns + "/disk-a," + ns + "/disk-b", "other": f.ns2 + "/theirs"} {
		a := f.do(t, caller, "GET", "/disks?kind=DiskVolume&sortBy=name", "")
		var mine []string
		for _, n := range names(items(a)) {
			if strings.HasPrefix(n, ns+"/") || strings.HasPrefix(n, f.ns2+"/") {
				mine = append(mine, n)
			}
		}
		if a.status != 200 || strings.Join(mine, ",") != want {
			t.Errorf("%s's cluster-wide disks: %d %v, want %s", caller, a.status, mine, want)
		}
	}
	if a := f.do(t, "nobody", "GET", "/disks", ""); a.status != http.StatusForbidden {
		t.Errorf("nobody's cluster-wide disks: %d %s", a.status, a.Data)
	}
	// Refusals.
	for _, tc := range []struct {
		caller, method, path, body string
		status                     int
		message                    string
	}{
		{"", "GET", "/projects/" + ns + "/disks", "", 401, "an Authorization: Bearer <token> header"},
		{"editor", "GET", "/projects/" + ns + "/disks?cluster=member01", "", 404, `the cluster "member01" is not registered`},
		{"editor", "GET", "/projects/" + ns + "/networks", "", 404, `the gateway serves no resource "networks": it serves disks, exports, images, snapshots, templates, uploads`},
		{"editor", "GET", "/projects/Bad_NS/disks", "", 400, `"Bad_NS" is not a namespace's name`},
		{"editor", "GET", "/projects/" + ns + "/disks?kind=Pod", "", 400, `the disks are of the kinds DiskVolume, VirtualMachinePvc, not "Pod"`},
		{"editor", "GET", "/projects/" + ns + "/disks?limit=0", "", 400, "limit is a whole number from 1 to 1000"},
		{"editor", "GET", "/projects/" + ns + "/disks?sortBy=size", "", 400, "sortBy is createTime or name"},
		{"editor", "GET", "/projects/" + ns + "/disks/missing", "", 404, "there is no DiskVolume or VirtualMachinePvc named missing"},
		{"editor", "POST", "/projects/" + ns + "/disks", image(ns, "x"), 400, "the body is apiVersion"},
		{"editor", "POST", "/projects/" + ns + "/disks", disk(f.ns2, "x"), 400, "the body's metadata.namespace is"},
		{"editor", "POST", "/projects/" + ns + "/disks", "not json", 400, "the body is not a JSON object"},
		{"editor", "POST", "/projects/" + ns + "/disks", disk(ns, "disk-a"), 409, "already exists"},
		{"editor", "GET", "/nothing/here/at/all", "", 404, "is not a route of the gateway"},
	} {
		a := f.do(t, tc.caller, tc.method, tc.path, tc.body)
		if a.status != tc.status || !strings.Contains(a.Message, tc.message) {
			t.Errorf("%s %s as %q: %d %q, want %d %q", tc.method, tc.path, tc.caller, a.status, a.Message, tc.status, tc.message)
		}
	}
	// A made-up token is not one; a client's trace id is kept.
	req, _ := http.NewRequestWithContext(t.Context(), "GET", f.url+"/projects/"+ns+"/disks", nil)
	req.Header.Set("Authorization", "Bearer made-up")
	req.Header.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 || resp.Header.Get(gateway.HeaderTraceID) != "0af7651916cd43dd8448eb211c80319c" || !strings.Contains(string(body), "the token is not valid") {
		t.Errorf("a made-up token: %d %s %s", resp.StatusCode, resp.Header.Get(gateway.HeaderTraceID), body)
	}
}
