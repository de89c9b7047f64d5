package gateway_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/gateway"
	"github.com/diskpipe/diskpipe/internal/authn"
	"github.com/diskpipe/diskpipe/test/testenv"
	"github.com/diskpipe/diskpipe/uploadproxy"
)

// TestMemberClusters: a second apiserver as a member cluster. A caller reviewed on the host is
// impersonated there, so the member's own RBAC decides what they may do; a list across
// clusters says each item's cluster and the clusters that could not be reached.
func TestMemberClusters(t *testing.T) {
	member, err := testenv.Start()
	must(t, err)
	t.Cleanup(func() { _ = member.Stop() })
	ctx := t.Context()
	dir := t.TempDir()
	data := gatewayKubeconfig(t, member)
	must(t, os.WriteFile(filepath.Join(dir, "member.kubeconfig"), data, 0o600))
	// A member registered whose apiserver is gone.
	cfg, err := clientcmd.Load(data)
	must(t, err)
	for _, c := range cfg.Clusters {
		c.Server = "https://127.0.0.1:1"
	}
	must(t, clientcmd.WriteToFile(*cfg, filepath.Join(dir, "dead.kubeconfig")))

	var loadErr error
	f := newFixture(t, func(s *gateway.Server) { s.Members, loadErr = gateway.LoadMembers(dir) })
	must(t, loadErr)
	ns := f.ns
	// The host's editor may edit disks in the member's namespace of the same name; the viewer
	// has nothing there.
	memberDisk(t, member, ns, "member-disk")
	u := &unstructured.Unstructured{} // a disk, to read others into
	must(t, json.Unmarshal([]byte(disk(ns, "member-disk")), &u.Object))

	type listed struct {
		Cluster string
		Object  struct{ Metadata metav1.ObjectMeta }
	}
	items := func(a answer) []string {
		t.Helper()
		var ls []listed
		must(t, json.Unmarshal(a.Data, &ls))
		var out []string
		for _, l := range ls {
			out = append(out, l.Cluster+"/"+l.Object.Metadata.Name)
		}
		slices.Sort(out)
		return out
	}
	a := f.do(t, "editor", "GET", "/projects/"+ns+"/disks?kind=DiskVolume&cluster=member", "")
	if got := items(a); a.status != 200 || strings.Join(got, ",") != "member/member-disk" {
		t.Errorf("the editor's disks in the member: %d %v %s", a.status, got, a.Message)
	}
	if a := f.do(t, "viewer", "GET", "/projects/"+ns+"/disks?kind=DiskVolume&cluster=member", ""); a.status != 403 ||
		!strings.Contains(a.header.Get(gateway.HeaderDenyReason), "viewer may not list diskvolumes.diskvolume.kubesphere.io in namespace "+ns) {
		t.Errorf("the viewer in the member: %d %s", a.status, a.Message)
	}
	a = f.do(t, "editor", "GET", "/projects/"+ns+"/disks?kind=DiskVolume&cluster=*", "")
	if got := items(a); a.status != 200 || strings.Join(got, ",") != "host/disk-a,host/disk-b,member/member-disk" ||
		!strings.Contains(a.Message, "not reached: dead") {
		t.Errorf("the editor's disks across clusters: %d %v %q", a.status, got, a.Message)
	}
	// The viewer across clusters: the host's, and the member's refusal said.
	a = f.do(t, "viewer", "GET", "/projects/"+ns+"/disks?kind=DiskVolume&cluster=*", "")
	if got := items(a); a.status != 200 || strings.Join(got, ",") != "host/disk-a,host/disk-b" || !strings.Contains(a.Message, "member: system:serviceaccount:"+ns+":viewer may not list") {
		t.Errorf("the viewer's disks across clusters: %d %v %q", a.status, got, a.Message)
	}
	// A change goes to the cluster named, and only there.
	if a := f.do(t, "editor", "POST", "/projects/"+ns+"/disks?cluster=member", disk(ns, "made-there")); a.status != 201 {
		t.Errorf("the editor's create in the member: %d %s", a.status, a.Message)
	}
	if err := member.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "made-there"}, u.DeepCopy()); err != nil {
		t.Errorf("the disk made in the member: %v", err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "made-there"}, u.DeepCopy()); err == nil {
		t.Error("the disk made in the member is on the host too")
	}
	for _, tc := range []struct{ method, path, want string }{
		{"GET", "/projects/" + ns + "/disks?cluster=nope", `the cluster "nope" is not registered with this gateway, which serves host, dead, member`},
		{"POST", "/projects/" + ns + "/disks?cluster=*", "is for lists"},
		{"GET", "/projects/" + ns + "/disks?cluster=dead", "could not be asked"},
		{"GET", "/projects/" + ns + "/uploads/img?cluster=member&kind=VirtualMachineImage", "uploads go to the upload proxy of the cluster the gateway runs in"},
	} {
		if a := f.do(t, "editor", tc.method, tc.path, disk(ns, "x")); !strings.Contains(a.Message, tc.want) {
			t.Errorf("%s %s: %d %q, want %q", tc.method, tc.path, a.status, a.Message, tc.want)
		}
	}
}

