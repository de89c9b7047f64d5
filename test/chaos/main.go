// Command chaos runs many imports, clones and exports on the local cluster while it breaks
// things — the manager SIGKILLed and restarted again and again, importer and exporter pods
// killed, the object store stopped and started, a source server that drops connections; on a
// real cluster of several nodes also a node's kubelet and containerd stopped and started, while
// node-local images are copied to every node — and then checks that nothing was lost: `make
// chaos` (full size), `make chaos CHAOS_FLAGS=...`, `make chaos CLUSTER=real NODES=3`.
//
// It prints a table of what it did and found, and exits 1 when a check fails. The faults'
// times and targets come from -seed, so a failing run can be repeated.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	realcluster "github.com/diskpipe/diskpipe/test/cluster"
	"github.com/diskpipe/diskpipe/test/framework"
	"github.com/diskpipe/diskpipe/test/testenv"
)

type config struct {
	images, disks, exports              int
	managerKills, podKills, storeStarts int
	nodeStops, localImages              int
	loseNode                            bool
	seed                                uint64
	sourceRate                          int64
	timeout                             time.Duration
	keep                                bool
	cluster                             string
}

func main() {
	var c config
	flag.IntVar(&c.images, "images", 50, "VirtualMachineImages imported at once")
	flag.IntVar(&c.disks, "disks", 100, "DiskVolumes cloned from them, across the three clone strategies")
	flag.IntVar(&c.exports, "exports", 10, "exports of those disks to the bundled store")
	flag.IntVar(&c.managerKills, "manager-kills", 20, "times the manager is SIGKILLed and restarted")
	flag.IntVar(&c.podKills, "pod-kills", 10, "importer and exporter pods killed")
	flag.IntVar(&c.storeStarts, "store-restarts", 2, "times the object store is stopped and started")
	flag.IntVar(&c.nodeStops, "node-stops", 2, "times a node's kubelet and containerd are stopped and started (several nodes only)")
	flag.IntVar(&c.localImages, "local-images", 6, "images on the node-local class, each copied to every other node (several nodes only)")
	flag.BoolVar(&c.loseNode, "lose-node", true, "after the checks, take the last node away for good: its replicas must be reported lost (several nodes only)")
	flag.Int64Var(&c.sourceRate, "source-rate", 256<<10, "bytes per second of each response of the HTTP source, a slow mirror: the work lasts long enough for the faults")
	flag.Uint64Var(&c.seed, "seed", uint64(time.Now().UnixNano()%100000), "seed of the faults")
	flag.DurationVar(&c.timeout, "timeout", 20*time.Minute, "the whole run's limit")
	flag.BoolVar(&c.keep, "keep", false, "keep the run's directory")
	flag.StringVar(&c.cluster, "cluster", "local", "where to run: local (the local cluster) or real (the real node, as root)")
	flag.Parse()
	fmt.Printf("chaos: seed %d (repeat with -seed %d)\n", c.seed, c.seed)
	ok, err := run(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

// row is one line of the final table.
type row struct {
	what, got, want string
	ok              bool
}

func run(c config) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	dir, err := os.MkdirTemp("", "diskpipe-chaos-")
	if err != nil {
		return false, err
	}
	if !c.keep {
		defer os.RemoveAll(dir)
	}
	log, err := os.Create(filepath.Join(dir, "chaos.log"))
	if err != nil {
		return false, err
	}
	defer log.Close()
	fmt.Printf("chaos: %s cluster, run in %s\n", c.cluster, dir)
	cl, err := framework.Start(ctx, framework.Options{Kind: c.cluster, Dir: dir, Log: log, KeepPodLogs: true})
	if err != nil {
		return false, err
	}
	defer cl.Stop()
	k := cl.APIClient()
	if len(cl.Nodes()) < 2 {
		// A node's agents stopped on the only node would stop everything; a node-local image
		// has no other node to be copied to.
		c.nodeStops, c.localImages = 0, 0
	}

	// Sources: the tests' bootable disk as qcow2, compressed qcow2 and vmdk from an HTTP
	// server that drops one response in ten, and as raw from the bundled store.
	raw := testenv.Path("bin", "bootdisk", "disk.raw")
	files := map[string]string{"disk.qcow2": testenv.Path("bin", "bootdisk", "disk.qcow2"), "disk.vmdk": testenv.Path("bin", "bootdisk", "disk.vmdk")}
	compressed := filepath.Join(dir, "disk-compressed.qcow2")
	if out, err := exec.Command("qemu-img", "convert", "-c", "-f", "raw", "-O", "qcow2", raw, compressed).CombinedOutput(); err != nil {
		return false, fmt.Errorf("qemu-img convert: %w: %s", err, out)
	}
	files["disk-compressed.qcow2"] = compressed
	src := &flaky{files: files, rng: rand.New(rand.NewPCG(c.seed, 1)), rate: c.sourceRate}
	l, err := net.Listen("tcp", net.JoinHostPort(cl.HostAddress(), "0"))
	if err != nil {
		return false, err
	}
	srv := &http.Server{Handler: src, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	base := "http://" + l.Addr().String() + "/"
	namespaces := []string{"chaos-a", "chaos-b", "chaos-c"}
	for _, ns := range namespaces {
		if err := cl.EnsureNamespace(ctx, ns); err != nil {
			return false, err
		}
	}
	if err := shareSource(ctx, cl, raw, namespaces); err != nil {
		return false, err
	}

	// Faults, at seeded times, while the work runs; each one is printed with its time, so that
	// a run that fails where its directory is gone (CI) still says what happened when.
	start := time.Now()
	f := &faults{c: c, cl: cl, rng: rand.New(rand.NewPCG(c.seed, 2)), log: &stamped{w: io.MultiWriter(log, os.Stdout), start: start}}
	faultCtx, stopFaults := context.WithCancel(ctx)
	defer stopFaults()
	var fwg sync.WaitGroup
	fwg.Go(func() { f.run(faultCtx) })
	// The node stops run on the run's context: the work may end before the last of them, which
	// is waited for once the other faults have stopped (a store restarted while its new pod's
	// node is stopped would not come back within the run).
	var nwg sync.WaitGroup
	nwg.Go(func() { f.stopNodes(ctx) })

	sources := []func(i int) hypercloud.VirtualMachineImageSource{
		func(int) hypercloud.VirtualMachineImageSource {
			return hypercloud.VirtualMachineImageSource{HTTP: common.HTTPURL(base + "disk.qcow2")}
		},
		func(int) hypercloud.VirtualMachineImageSource {
			return hypercloud.VirtualMachineImageSource{HTTP: common.HTTPURL(base + "disk-compressed.qcow2")}
		},
		func(int) hypercloud.VirtualMachineImageSource {
			return hypercloud.VirtualMachineImageSource{HTTP: common.HTTPURL(base + "disk.vmdk")}
		},
		func(int) hypercloud.VirtualMachineImageSource {
			return hypercloud.VirtualMachineImageSource{ObjectStore: &common.ObjectStoreSource{BucketName: "chaos-src", ObjectName: "disk.raw"}}
		},
	}
	// makeImages creates n images named prefix-<i>, spread over the namespaces and sources;
	// local ones are on the node-local class, each pre-warmed on every node.
	makeImages := func(prefix string, n int, local bool) ([]*hypercloud.VirtualMachineImage, error) {
		var made []*hypercloud.VirtualMachineImage
		for i := range n {
			img := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, i), Namespace: namespaces[i%len(namespaces)]},
				Spec: hypercloud.VirtualMachineImageSpec{Source: sources[i%len(sources)](i), Retry: retries()}}
			q := resource.MustParse("128Mi")
			img.Spec.Resources.Requests.Storage = &q
			if local {
				img.Spec.StorageClassName = ptr.To(realcluster.LocalClass)
				img.Spec.Replicas = &common.ReplicaPolicy{NodeSelector: &metav1.LabelSelector{}}
			}
			if err := create(ctx, k, img); err != nil {
				return nil, err
			}
			made = append(made, img)
		}
		return made, nil
	}
	images, err := makeImages("image", c.images, false)
	if err != nil {
		return false, err
	}
	// Node-local images: copies between nodes while nodes stop.
	locals, err := makeImages("local", c.localImages, true)
	if err != nil {
		return false, err
	}
	// Each strategy asked for, and none: the installation's default (Automatic, a restore of
	// the image's golden snapshot on the shared storage these images are on).
	strategies := []*common.CloneStrategy{ptr.To(common.CloneStrategyCSIClone), ptr.To(common.CloneStrategySnapshot),
		ptr.To(common.CloneStrategyHostAssisted), nil}
	var disks []*diskvolume.DiskVolume
	for i := range c.disks {
		img := images[i%len(images)]
		d := &diskvolume.DiskVolume{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("disk-%d", i), Namespace: img.Namespace},
			Spec: diskvolume.DiskVolumeSpec{Source: diskvolume.DiskVolumeSource{Image: &diskvolume.ImageSource{
				Name: common.LocalName(img.Name), Kind: diskvolume.ImageKindVirtualMachineImage}}, CloneStrategy: strategies[i%len(strategies)], Retry: retries()}}
		if err := create(ctx, k, d); err != nil {
			return false, err
		}
		disks = append(disks, d)
	}
	if err := waitFinal(ctx, k, "images", func() client.ObjectList { return &hypercloud.VirtualMachineImageList{} }, c.images+c.localImages); err != nil {
		return false, stuck(k, err)
	}
	imagesDone := time.Since(start)

	var exports []*hypercloud.VirtualMachineVolumeExport
	for i := range c.exports {
		img := images[i%len(images)]
		if err := k.Get(ctx, client.ObjectKeyFromObject(img), img); err != nil {
			return false, err
		}
		ex := &hypercloud.VirtualMachineVolumeExport{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("export-%d", i), Namespace: img.Namespace},
			Spec: hypercloud.VirtualMachineVolumeExportSpec{PVCName: img.Status.PVCName,
				ObjectStore: &common.ObjectStoreSource{BucketName: common.BucketName(exportBucket(img.Namespace)), ObjectName: common.ObjectName(fmt.Sprintf("export-%d.qcow2", i))}, Retry: retries()}}
		if err := create(ctx, k, ex); err != nil {
			return false, err
		}
		exports = append(exports, ex)
	}
	if err := waitFinal(ctx, k, "disks", func() client.ObjectList { return &diskvolume.DiskVolumeList{} }, c.disks); err != nil {
		return false, stuck(k, err)
	}
	if err := waitFinal(ctx, k, "exports", func() client.ObjectList { return &hypercloud.VirtualMachineVolumeExportList{} }, c.exports); err != nil {
		return false, stuck(k, err)
	}
	if err := waitReplicas(ctx, k, locals, len(cl.Nodes())-1); err != nil {
		return false, stuck(k, err)
	}
	// On a fast run the work may be final before the faults' seeded moments have all come (a
	// manager restart waits for the new pod, behind a stopped node): the faults go on until
	// each kind the checks count has happened as often as they ask, within a few minutes, and
	// the checks then hold for the objects at rest as well.
	for deadline := time.Now().Add(5 * time.Minute); !f.enough() && time.Now().Before(deadline); {
		time.Sleep(time.Second)
	}
	stopFaults()
	fwg.Wait()
	nwg.Wait()
	// The manager may be down at the end of the faults: bring it back for the checks.
	if f.managerDown.Load() {
		_ = cl.RestartManager()
	}
	total := time.Since(start)
	time.Sleep(5 * time.Second) // the last reconciles clean up after the final phases

	rows := check(ctx, c, cl, raw, images, locals, disks, exports)
	if c.loseNode && c.localImages > 0 {
		rows = append(rows, loseNode(ctx, cl, locals)...)
	}
	rows = append([]row{
		{"manager SIGKILLed and restarted", fmt.Sprint(f.managerKills.Load()), fmt.Sprint(c.managerKills), f.managerKills.Load() >= int64(c.managerKills)/2},
		{"importer/exporter pods killed", fmt.Sprint(f.podKills.Load()), fmt.Sprint(c.podKills), c.podKills == 0 || f.podKills.Load() > 0},
		{"object store stopped and started", fmt.Sprint(f.storeStarts.Load()), fmt.Sprint(c.storeStarts), f.storeStarts.Load() >= int64(c.storeStarts)},
		{"node agents (kubelet, containerd) stopped and started", fmt.Sprint(f.nodeStops.Load()), fmt.Sprint(c.nodeStops), f.nodeStops.Load() >= int64(c.nodeStops)},
		{"source responses cut", fmt.Sprint(src.cut.Load()), "> 0", src.cut.Load() > 0},
		{"time: images Ready / everything", fmt.Sprintf("%.0f s / %.0f s", imagesDone.Seconds(), total.Seconds()), fmt.Sprintf("< %s", c.timeout), true},
	}, rows...)
	allOK := true
	fmt.Printf("\n%-46s %-22s %-12s %s\n", "check", "got", "want", "")
	for _, r := range rows {
		mark := "ok"
		if !r.ok {
			mark, allOK = "FAIL", false
		}
		fmt.Printf("%-46s %-22s %-12s %s\n", r.what, r.got, r.want, mark)
	}
	if !allOK {
		fmt.Printf("\nchaos: failed; repeat with -seed %d -keep, logs in %s\n", c.seed, dir)
	}
	return allOK, nil
}

