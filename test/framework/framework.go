// Package framework is the one face of a test cluster that every driver uses: the end-to-end
// suite (test/e2e), the demo (test/demo), the chaos run (test/chaos) and the benchmarks
// (test/bench). Two clusters answer it: the local cluster (test/localcluster: etcd, an
// apiserver, diskpipe's processes and a node agent, fast) and the real cluster (test/cluster:
// kubelet, containerd, CSI and, on request, KubeVirt, from diskpipe's image and chart). A
// driver names the kind and the node count in Options; what it asks of either is Cluster.
package framework

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/objectstore"
	realcluster "github.com/diskpipe/diskpipe/test/cluster"
	"github.com/diskpipe/diskpipe/test/localcluster"
	"github.com/diskpipe/diskpipe/test/testenv"
)

// Cluster is what a driver asks of a running cluster.
type Cluster interface {
	// Kubectl runs kubectl as the administrator.
	Kubectl(ctx context.Context, stdin []byte, args ...string) (stdout, stderr string, err error)
	// APIClient is a direct client as the administrator.
	APIClient() client.Client
	// KubeconfigFile is an administrator's kubeconfig (client certificates).
	KubeconfigFile() string
	// EnsureNamespace makes a namespace that enforces Pod Security "restricted".
	EnsureNamespace(ctx context.Context, name string) error
	// Nodes are the names of the cluster's nodes, the first the one diskpipe runs on.
	Nodes() []string
	// HostAddress is where a driver's own servers (HTTP sources, registries) listen so that
	// pods reach them.
	HostAddress() string
	// VolumePath is the directory that holds a bound PVC's bytes (disk.img or block.img).
	VolumePath(ns, pvc string) string
	// KillPod kills a running pod's process without a result, as a crash would.
	KillPod(ns, name string) error
	// RestartManager kills the manager without warning and brings it back.
	RestartManager() error
	// ManagerCounter sums a counter of the manager's metrics over every run of it.
	ManagerCounter(name string) (float64, error)
	// UploadURL is the upload proxy's address outside the cluster; UploadClient reaches it,
	// verifying the certificate it serves where it serves HTTPS.
	UploadURL() string
	UploadClient() *http.Client
	// StoreAccess is the bundled store's address outside the cluster and its root keys, as
	// a user following the README finds them; StoreInCluster its address as pods reach it.
	StoreAccess(ctx context.Context) (endpoint, accessKey, secretKey string, err error)
	StoreInCluster() string
	// StoreClient reaches the bundled store as its root.
	StoreClient(ctx context.Context) (*objectstore.Client, error)
	// AWS runs awscli against the bundled store as its root; TenantAWS as namespace ns, with
	// the keys diskpipe gave it.
	AWS(ctx context.Context, args ...string) (string, error)
	TenantAWS(ctx context.Context, ns string, args ...string) (string, error)
	// StopStore and StartStore take the bundled store away and bring it back.
	StopStore() error
	StartStore() error
	// IdleImage is an image whose container runs until stopped, standing in for a VM's
	// virt-launcher where KubeVirt does not run.
	IdleImage() string
	// KubeVirt says whether the real KubeVirt runs VMs; WaitKubeVirt waits until it is
	// Available (with KubeVirtLater, its rollout goes on after Start returns).
	KubeVirt() bool
	WaitKubeVirt() error
	// EnforceNetworkPolicies makes the pods' traffic obey the cluster's NetworkPolicies until
	// stop (the real cluster runs kube-router's policy controller on its nodes); the local
	// cluster, whose pods are processes of this machine, cannot, and says so.
	EnforceNetworkPolicies(ctx context.Context) (stop func() error, err error)
	// ConsoleURL is where a browser on this machine opens the console's pages; stop ends
	// what reaching it needed.
	ConsoleURL(ctx context.Context) (url string, stop func(), err error)
	// LogDirs hold every log of the cluster's processes and pods.
	LogDirs() []string
	Stop()
}

// Kinds of cluster.
const (
	Local = "local"
	Real  = "real"
)

// Options say which cluster to start.
type Options struct {
	// Kind is Local (the default) or Real.
	Kind string
	// Nodes is how many nodes the cluster has: several on Real only; 0 is 1, or on Real
	// DISKPIPE_NODES (make ... NODES=3).
	Nodes int
	// Dir holds what the cluster writes (the local cluster's volumes and logs; the real
	// cluster keeps its own directory, realcluster.DefaultDir, and its pods' logs here).
	Dir string
	// Log receives what the cluster does.
	Log io.Writer
	// KubeVirt installs the real KubeVirt (Real only; DISKPIPE_KUBEVIRT=1 does too);
	// KubeVirtLater returns before its rollout ends.
	KubeVirt, KubeVirtLater bool
	// KeepPodLogs keeps every pod's log in Dir, also those of pods long deleted (Real; the
	// local cluster keeps them all anyway).
	KeepPodLogs bool
}

// Start starts the cluster o names.
func Start(ctx context.Context, o Options) (Cluster, error) {
	switch o.Kind {
	case Local, "":
		if o.Nodes > 1 {
			return nil, fmt.Errorf("the local cluster has one node, not %d: the real cluster has several (%s)", o.Nodes, Real)
		}
		if o.KubeVirt {
			return nil, fmt.Errorf("KubeVirt runs only on the real cluster")
		}
		c, err := localcluster.Start(ctx, localcluster.Options{Bin: testenv.Path("bin"), Dir: filepath.Join(o.Dir, "cluster"), Log: o.Log})
		if err != nil {
			return nil, err
		}
		return local{c, filepath.Join(o.Dir, "cluster")}, nil
	case Real:
		ro := realcluster.DefaultOptions(o.Log)
		ro.KubeVirt, ro.KubeVirtLater = ro.KubeVirt || o.KubeVirt, o.KubeVirtLater
		if o.Nodes > 0 {
			ro.Nodes = o.Nodes
		}
		if err := realcluster.Preflight(ro.Bin); err != nil {
			return nil, err
		}
		c, err := realcluster.Start(ctx, ro)
		if err != nil {
			return nil, err
		}
		r := real{Cluster: c}
		if o.KeepPodLogs {
			// The kubelet removes a finished pod's log; a run that searches them all keeps them.
			r.kept = filepath.Join(o.Dir, "pod-logs")
			if err := c.KeepPodLogs(ctx, r.kept); err != nil {
				c.Stop()
				return nil, err
			}
		}
		return r, nil
	}
	return nil, fmt.Errorf("a cluster of kind %q: want %s or %s", o.Kind, Local, Real)
}

// RealNode is the real cluster behind c, for what a spec reads beyond Cluster (its CSI
// driver's files, its release's names); false on the local cluster.
func RealNode(c Cluster) (*realcluster.Cluster, bool) {
	r, ok := c.(real)
	return r.Cluster, ok
}

// LocalCluster is the local cluster behind c, for what a benchmark reads beyond Cluster (its
// processes' IDs); false on the real cluster.
func LocalCluster(c Cluster) (*localcluster.Cluster, bool) {
	l, ok := c.(local)
	return l.Cluster, ok
}
