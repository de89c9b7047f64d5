package e2e

import (
	"context"
	"os"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/diskpipe/diskpipe/test/framework"
)

// Cluster is what the specs ask of a cluster: test/framework's, answered by the local cluster
// (the default) and the real node (DISKPIPE_E2E_CLUSTER=real, make test-cluster), so that one
// suite runs on both.
type Cluster = framework.Cluster

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
	o := framework.Options{Kind: framework.Local, Dir: work, Log: GinkgoWriter}
	if real() {
		o.Kind, o.KubeVirtLater = framework.Real, true
	}
	return framework.Start(context.Background(), o)
}

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