func retries() *common.RetryLimit { r := common.RetryLimit(20); return &r }

// create creates obj, retrying while the apiserver's webhooks are away with the manager.
func create(ctx context.Context, k client.Client, obj client.Object) error {
	for {
		err := k.Create(ctx, obj)
		if err == nil || ctx.Err() != nil {
			return err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// waitFinal waits until n objects of list's kind are Ready or Failed.
func waitFinal(ctx context.Context, k client.Client, what string, list func() client.ObjectList, n int) error {
	last := time.Now()
	for {
		phases, err := phasesOf(ctx, k, list())
		fin, ready := 0, 0
		for _, p := range phases {
			if final(p) {
				fin++
			}
			if p == common.PhaseReady {
				ready++
			}
		}
		if err == nil && fin >= n {
			fmt.Printf("chaos: %s: %d Ready, %d Failed\n", what, ready, fin-ready)
			return nil
		}
		if time.Since(last) > 30*time.Second {
			fmt.Printf("chaos: %s: %d of %d final\n", what, fin, n)
			last = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %d of %d final when the time ran out", what, fin, n)
		case <-time.After(time.Second):
		}
	}
}

func final(p common.Phase) bool { return p == common.PhaseReady || p == common.PhaseFailed }

// phasesOf lists the phases of the objects of l's kind.
func phasesOf(ctx context.Context, k client.Client, l client.ObjectList) ([]common.Phase, error) {
	if err := k.List(ctx, l); err != nil {
		return nil, err
	}
	var ps []common.Phase
	switch l := l.(type) {
	case *hypercloud.VirtualMachineImageList:
		for _, o := range l.Items {
			ps = append(ps, o.Status.Phase)
		}
	case *diskvolume.DiskVolumeList:
		for _, o := range l.Items {
			if !isReplica(&o) {
				ps = append(ps, o.Status.Phase)
			}
		}
	case *hypercloud.VirtualMachineVolumeExportList:
		for _, o := range l.Items {
			ps = append(ps, o.Status.Phase)
		}
	}
	return ps, nil
}

// stamped prefixes each write, a line, with the seconds since start.
type stamped struct {
	mu    sync.Mutex
	w     io.Writer
	start time.Time
}

func (s *stamped) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := fmt.Fprintf(s.w, "%6.1f s ", time.Since(s.start).Seconds()); err != nil {
		return 0, err
	}
	return s.w.Write(p)
}

// stuck prints every object of the run that is not final, with its conditions, and where the
// run's pods and the nodes are, then returns err: what a failed wait needs to be understood
// once the run's directory is gone.
func stuck(k client.Client, err error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fmt.Printf("chaos: what is not final:\n")
	conds := func(cs []metav1.Condition) string {
		var b strings.Builder
		for _, c := range cs {
			fmt.Fprintf(&b, "\n      %s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message)
		}
		return b.String()
	}
	images := &hypercloud.VirtualMachineImageList{}
	if k.List(ctx, images) == nil {
		for _, o := range images.Items {
			if !final(o.Status.Phase) || len(o.Status.Replicas) > 0 {
				fmt.Printf("  image %s/%s %s replicas %v%s\n", o.Namespace, o.Name, o.Status.Phase, o.Status.Replicas, conds(o.Status.Conditions))
			}
		}
	}
	disks := &diskvolume.DiskVolumeList{}
	if k.List(ctx, disks) == nil {
		for _, o := range disks.Items {
			if !final(o.Status.Phase) {
				fmt.Printf("  disk %s/%s %s%s\n", o.Namespace, o.Name, o.Status.Phase, conds(o.Status.Conditions))
			}
		}
	}
	exports := &hypercloud.VirtualMachineVolumeExportList{}
	if k.List(ctx, exports) == nil {
		for _, o := range exports.Items {
			if !final(o.Status.Phase) {
				fmt.Printf("  export %s/%s %s%s\n", o.Namespace, o.Name, o.Status.Phase, conds(o.Status.Conditions))
			}
		}
	}
	pods := &corev1.PodList{}
	if k.List(ctx, pods) == nil {
		for _, p := range pods.Items {
			if p.Status.Phase != corev1.PodSucceeded {
				fmt.Printf("  pod %s/%s on %q %s\n", p.Namespace, p.Name, p.Spec.NodeName, p.Status.Phase)
			}
		}
	}
	nodes := &corev1.NodeList{}
	if k.List(ctx, nodes) == nil {
		for _, n := range nodes.Items {
			ready := "unknown"
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady {
					ready = fmt.Sprintf("%s since %s", c.Status, c.LastTransitionTime.Format(time.TimeOnly))
				}
			}
			fmt.Printf("  node %s Ready=%s taints %v\n", n.Name, ready, n.Spec.Taints)
		}
	}
	return err
}

// faults breaks things at seeded moments.
type faults struct {
	c   config
	cl  framework.Cluster
	rng *rand.Rand
	log io.Writer

	managerKills, podKills, storeStarts atomic.Int64
	nodeStops                           atomic.Int64
	managerDown                         atomic.Bool
}

func (f *faults) run(ctx context.Context) {
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(300+f.rng.IntN(1200)) * time.Millisecond):
		}
		switch n := f.rng.IntN(10); {
		case n < 5 && f.managerKills.Load() < int64(f.c.managerKills):
			f.managerDown.Store(true)
			if err := f.cl.RestartManager(); err != nil {
				fmt.Fprintf(f.log, "chaos: restarting the manager: %v\n", err)
				continue
			}
			f.managerDown.Store(false)
			f.managerKills.Add(1)
			fmt.Fprintf(f.log, "chaos: manager SIGKILLed and restarted (%d)\n", f.managerKills.Load())
		case n < 9 && f.podKills.Load() < int64(f.c.podKills):
			pods := &corev1.PodList{}
			if err := f.cl.APIClient().List(ctx, pods); err != nil {
				continue
			}
			var running []corev1.Pod
			for _, p := range pods.Items {
				if p.Status.Phase == corev1.PodRunning && strings.HasPrefix(p.Namespace, "chaos-") {
					running = append(running, p)
				}
			}
			if len(running) == 0 {
				continue
			}
			p := running[f.rng.IntN(len(running))]
			if f.cl.KillPod(p.Namespace, p.Name) == nil {
				f.podKills.Add(1)
				fmt.Fprintf(f.log, "chaos: killed pod %s/%s\n", p.Namespace, p.Name)
			}
		case f.storeStarts.Load() < int64(f.c.storeStarts):
			if err := f.cl.StopStore(); err != nil {
				fmt.Fprintf(f.log, "chaos: stopping the store: %v\n", err)
				continue
			}
			time.Sleep(time.Duration(1+f.rng.IntN(4)) * time.Second)
			if err := f.cl.StartStore(); err != nil {
				fmt.Fprintf(f.log, "chaos: starting the store: %v\n", err)
			}
			f.storeStarts.Add(1)
			fmt.Fprintf(f.log, "chaos: object store stopped and started\n")
		}
	}
}

