package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	realcluster "github.com/diskpipe/diskpipe/test/cluster"
	"github.com/diskpipe/diskpipe/test/localcluster"
	"github.com/diskpipe/diskpipe/test/testenv"
)

// demoCluster is what the demo asks of a cluster: the local cluster (the fast default) or
// the real single-node cluster (--cluster=real, make demo CLUSTER=real), on which helm
// installed diskpipe's image.
type demoCluster interface {
	Kubectl(ctx context.Context, stdin []byte, args ...string) (stdout, stderr string, err error)
	// AWS runs awscli against the bundled store as a user of namespace ns, with its keys.
	AWS(ctx context.Context, ns string, args ...string) (string, error)
	EnsureNamespace(ctx context.Context, name string) error
	// HostAddress is where the demo's HTTP server listens so that pods reach it.
	HostAddress() string
	// StoreEndpoint is the bundled store's address as awscli and curl reach it.
	StoreEndpoint() string
	KubeconfigPath() string
	// VolumePath is the directory holding a bound PVC's bytes (disk.img).
	VolumePath(ns, pvc string) string
	// Logs says where the cluster's logs are.
	Logs() string
	// KubeVirt says whether the real KubeVirt runs VMs (the real node).
	KubeVirt() bool
	Stop()
}

func startCluster(ctx context.Context, kind, root, dir string) (demoCluster, error) {
	switch kind {
	case "local":
		say("Starting the local cluster (etcd, kube-apiserver, object store, manager, upload proxy, node agent, CSI stand-in) in %s", dir)
		c, err := localcluster.Start(ctx, localcluster.Options{Bin: filepath.Join(root, "bin"), Dir: dir, Log: os.Stdout})
		if err != nil {
			return nil, err
		}
		return local{c, dir}, nil
	case "real":
		o := realcluster.DefaultOptions(os.Stdout)
		o.KubeVirt = true
		if err := realcluster.Preflight(o.Bin); err != nil {
			return nil, err
		}
		say("Starting a real single-node Kubernetes in %s (etcd, kube-apiserver, controller-manager, scheduler, kubelet, containerd, kube-proxy, CoreDNS, CSI sidecars), KubeVirt installed by its operator, then helm install diskpipe from its image", o.Dir)
		c, err := realcluster.Start(ctx, o)
		if err != nil {
			return nil, err
		}
		return realNode{c}, nil
	}
	return nil, fmt.Errorf("--cluster=%s: want local or real", kind)
}

type local struct {
	*localcluster.Cluster
	dir string
}

func (l local) AWS(ctx context.Context, ns string, args ...string) (string, error) {
	return testenv.TenantAWS(ctx, l.Client, l.Store.Endpoint, ns, args...)
}
func (l local) HostAddress() string    { return "127.0.0.1" }
func (l local) StoreEndpoint() string  { return l.Store.Endpoint }
func (l local) KubeconfigPath() string { return l.Kubeconfig }
func (l local) Logs() string           { return l.dir + "/*.log and " + l.dir + "/pods/*/*/log" }
func (l local) KubeVirt() bool         { return false }

type realNode struct{ *realcluster.Cluster }

func (r realNode) StoreEndpoint() string { return realcluster.StoreEndpoint }
func (r realNode) AWS(ctx context.Context, ns string, args ...string) (string, error) {
	return testenv.TenantAWS(ctx, r.Client, realcluster.StoreEndpoint, ns, args...)
}
func (r realNode) KubeconfigPath() string { return r.Kubeconfig }
func (r realNode) Logs() string           { return r.Dir() + "/logs/" }
