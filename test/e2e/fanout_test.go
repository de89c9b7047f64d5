package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	realcluster "github.com/diskpipe/diskpipe/test/cluster"
)

// fanoutVMs is how many VMs make bench-fanout's fan-out, spread evenly over the nodes.
const fanoutVMs = 12

// fanoutData is the data bench-fanout's golden image holds beyond the bootable disk.
const fanoutData = 1 << 30

// These specs measure (make bench-fanout; CI leaves them out): one golden image on node-local
// storage, VMs on every node, the time to each VM's disk and guest, and the bytes moved, side
// by side in one run with the naive path (every disk a host-assisted copy of the golden PVC).
var _ = Describe("fan-out of a golden image to VMs on three nodes", afterKubeVirtRollout, multiNode, benchmark, func() {
	BeforeEach(requireKubeVirt)

	It("boots twelve VMs from one image of 1 GiB through per-node replicas, and through host-assisted copies of the golden PVC", func() {
		nodes := severalNodes()
		image := bigImage()
		paths := []struct{ name, imageSpec, diskSpec string }{
			{"replicas", "", ""},
			{"pre-warmed replicas", "  replicas: {nodeSelector: {}}\n", ""},
			{"naive", "", "cloneStrategy: HostAssisted"},
		}
		results := map[string]fanout{}
		for _, path := range paths {
			results[path.name] = fanOut(nodes, image, path.imageSpec, path.diskSpec)
			GinkgoWriter.Println(results[path.name].report(path.name))
		}
		n := results["naive"]
		for _, name := range []string{"replicas", "pre-warmed replicas"} {
			r := results[name]
			GinkgoWriter.Printf("naive / %s: disks filled p50 %.1fx, p95 %.1fx, max %.1fx; after their VM's node was chosen p50 %.1fx, p95 %.1fx, max %.1fx; "+
				"guests p50 %.1fx, max %.1fx; bytes copied by pods %.1fx\n", name,
				ratio(n.disks, r.disks, 50), ratio(n.disks, r.disks, 95), ratio(n.disks, r.disks, 100),
				ratio(n.placed, r.placed, 50), ratio(n.placed, r.placed, 95), ratio(n.placed, r.placed, 100),
				ratio(n.guests, r.guests, 50), ratio(n.guests, r.guests, 100), float64(n.copied)/float64(max(r.copied, 1)))
			Expect(r.origin).To(BeNumerically("<=", fanoutData+fanoutData/10), "the origin is read once")
			Expect(r.replicas).To(Equal(len(nodes)-1), "one replica on each node away from the image")
		}
	})
})

// bigImage writes a qcow2 image to the test server's directory: the bootable disk with
// fanoutData bytes of incompressible data after it, so that copies weigh. It returns its name.
func bigImage() string {
	GinkgoHelper()
	big := filepath.Join(work, "fanout.raw")
	run("cp", "--sparse=always", raw, big)
	f, err := os.OpenFile(big, os.O_WRONLY, 0)
	Expect(err).NotTo(HaveOccurred())
	info, err := f.Stat()
	Expect(err).NotTo(HaveOccurred())
	rng := rand.NewChaCha8([32]byte{1})
	buf := make([]byte, 4<<20)
	for off := int64(0); off < fanoutData; off += int64(len(buf)) {
		_, _ = rng.Read(buf)
		_, err := f.WriteAt(buf, info.Size()+off)
		Expect(err).NotTo(HaveOccurred())
	}
	Expect(f.Close()).To(Succeed())
	run("qemu-img", "convert", "-f", "raw", "-O", "qcow2", big, filepath.Join(work, "fanout.qcow2"))
	Expect(os.Remove(big)).To(Succeed())
	return "fanout.qcow2"
}

// fanout is one path's measurements.
type fanout struct {
	disks, guests []time.Duration // from kubectl apply, per VM: its disk's claim bound, its guest's line
	// placed is, per VM, from its disk's claim getting its node (the scheduler placed the VM's
	// pod) to the claim bound: the disk's own time, without KubeVirt's and the scheduler's.
	placed   []time.Duration
	warmed   time.Duration // from the image Ready to its replicas Ready (pre-warmed only)
	origin   int64         // bytes the origin served
	copied   int64         // bytes diskpipe's pods copied from volume to volume
	replicas int
}