// enough says whether the manager kills and store restarts the checks count have happened.
func (f *faults) enough() bool {
	return f.managerKills.Load() >= int64(f.c.managerKills)/2 && f.storeStarts.Load() >= int64(f.c.storeStarts)
}

// stopNodes stops the agents of a node other than the first (whose address the control plane
// and the store's NodePort are on) for 20 to 45 seconds at seeded moments, one node at a time, until
// it has done so c.nodeStops times (or tried twice as often): its containers run on unseen,
// and past the node controller's grace period the Node is NotReady.
func (f *faults) stopNodes(ctx context.Context) {
	real, ok := framework.RealNode(f.cl)
	nodes := f.cl.Nodes()
	if !ok || len(nodes) < 2 {
		return
	}
	rng := rand.New(rand.NewPCG(f.c.seed, 3))
	for try := 0; f.nodeStops.Load() < int64(f.c.nodeStops) && try < 2*f.c.nodeStops; try++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(5+rng.IntN(15)) * time.Second):
		}
		node := nodes[1+rng.IntN(len(nodes)-1)]
		down := time.Duration(20+rng.IntN(25)) * time.Second
		if err := real.StopNode(node); err != nil {
			fmt.Fprintf(f.log, "chaos: stopping %s: %v\n", node, err)
			continue
		}
		fmt.Fprintf(f.log, "chaos: %s's kubelet and containerd stopped for %s\n", node, down)
		time.Sleep(down)
		// Started again even when the run is over: the checks read the node's volumes.
		start, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		err := real.StartNode(start, node)
		cancel()
		if err != nil {
			fmt.Fprintf(f.log, "chaos: starting %s again: %v\n", node, err)
			continue
		}
		f.nodeStops.Add(1)
		fmt.Fprintf(f.log, "chaos: %s started again\n", node)
	}
}