// gatewayKubeconfig is a kubeconfig of member for the gateway: a user with there the rights its
// service account has on the host.
func gatewayKubeconfig(t *testing.T, member *testenv.Env) []byte {
	t.Helper()
	ctx := t.Context()
	must(t, member.Client.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "gateway"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"users", "groups", "serviceaccounts"}, Verbs: []string{"impersonate"}},
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"*"}, Verbs: []string{"impersonate"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"list"}},
	}}))
	must(t, member.Client.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "gateway"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "gateway"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "gateway"}}}))
	kc, err := member.UserKubeconfig(t.TempDir(), "gateway")
	must(t, err)
	data, err := os.ReadFile(kc)
	must(t, err)
	return data
}

// memberDisk gives the host's editor of namespace ns the right to edit disks in member's
// namespace of the same name, and one disk there, name.
func memberDisk(t *testing.T, member *testenv.Env, ns, name string) {
	t.Helper()
	ctx := t.Context()
	must(t, member.EnsureNamespace(ctx, ns))
	must(t, member.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "edit", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"diskvolume.kubesphere.io"}, Resources: []string{"diskvolumes"}, Verbs: []string{"get", "list", "create", "delete"}}}}))
	must(t, member.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "editor", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "edit"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "system:serviceaccount:" + ns + ":editor"}}}))
	u := &unstructured.Unstructured{}
	must(t, json.Unmarshal([]byte(disk(ns, name)), &u.Object))
	must(t, member.Client.Create(ctx, u))
}

