package e2e

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/diskpipe/diskpipe/objectstore"
	"github.com/diskpipe/diskpipe/test/framework"
)

// probed runs a probe pod in ns that GETs url, and returns how it ended: its termination
// message (the status and body, or why it got none) and whether it had a 200.
func probed(ns, name, url string) (string, bool) {
	GinkgoHelper()
	kubectl(probePod(name, cluster.Nodes()[0], "get", url), "apply", "-n", ns, "-f", "-")
	var phase string
	Eventually(func() string {
		phase = observe("get", "pod", name, "-n", ns, "-o", "jsonpath={.status.phase}")
		return phase
	}, 2*time.Minute, time.Second).Should(BeElementOf("Succeeded", "Failed"))
	msg := observe("get", "pod", name, "-n", ns, "-o", "jsonpath={.status.containerStatuses[0].state.terminated.message}")
	return strings.TrimSpace(msg), phase == "Succeeded"
}

// The chart's NetworkPolicies, obeyed: the real cluster runs kube-router's policy controller
// for these specs (its own network enforces none), and each policy admits what it must and
// refuses what it must.
var _ = Describe("NetworkPolicies, enforced", realProves, Ordered, func() {
	var control string // a tenant's pod to the store, before the policies are enforced
	BeforeAll(func() {
		if real() {
			msg, ok := probed(namespace(), "before", cluster.StoreInCluster()+objectstore.HealthPath)
			Expect(ok).To(BeTrue(), "without enforcement a tenant's pod reaches the store (the policies are not obeyed): %s", msg)
			control = msg
		}
		stop, err := cluster.EnforceNetworkPolicies(context.Background())
		if errors.Is(err, framework.ErrNoPodNetwork) {
			Skip(err.Error())
		}
		if stop != nil {
			DeferCleanup(func() {
				Expect(stop()).To(Succeed())
				// Ended, the policies are not obeyed any more: the specs after these run as before.
				msg, ok := probed(namespace(), "after", cluster.StoreInCluster()+objectstore.HealthPath)
				if !ok {
					out, _ := exec.Command("iptables-save").CombinedOutput()
					GinkgoWriter.Printf("iptables after kube-router:\n%s\n", out)
				}
				Expect(ok).To(BeTrue(), "after enforcement ended a tenant's pod does not reach the store: %s", msg)
			})
		}
		Expect(err).NotTo(HaveOccurred())
	})

	It("keep a tenant's pod from the store, and let diskpipe's importer in", func() {
		ns := namespace()
		// The upload proxy takes every source: the pod's network works.
		msg, ok := probed(ns, "to-proxy", cluster.UploadURL()+"/healthz")
		GinkgoWriter.Println("a tenant's pod to the upload proxy:", msg)
		Expect(ok).To(BeTrue(), "the upload proxy admits every source: %s", msg)
		// The store admits diskpipe's pods only: a tenant's plain pod gets no answer.
		msg, ok = probed(ns, "to-store", cluster.StoreInCluster()+objectstore.HealthPath)
		GinkgoWriter.Printf("a tenant's pod to the store: %q, before the policies were enforced: %q\n", msg, control)
		Expect(ok).To(BeFalse(), "a tenant's pod reached the store: %s", msg)
		Expect(msg).To(MatchRegexp(`(?i)timeout|refused|unreachable`), "refused by the policy, not answered")
		// An import from the store, by diskpipe's importer, goes through.
		importFromStore(ns, "netpol", "disk.qcow2", "through")
		sameDisk(golden(ns, "through"))
	})

	It("keep a tenant's pod from an importer's metrics, which the manager still reads", func() {
		ns := namespace()
		kubectl(vmi("slow", fmt.Sprintf("    http: %s/disk.qcow2?rate=100000", server))+"  resources:\n    requests:\n      storage: 128Mi\n", "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "vmimage", "slow"), time.Minute, time.Second).Should(Equal("Importing Running"))
		ip := ""
		Eventually(func() string {
			ip = observe("get", "pod", "vmim-slow-import-0", "-n", ns, "-o", "jsonpath={.status.podIP}")
			return ip
		}, time.Minute, time.Second).ShouldNot(BeEmpty())
		msg, ok := probed(ns, "to-importer", fmt.Sprintf("http://%s:8090/metrics", ip))
		GinkgoWriter.Printf("a tenant's pod to an importer's metrics: %q\n", msg)
		Expect(ok).To(BeFalse(), "a tenant's pod read an importer's metrics: %s", msg)
		Expect(msg).To(MatchRegexp(`(?i)timeout|refused|unreachable`), "refused by the policy, not answered")
		// The manager reads them: the image's progress moves.
		Eventually(func() string {
			return observe("get", "vmimage", "slow", "-n", ns, "-o", "jsonpath={.status.progress}")
		}, 2*time.Minute, time.Second).Should(MatchRegexp(`^[1-9][0-9]?(\.[0-9]+)?%$`))
		kubectl("", "delete", "vmimage", "slow", "-n", ns, "--wait=false")
	})

	It("keep a tenant's pod from a clone source, which the copy's importer reads", func() {
		owner, copier, other := namespace(), namespace(), namespace()
		importHTTP(owner, "golden", "disk.qcow2")
		kubectl("", "label", "vmimage", "golden", "-n", owner, "virtualmachine.kubesphere.io/image-public=yes")
		// The copier may run no pod yet: its copy's clone source starts, and serves while the
		// importer cannot be made.
		kubectl("apiVersion: v1\nkind: ResourceQuota\nmetadata:\n  name: no-pods\nspec:\n  hard:\n    pods: \"0\"\n", "apply", "-n", copier, "-f", "-")
		kubectl(diskOf("copy", owner, "Filesystem", "128Mi"), "apply", "-n", copier, "-f", "-")
		ip := ""
		Eventually(func() string {
			ip = observe("get", "pods", "-n", owner, "-l", "app.kubernetes.io/component=clone-source",
				"-o", `jsonpath={range .items[?(@.status.phase=="Running")]}{.status.podIP}{end}`)
			return ip
		}, 2*time.Minute, time.Second).Should(MatchRegexp(`^[0-9a-f.:]+$`))
		msg, ok := probed(other, "to-clone-source", fmt.Sprintf("https://%s:8091/disk", ip))
		GinkgoWriter.Printf("a tenant's pod to a clone source: %q\n", msg)
		Expect(ok).To(BeFalse(), "a tenant's pod reached a clone source: %s", msg)
		Expect(msg).To(MatchRegexp(`(?i)timeout|refused|unreachable`), "refused by the policy, not answered (a TLS or HTTP error is an answer)")
		// The copy's importer, once it may run, reads it.
		kubectl("", "delete", "resourcequota", "no-pods", "-n", copier)
		Eventually(phase(copier, "dvol", "copy"), 4*time.Minute, time.Second).Should(Equal("Ready Made"))
	})
})