// loseNode takes the last node away for good, after the checks, and checks that each replica
// on it is reported lost (Failed, reason NodeLost) within three minutes while the images and
// their replicas on the other nodes stay Ready.
func loseNode(ctx context.Context, cl framework.Cluster, locals []*hypercloud.VirtualMachineImage) []row {
	real, _ := framework.RealNode(cl)
	nodes := cl.Nodes()
	lost := nodes[len(nodes)-1]
	k := cl.APIClient()
	var on, elsewhere []client.ObjectKey
	for _, img := range locals {
		_ = k.Get(ctx, client.ObjectKeyFromObject(img), img)
		for _, r := range img.Status.Replicas {
			key := client.ObjectKey{Namespace: img.Namespace, Name: r.Name}
			if r.Node == lost {
				on = append(on, key)
			} else {
				elsewhere = append(elsewhere, key)
			}
		}
	}
	fmt.Printf("chaos: losing %s for good, with %d replicas on it\n", lost, len(on))
	if err := real.LoseNode(ctx, lost); err != nil {
		return []row{{"losing node " + lost, err.Error(), "", false}}
	}
	start := time.Now()
	phases := func(keys []client.ObjectKey) (ready, reported int) {
		for _, key := range keys {
			d := &diskvolume.DiskVolume{}
			if k.Get(ctx, key, d) != nil {
				continue
			}
			if d.Status.Phase == common.PhaseReady {
				ready++
			}
			if goldenimage.LostToNode(&d.Status) != nil {
				reported++
			}
		}
		return ready, reported
	}
	reported := 0
	for time.Since(start) < 3*time.Minute && ctx.Err() == nil {
		if _, reported = phases(on); reported == len(on) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	took := time.Since(start)
	ready, _ := phases(elsewhere)
	images := 0
	for _, img := range locals {
		if k.Get(ctx, client.ObjectKeyFromObject(img), img) == nil && img.Status.Phase == common.PhaseReady {
			images++
		}
	}
	return []row{
		{fmt.Sprintf("replicas on the lost node reported NodeLost (in %.1f s)", took.Seconds()), fmt.Sprint(reported), fmt.Sprint(len(on)), reported == len(on) && len(on) > 0},
		{"replicas on the other nodes still Ready", fmt.Sprint(ready), fmt.Sprint(len(elsewhere)), ready == len(elsewhere)},
		{"node-local images still Ready", fmt.Sprint(images), fmt.Sprint(len(locals)), images == len(locals)},
	}
}

// isReplica says whether a DiskVolume is an image's replica on another node, which the image
// controls, rather than one of the run's disks.
func isReplica(d *diskvolume.DiskVolume) bool {
	owner := metav1.GetControllerOf(d)
	return owner != nil && owner.Kind == "VirtualMachineImage"
}

// waitReplicas waits until each node-local image has a Ready replica on each of the other
// nodes (others of them), or has Failed.
func waitReplicas(ctx context.Context, k client.Client, locals []*hypercloud.VirtualMachineImage, others int) error {
	last := time.Now()
	for {
		done := 0
		for _, img := range locals {
			if err := k.Get(ctx, client.ObjectKeyFromObject(img), img); err != nil {
				continue
			}
			if img.Status.Phase == common.PhaseFailed || readyReplicas(img) >= others {
				done++
			}
		}
		if done == len(locals) {
			if len(locals) > 0 {
				fmt.Printf("chaos: node-local images: every one final, its replicas too\n")
			}
			return nil
		}
		if time.Since(last) > 30*time.Second {
			fmt.Printf("chaos: node-local images: %d of %d with every replica Ready\n", done, len(locals))
			last = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node-local images: %d of %d with every replica Ready when the time ran out", done, len(locals))
		case <-time.After(2 * time.Second):
		}
	}
}

// readyReplicas counts an image's Ready replicas.
func readyReplicas(img *hypercloud.VirtualMachineImage) int {
	n := 0
	for _, r := range img.Status.Replicas {
		if r.Phase == common.PhaseReady {
			n++
		}
	}
	return n
}

// flaky serves files with Range at rate bytes/s per response, cutting one response in ten
// part-way.
type flaky struct {
	files map[string]string
	rate  int64
	mu    sync.Mutex
	rng   *rand.Rand
	cut   atomic.Int64
}

func (s *flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p, ok := s.files[strings.TrimPrefix(r.URL.Path, "/")]
	if !ok {
		http.NotFound(w, r)
		return
	}
	f, err := os.Open(p) //nolint:gosec // the run's own fixtures
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer f.Close()
	fi, _ := f.Stat()
	s.mu.Lock()
	cut := s.rng.IntN(10) == 0
	after := s.rng.Int64N(256 << 10)
	s.mu.Unlock()
	w = &throttled{ResponseWriter: w, rate: s.rate, start: time.Now()}
	if cut && r.Header.Get("Range") != "bytes=0-0" {
		s.cut.Add(1)
		w = &cutter{ResponseWriter: w, left: after}
	}
	http.ServeContent(w, r, filepath.Base(p), fi.ModTime(), f)
}

// throttled sends at most rate bytes per second.
type throttled struct {
	http.ResponseWriter
	rate  int64
	start time.Time
	sent  int64
}

func (t *throttled) Write(p []byte) (int, error) {
	if t.rate > 0 {
		if ahead := time.Duration(t.sent*int64(time.Second)/t.rate) - time.Since(t.start); ahead > 0 {
			time.Sleep(ahead)
		}
	}
	n, err := t.ResponseWriter.Write(p)
	t.sent += int64(n)
	return n, err
}

// cutter drops the connection after left bytes of body.
type cutter struct {
	http.ResponseWriter
	left int64
}

func (c *cutter) Write(p []byte) (int, error) {
	if int64(len(p)) > c.left {
		n, _ := c.ResponseWriter.Write(p[:c.left])
		_ = http.NewResponseController(c.ResponseWriter).Flush()
		if conn, _, err := http.NewResponseController(c.ResponseWriter).Hijack(); err == nil {
			conn.Close()
		}
		return n, io.ErrClosedPipe
	}
	c.left -= int64(len(p))
	return c.ResponseWriter.Write(p)
}

// exportBucket is the bucket namespace ns exports to: each namespace's own, since a bucket
// belongs to the namespace that made it.
func exportBucket(ns string) string { return "chaos-exports-" + ns }

// shareSource puts raw into the bundled store as the first namespace, in its bucket chaos-src,
// and shares it with the others by the bucket's policy, as a tenant shares an image.
func shareSource(ctx context.Context, cl framework.Cluster, raw string, namespaces []string) error {
	root, err := cl.StoreClient(ctx)
	if err != nil {
		return err
	}
	owner, err := root.Tenant(ctx, namespaces[0])
	if err != nil {
		return err
	}
	if err := owner.EnsureBucket(ctx, "chaos-src"); err != nil {
		return err
	}
	if _, err := owner.FPutObject(ctx, "chaos-src", "disk.raw", raw, minio.PutObjectOptions{}); err != nil {
		return fmt.Errorf("uploading the source: %w", err)
	}
	access, _ := owner.Keys()
	readers := []string{}
	for _, ns := range namespaces[1:] {
		// The store takes only principals it knows: the readers' accounts must exist.
		reader, err := root.Tenant(ctx, ns)
		if err != nil {
			return err
		}
		r, _ := reader.Keys()
		readers = append(readers, fmt.Sprintf("%q", r))
	}
	policy := fmt.Sprintf(`{"Version":"2012-10-17","Statement":[`+
		`{"Effect":"Allow","Principal":{"AWS":[%q]},"Action":["s3:*"],"Resource":["arn:aws:s3:::chaos-src","arn:aws:s3:::chaos-src/*"]},`+
		`{"Effect":"Allow","Principal":{"AWS":[%s]},"Action":["s3:GetObject"],"Resource":["arn:aws:s3:::chaos-src/disk.raw"]}]}`,
		access, strings.Join(readers, ","))
	if err := owner.SetBucketPolicy(ctx, "chaos-src", policy); err != nil {
		return fmt.Errorf("sharing the source: %w", err)
	}
	return nil
}