// TestKubeSphereClusters: KubeSphere's own Cluster objects (its CRD, as KubeSphere installs it)
// as member clusters, followed by a watch: one added is served under its name, reached with
// the kubeconfig it holds and the caller impersonated there; the host's own is skipped; one
// the gateway cannot reach (an agent's, with no kubeconfig) or whose kubeconfig would have the
// gateway read its own files or run a command is not served, and says why; one deleted is gone.
func TestKubeSphereClusters(t *testing.T) {
	ctx := t.Context()
	must(t, env.InstallKubeSphereCRDs())
	member, err := testenv.Start()
	must(t, err)
	t.Cleanup(func() { _ = member.Stop() })
	data := gatewayKubeconfig(t, member)

	// The gateway reads Clusters with its own rights: list and watch them, nothing more.
	must(t, env.Client.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "gateway-ks-clusters"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"cluster.kubesphere.io"}, Resources: []string{"clusters"}, Verbs: []string{"list", "watch"}}}}))
	must(t, env.Client.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "gateway-ks-clusters"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "gateway-ks-clusters"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "gateway-ks-clusters"}}}))
	cfg, err := env.UserConfig("gateway-ks-clusters")
	must(t, err)
	ks, err := gateway.WatchKubeSphere(ctx, cfg, slog.New(slog.DiscardHandler))
	must(t, err)
	f := newFixture(t, func(s *gateway.Server) { s.KubeSphere = ks })
	ns := f.ns
	memberDisk(t, member, ns, "ks-member-disk")

	cluster := func(name string, labels map[string]string, connection map[string]any) {
		t.Helper()
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "cluster.kubesphere.io/v1alpha1", "kind": "Cluster",
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"connection": connection}}}
		u.SetLabels(labels)
		must(t, env.Client.Create(ctx, u))
	}
	b64 := func(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
	kc, err := clientcmd.Load(data)
	must(t, err)
	rewrite := func(edit func(*clientcmdapi.AuthInfo)) []byte {
		c := kc.DeepCopy()
		for _, a := range c.AuthInfos {
			edit(a)
		}
		out, err := clientcmd.Write(*c)
		must(t, err)
		return out
	}
	// The host's own Cluster, as KubeSphere makes it: never a member (its kubeconfig would
	// carry KubeSphere's own rights); here it even points at the member.
	cluster("host", map[string]string{gateway.KubeSphereHostLabel: ""}, map[string]any{"type": "direct", "kubeconfig": b64(data)})
	cluster("ks-member", nil, map[string]any{"type": "direct", "kubeconfig": b64(data)})
	cluster("ks-agent", nil, map[string]any{"type": "proxy"})
	cluster("ks-exec", nil, map[string]any{"type": "direct", "kubeconfig": b64(rewrite(func(a *clientcmdapi.AuthInfo) {
		a.Exec = &clientcmdapi.ExecConfig{Command: "/bin/sh", Args: []string{"-c", "touch /tmp/pwned"}, APIVersion: "client.authentication.k8s.io/v1"}
	}))})
	cluster("ks-tokenfile", nil, map[string]any{"type": "direct", "kubeconfig": b64(rewrite(func(a *clientcmdapi.AuthInfo) {
		a.ClientCertificateData, a.ClientKeyData, a.TokenFile = nil, nil, "/var/run/secrets/kubernetes.io/serviceaccount/token"
	}))})

	type listed struct {
		Cluster string
		Object  struct{ Metadata metav1.ObjectMeta }
	}
	var a answer
	deadline := time.Now().Add(30 * time.Second)
	for {
		a = f.do(t, "editor", "GET", "/projects/"+ns+"/disks?kind=DiskVolume&cluster=*", "")
		if strings.Contains(string(a.Data), "ks-member-disk") && strings.Contains(a.Message, "ks-tokenfile") || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	var ls []listed
	must(t, json.Unmarshal(a.Data, &ls))
	var got []string
	for _, l := range ls {
		got = append(got, l.Cluster+"/"+l.Object.Metadata.Name)
	}
	slices.Sort(got)
	if a.status != 200 || strings.Join(got, ",") != "host/disk-a,host/disk-b,ks-member/ks-member-disk" {
		t.Errorf("the editor's disks across KubeSphere's clusters: %d %v %q", a.status, got, a.Message)
	}
	for name, why := range map[string]string{
		"ks-agent":     "reached through KubeSphere's agent (connection type proxy)",
		"ks-exec":      "runs a command or an auth provider",
		"ks-tokenfile": "names files (tokenFile",
	} {
		if !strings.Contains(a.Unreachable[name], why) {
			t.Errorf("Cluster %s: unreachable says %q, want %q", name, a.Unreachable[name], why)
		}
		if b := f.do(t, "editor", "GET", "/projects/"+ns+"/disks?cluster="+name, ""); b.status != 503 || !strings.Contains(b.Message, why) {
			t.Errorf("?cluster=%s: %d %q, want 503 saying %q", name, b.status, b.Message, why)
		}
	}
	if _, err := os.Stat("/tmp/pwned"); err == nil {
		t.Error("the exec kubeconfig's command ran")
	}
	if _, host := a.Unreachable["host"]; host {
		t.Errorf("the host's Cluster was taken for a member: %v", a.Unreachable)
	}
	// The viewer there has no rights: the member's RBAC decides, not the kubeconfig's.
	if b := f.do(t, "viewer", "GET", "/projects/"+ns+"/disks?kind=DiskVolume&cluster=ks-member", ""); b.status != 403 {
		t.Errorf("the viewer in KubeSphere's member: %d %s", b.status, b.Message)
	}

	// Deleted from KubeSphere: no longer served.
	gone := &unstructured.Unstructured{}
	gone.SetAPIVersion("cluster.kubesphere.io/v1alpha1")
	gone.SetKind("Cluster")
	gone.SetName("ks-member")
	must(t, env.Client.Delete(ctx, gone))
	for deadline = time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		a = f.do(t, "editor", "GET", "/projects/"+ns+"/disks?cluster=ks-member", "")
		if a.status == 404 || time.Now().After(deadline) {
			break
		}
	}
	if a.status != 404 || !strings.Contains(a.Message, `the cluster "ks-member" is not registered`) {
		t.Errorf("a deleted Cluster: %d %q", a.status, a.Message)
	}
}