// fanOut imports file into a node-local image in a namespace of its own, then makes fanoutVMs
// VMs spread over nodes, each booting from a DiskVolume of the image (with strategy, a
// DiskVolume spec line, or ""), and measures them; the namespace is deleted after.
func fanOut(nodes []string, file, imageSpec, strategy string) fanout {
	GinkgoHelper()
	ns := vmNamespace()
	before := servedBytes(file)
	importLocal(ns, "golden", file, imageSpec, nodes)
	var warmed time.Duration
	if imageSpec != "" { // pre-warmed: the VMs come once every node has its replica
		imported := time.Now()
		uid := kubectl("", "get", "vmimage", "golden", "-n", ns, "-o", "jsonpath={.metadata.uid}")
		Eventually(func() string {
			return observe("get", "diskvolumes", "-n", ns, "-l", "diskpipe.io/replica-of="+uid, "-o", "jsonpath={.items[*].status.phase}")
		}, 10*time.Minute, time.Second).Should(Equal(strings.TrimSpace(strings.Repeat("Ready ", len(nodes)-1))))
		warmed = time.Since(imported)
	}
	if strategy != "" {
		strategy = "  " + strategy + "\n"
	}
	var all strings.Builder
	for i := range fanoutVMs {
		fmt.Fprintf(&all, `apiVersion: diskvolume.kubesphere.io/v1alpha1
kind: DiskVolume
metadata:
  name: disk%d
spec:
  source:
    image: {name: golden, kind: VirtualMachineImage}
  storageClassName: %s
%s---
%s---
`, i, realcluster.LocalClass, strategy, onNode(kubeVirtVM(fmt.Sprintf("vm%d", i), "Once", fmt.Sprintf("disk%d", i)), nodes[i%len(nodes)]))
	}
	start := time.Now()
	kubectl(all.String(), "apply", "-n", ns, "-f", "-")
	res := fanout{disks: make([]time.Duration, fanoutVMs), guests: make([]time.Duration, fanoutVMs), placed: make([]time.Duration, fanoutVMs), warmed: warmed}
	node := make([]time.Duration, fanoutVMs)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer GinkgoRecover()
		Eventually(func() int {
			// One look at every claim a second: name, phase and node.
			claims := observe("get", "pvc", "-n", ns, "-o",
				`jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.metadata.annotations.volume\.kubernetes\.io/selected-node}{"\n"}{end}`)
			now := time.Since(start)
			for _, line := range strings.Split(claims, "\n") {
				var i int
				f := strings.Fields(line)
				if len(f) < 2 || !strings.HasPrefix(f[0], "disk") {
					continue
				}
				if _, err := fmt.Sscanf(f[0], "disk%d", &i); err != nil || i >= fanoutVMs {
					continue
				}
				if node[i] == 0 && (len(f) > 2 || f[1] == "Bound") {
					node[i] = now
				}
				if res.disks[i] == 0 && f[1] == "Bound" {
					res.disks[i], res.placed[i] = now, now-node[i]
				}
			}
			return slices.Index(res.disks, 0) + 1
		}, 20*time.Minute, time.Second).Should(BeZero(), "every disk filled")
	})
	for i := range fanoutVMs {
		wg.Go(func() {
			defer GinkgoRecover()
			guestConsoleWithin(ns, fmt.Sprintf("vm%d", i), "", 20*time.Minute)
			res.guests[i] = time.Since(start)
		})
	}
	wg.Wait()
	res.origin = servedBytes(file) - before
	res.copied = operationBytes(ns, "clone", "copy")
	uid := kubectl("", "get", "vmimage", "golden", "-n", ns, "-o", "jsonpath={.metadata.uid}")
	res.replicas = len(strings.Fields(kubectl("", "get", "diskvolumes", "-n", ns, "-l", "diskpipe.io/replica-of="+uid, "-o", "name")))
	kubectl("", "delete", "namespace", ns, "--wait=true", "--timeout=10m")
	return res
}

// report is the path's line of the benchmark's output.
func (f fanout) report(name string) string {
	warm := ""
	if f.warmed > 0 {
		warm = fmt.Sprintf(" (made in %.1f s after the image was Ready, before the VMs)", f.warmed.Seconds())
	}
	return fmt.Sprintf("%s: %d VMs; disks filled p50 %.1f s, p95 %.1f s, max %.1f s; after their VM's node was chosen p50 %.1f s, p95 %.1f s, max %.1f s; "+
		"guests' lines p50 %.1f s, p95 %.1f s, max %.1f s; origin served %.2f GiB; pods copied %.2f GiB between volumes; %d replicas%s",
		name, len(f.disks), pct(f.disks, 50).Seconds(), pct(f.disks, 95).Seconds(), pct(f.disks, 100).Seconds(),
		pct(f.placed, 50).Seconds(), pct(f.placed, 95).Seconds(), pct(f.placed, 100).Seconds(),
		pct(f.guests, 50).Seconds(), pct(f.guests, 95).Seconds(), pct(f.guests, 100).Seconds(),
		float64(f.origin)/(1<<30), float64(f.copied)/(1<<30), f.replicas, warm)
}

// pct is the p-th percentile of ds (nearest rank).
func pct(ds []time.Duration, p int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[max(0, (p*len(s)+99)/100-1)]
}

func ratio(a, b []time.Duration, p int) float64 {
	return pct(a, p).Seconds() / pct(b, p).Seconds()
}
