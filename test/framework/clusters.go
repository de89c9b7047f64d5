package framework

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/objectstore"
	"github.com/diskpipe/diskpipe/objectstore/tenancy"
	realcluster "github.com/diskpipe/diskpipe/test/cluster"
	"github.com/diskpipe/diskpipe/test/localcluster"
	"github.com/diskpipe/diskpipe/test/testenv"
)

// localNode names the local cluster's one node: its agent runs every pod on this machine,
// with no Node object.
const localNode = "local"

// local adapts the local cluster: its processes run on this machine, every log under dir.
type local struct {
	*localcluster.Cluster
	dir string
}

func (l local) APIClient() client.Client { return l.Client }
func (l local) KubeconfigFile() string   { return l.Kubeconfig }
func (l local) EnsureNamespace(ctx context.Context, name string) error {
	return l.Namespace(ctx, name)
}
func (l local) Nodes() []string     { return []string{localNode} }
func (l local) HostAddress() string { return "127.0.0.1" }
func (l local) UploadURL() string   { return l.Cluster.UploadURL }

// UploadClient is a plain client: the local cluster's proxy serves HTTP.
func (l local) UploadClient() *http.Client { return http.DefaultClient }
func (l local) StoreAccess(context.Context) (string, string, string, error) {
	return l.Store.Endpoint, l.Store.AccessKey, l.Store.SecretKey, nil
}
func (l local) StoreInCluster() string { return l.Store.Endpoint }
func (l local) StoreClient(context.Context) (*objectstore.Client, error) {
	c, err := objectstore.NewClient(l.Store.ClientConfig())
	if err == nil {
		c.ResolveNamespaces(tenancy.UIDs(l.Client))
	}
	return c, err
}
func (l local) AWS(ctx context.Context, args ...string) (string, error) {
	return l.Store.AWS(ctx, l.Store.SecretKey, args...)
}
func (l local) TenantAWS(ctx context.Context, ns string, args ...string) (string, error) {
	return testenv.TenantAWS(ctx, l.Client, l.Store.Endpoint, ns, args...)
}
func (l local) StopStore() error    { l.Store.Kill(); return nil }
func (l local) StartStore() error   { l.Store.Restart(); return nil }
func (l local) IdleImage() string   { return "quay.io/kubevirt/virt-launcher" }
func (l local) KubeVirt() bool      { return false }
func (l local) WaitKubeVirt() error { return nil }
func (l local) LogDirs() []string   { return []string{l.dir} }

// ErrNoPodNetwork says the local cluster's pods are processes of this machine, on no network
// a NetworkPolicy could govern.
var ErrNoPodNetwork = errors.New("the local cluster's pods share this machine's network: no NetworkPolicy can be enforced there")

func (l local) EnforceNetworkPolicies(context.Context) (func() error, error) {
	return nil, ErrNoPodNetwork
}

// real adapts the real cluster; kept holds its pods' logs when the run keeps them.
type real struct {
	*realcluster.Cluster
	kept string
}

func (r real) TenantAWS(ctx context.Context, ns string, args ...string) (string, error) {
	return testenv.TenantAWS(ctx, r.Client, realcluster.StoreEndpoint, ns, args...)
}
func (r real) Nodes() []string { return r.NodeNames() }
func (r real) LogDirs() []string {
	dirs := []string{filepath.Join(r.Dir(), "logs")}
	if r.kept != "" {
		dirs = append(dirs, r.kept)
	}
	return dirs
}