// TestMemberKubeconfigRefused: a member's kubeconfig from the administrator's Secret is held
// to what KubeSphere's Clusters are: everything inline, no command.
func TestMemberKubeconfigRefused(t *testing.T) {
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "m.kubeconfig"), []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", certificate-authority: /etc/ssl/certs/ca-certificates.crt}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600))
	if _, err := gateway.LoadMembers(dir); err == nil || !strings.Contains(err.Error(), "names a CA file") {
		t.Errorf("a member kubeconfig naming a CA file: %v", err)
	}
	must(t, os.WriteFile(filepath.Join(dir, "m.kubeconfig"), []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x, as-groups: [system:masters]}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600))
	if _, err := gateway.LoadMembers(dir); err == nil || !strings.Contains(err.Error(), `its user "u" impersonates`) {
		t.Errorf("a member kubeconfig that impersonates: %v", err)
	}
}

// TestKubeSphereTokens: behind KubeSphere's APIService a request carries the KubeSphere user's
// own token (a JWT the Kubernetes apiserver does not know), which the gateway has
// ks-apiserver's token review vouch for, and acts as that user, whose rights KubeSphere writes
// as RoleBindings to their name; its X-Remote-User headers, which anyone reaching the gateway
// could send, are never trusted. The review here answers as ks-apiserver's handler does
// (pkg/kapis/oauth: 200 with status.user.username, 400 for a token it did not issue): a
// stand-in for that one step, with the real apiserver deciding the rights.
func TestKubeSphereTokens(t *testing.T) {
	ctx := t.Context()
	ks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var tr struct{ Spec struct{ Token string } }
		if r.Method != http.MethodPost || r.URL.Path != "/oauth/authenticate" || json.NewDecoder(r.Body).Decode(&tr) != nil {
			http.Error(w, "no", http.StatusNotFound)
			return
		}
		users := map[string]string{"jwt-alice": "alice", "jwt-bob": "bob", "jwt-forged": "system:admin"}
		name, ok := users[tr.Spec.Token]
		if !ok {
			http.Error(w, `{"message":"token is invalid"}`, http.StatusBadRequest)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
			"status": map[string]any{"authenticated": true, "user": map[string]any{"username": name, "uid": ""}}})
	}))
	t.Cleanup(ks.Close)
	review := &authn.KubeSphere{URL: ks.URL, Client: ks.Client()}
	f := newFixture(t, func(s *gateway.Server) { s.Reviews.Also = review }, withUploads(t, func(p *uploadproxy.Server) { p.Tokens = review }))
	ns := f.ns
	// What KubeSphere's rolebinding controller writes for a project member: a RoleBinding to
	// the user's name.
	must(t, env.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "kubesphere-iam-alice-edit", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "edit"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "alice"}}}))
	do := func(token, method, path, contentType, body string, header ...string) answer {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, f.url+path, strings.NewReader(body))
		must(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		return send(t, req, "")
	}
	if a := do("jwt-alice", "GET", "/projects/"+ns+"/disks?kind=DiskVolume", "", ""); a.status != 200 || !strings.Contains(string(a.Data), "disk-a") {
		t.Errorf("alice's disks: %d %s", a.status, a.Message)
	}
	if a := do("jwt-alice", "POST", "/projects/"+ns+"/disks", "application/json", disk(ns, "alices")); a.status != 201 {
		t.Errorf("alice's new disk: %d %s", a.status, a.Message)
	}
	f.auditMu.Lock()
	audit := f.audit.String()
	f.auditMu.Unlock()
	if !strings.Contains(audit, `"user":"alice"`) {
		t.Errorf("no audit line names alice: %s", audit)
	}
	// bob is KubeSphere's user, with no rights in the project: Kubernetes says no.
	if a := do("jwt-bob", "GET", "/projects/"+ns+"/disks", "", ""); a.status != 403 || !strings.Contains(a.header.Get(gateway.HeaderDenyReason), "bob may not list") {
		t.Errorf("bob's disks: %d %q %s", a.status, a.header.Get(gateway.HeaderDenyReason), a.Message)
	}
	// A name that would be a Kubernetes identity is not acted as, whoever vouches for it.
	if a := do("jwt-forged", "GET", "/projects/"+ns+"/disks", "", ""); a.status != 401 || !strings.Contains(a.Message, `the user "system:admin", a name the gateway does not act as`) {
		t.Errorf("a KubeSphere user named system:admin: %d %s", a.status, a.Message)
	}
	// ks-apiserver's headers for its callers carry no proof: a token neither knows is refused,
	// whatever X-Remote-User says.
	if a := do("jwt-nobody", "GET", "/projects/"+ns+"/disks", "", "", "X-Remote-User", "alice", "X-Remote-Group", "system:masters"); a.status != 401 {
		t.Errorf("a forged X-Remote-User: %d %s", a.status, a.Message)
	}
	// alice's upload through the gateway: the proxy has KubeSphere vouch for her too, and
	// checks her own right to upload.
	must(t, env.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "upload", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"hypercloud.tmaxanc.com"}, Resources: []string{"virtualmachineimages/upload"}, Verbs: []string{"create"}}}}))
	must(t, env.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "alice-upload", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "upload"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "alice"}}}))
	if a := do("jwt-alice", "POST", "/projects/"+ns+"/uploads", "application/json", uploadImage(ns, "alices-upload")); a.status != 201 {
		t.Fatalf("alice starts an upload: %d %s", a.status, a.Message)
	}
	data := []byte("a KubeSphere user's disk")
	sum := sha256.Sum256(data)
	var up answer
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) { // the binding reaches the authorizer a moment later
		up = do("jwt-alice", "PUT", "/projects/"+ns+"/uploads/alices-upload?kind=VirtualMachineImage", "application/octet-stream", string(data),
			"Content-Range", fmt.Sprintf("bytes 0-%d/%d", len(data)-1, len(data)), "Upload-Digest", "sha256:"+hex.EncodeToString(sum[:]))
		if up.status != 403 || time.Now().After(deadline) {
			break
		}
	}
	if up.status != 201 || !strings.Contains(string(up.Data), `"complete":true`) {
		t.Errorf("alice's upload: %d %s %s", up.status, up.Message, up.Data)
	}
	if b := do("jwt-bob", "PUT", "/projects/"+ns+"/uploads/alices-upload?kind=VirtualMachineImage", "application/octet-stream", string(data),
		"Content-Range", fmt.Sprintf("bytes 0-%d/%d", len(data)-1, len(data))); b.status != 403 {
		t.Errorf("bob's piece of alice's upload: %d %s", b.status, b.Message)
	}
	// What another site's page could make a browser send: a form, or text/plain.
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", ""} {
		if a := do("jwt-alice", "POST", "/projects/"+ns+"/disks", ct, disk(ns, "csrf")); a.status != 415 || !strings.Contains(a.Message, "Content-Type: application/json") {
			t.Errorf("a POST of %q: %d %s", ct, a.status, a.Message)
		}
	}
}
