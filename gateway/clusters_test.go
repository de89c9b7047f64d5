package gateway_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/gateway"
	"github.com/diskpipe/diskpipe/test/testenv"
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
	// The gateway's user there: the same rights as its service account on the host.
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
	must(t, member.EnsureNamespace(ctx, ns))
	must(t, member.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "edit", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"diskvolume.kubesphere.io"}, Resources: []string{"diskvolumes"}, Verbs: []string{"get", "list", "create", "delete"}}}}))
	must(t, member.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "editor", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "edit"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "system:serviceaccount:" + ns + ":editor"}}}))
	u := &unstructured.Unstructured{}
	must(t, json.Unmarshal([]byte(disk(ns, "member-disk")), &u.Object))
	must(t, member.Client.Create(ctx, u))

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
