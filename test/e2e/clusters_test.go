package e2e

import (
	"context"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	realcluster "github.com/diskpipe/diskpipe/test/cluster"
	"github.com/diskpipe/diskpipe/test/localcluster"
	"github.com/diskpipe/diskpipe/test/testenv"
)

// Cluster is what the specs ask of a cluster. The local cluster (test/localcluster, the
// default) and the real node (test/cluster, DISKPIPE_E2E_CLUSTER=real, make test-cluster)
// each answer it, so that one suite runs on both.
type Cluster interface {
	Kubectl(ctx context.Context, stdin []byte, args ...string) (stdout, stderr string, err error)
	APIClient() client.Client
	EnsureNamespace(ctx context.Context, name string) error
	// HostAddress is where the test's own servers (HTTP sources, registries) listen so that
	// pods reach them.
	HostAddress() string
	// VolumePath is the directory that holds a bound PVC's bytes (disk.img or block.img).
	VolumePath(ns, pvc string) string
	// KillPod kills a running pod's process without a result, as a crash would.
	KillPod(ns, name string) error
	// RestartManager kills the manager and brings it back.
	RestartManager() error
	// AWS runs awscli against the bundled store with its keys.
	AWS(ctx context.Context, args ...string) (string, error)
	// StoreAccess is the bundled store's address outside the cluster and its keys, as a user
	// following the README finds them.
	StoreAccess(ctx context.Context) (endpoint, accessKey, secretKey string, err error)
	// StoreInCluster is the bundled store's address as pods reach it.
	StoreInCluster() string
	StopStore() error
	StartStore() error
	UploadURL() string
	// IdleImage is an image whose container runs until stopped, standing in for a VM's
	// virt-launcher (the local cluster runs only diskpipe's pods; the real node runs it).
	IdleImage() string
	// KubeVirt says whether the real KubeVirt runs VMs (the real node with DISKPIPE_KUBEVIRT=1);
	// WaitKubeVirt waits until it is Available (its rollout goes on beside the first specs).
	// Specs use kubeVirt(), which does both.
	KubeVirt() bool
	WaitKubeVirt() error
	// KubeconfigFile is an administrator's kubeconfig (client certificates), for kubectl plugins.
	KubeconfigFile() string
	Stop()
}

// localProves labels a spec whose proof is the same on any cluster: what it checks is a
// client's behaviour (kubectl diskpipe, its terminal output, its retries through the test's
// proxy), the importer's verdict on a format, a checksum or a source that goes away, a
// controller's policy (schedules, volume knobs), the bundled store's accounts, or the test's
// own QEMU boot check. make test runs it on the local cluster; make test-cluster leaves it out
// (E2E_LABELS), so that the real node's time goes to what only it shows: a kubelet and
// containerd running diskpipe's image, CSI, Kubernetes' controllers, and KubeVirt.
var localProves = Label("local-proves")

// realProves labels a spec that runs the same on both clusters and that CI proves on the real
// node (make test-cluster), where a kubelet, containerd and CSI run it: the seed's stories, the
// faults, block volumes. make test leaves it out on the local cluster (E2E_LOCAL_LABELS), so that
// CI's two cores do not run the same story twice; E2E_LOCAL_LABELS= runs every spec there.
var realProves = Label("real-proves")

// benchmark labels a spec that measures rather than proves: make bench-kubevirt runs it on the
// real node, and make test-cluster leaves it out (E2E_LABELS).
var benchmark = Label("bench")

// real says whether the suite runs on the real node.
func real() bool { return os.Getenv("DISKPIPE_E2E_CLUSTER") == "real" }

func startCluster(work string) (Cluster, error) {
	if real() {
		o := realcluster.DefaultOptions(GinkgoWriter)
		o.KubeVirtLater = true
		return realcluster.Start(context.Background(), o)
	}
	c, err := localcluster.Start(context.Background(), localcluster.Options{Bin: testenv.Path("bin"), Dir: filepath.Join(work, "cluster"), Log: GinkgoWriter})
	if err != nil {
		return nil, err
	}
	return local{c}, nil
}

// local adapts the local cluster.
type local struct{ *localcluster.Cluster }

func (l local) APIClient() client.Client { return l.Client }
func (l local) HostAddress() string      { return "127.0.0.1" }
func (l local) AWS(ctx context.Context, args ...string) (string, error) {
	return l.Store.AWS(ctx, l.Store.SecretKey, args...)
}
func (l local) StoreAccess(context.Context) (string, string, string, error) {
	return l.Store.Endpoint, l.Store.AccessKey, l.Store.SecretKey, nil
}
func (l local) StoreInCluster() string { return l.Store.Endpoint }
func (l local) StopStore() error       { l.Store.Kill(); return nil }
func (l local) StartStore() error      { l.Store.Restart(); return nil }
func (l local) UploadURL() string      { return l.Cluster.UploadURL }
func (l local) IdleImage() string      { return "quay.io/kubevirt/virt-launcher" }
func (l local) KubeconfigFile() string { return l.Kubeconfig }
func (l local) KubeVirt() bool         { return false }
func (l local) WaitKubeVirt() error    { return nil }

// kubeVirt says whether the real KubeVirt runs VMs, and where it does, waits until it is
// Available: a spec that makes a KubeVirt VM, or has diskpipe's manager make one, asks it first.
func kubeVirt() bool {
	GinkgoHelper()
	if !cluster.KubeVirt() {
		return false
	}
	Expect(cluster.WaitKubeVirt()).To(Succeed(), "KubeVirt's rollout")
	return true
}

// afterKubeVirtRollout runs a container's specs after those that do not call kubeVirt(), so
// that the others run while KubeVirt rolls out on the real node (minutes on two cores) instead
// of the first of them waiting for it. Every container whose specs call kubeVirt() has it.
var afterKubeVirtRollout = SpecPriority(-1)
