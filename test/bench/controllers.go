package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/test/testenv"
)

// Scale of the controller benchmark.
const (
	benchNamespaces = 10
	disksPerImage   = 5
	benchWorkers    = 32
)

// benchImages is 1,000, or $BENCH_IMAGES for a quicker look.
var benchImages = func() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_IMAGES")); err == nil && n > 0 {
		return n
	}
	return 1000
}()

// benchControllers runs the manager binary against a real apiserver and etcd, creates 1,000
// images and then 5,000 DiskVolumes cloned from them, and prints how long it took until every
// child existed, the rate, and the manager's peak RSS (VmHWM). The benchmark plays the kubelet
// (import pods succeed) and the CSI driver (nothing else is needed for CSI clones to be made).
func benchControllers(root string) error {
	env, err := testenv.Start()
	if err != nil {
		return err
	}
	defer env.Stop() //nolint:errcheck // best effort
	ctx := context.Background()
	cfg := *env.Config
	cfg.QPS, cfg.Burst = 1000, 2000
	c, err := client.NewWithWatch(&cfg, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		return err
	}
	if err := c.Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "csi",
		Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}}, Provisioner: "csi.diskpipe.bench"}); err != nil {
		return err
	}
	// What the chart installs on Kubernetes 1.36: the apiserver gives each image its finalizer.
	if err := env.InstallFinalizerPolicy(ctx); err != nil {
		return err
	}
	var namespaces []string
	for i := range benchNamespaces {
		ns := fmt.Sprintf("bench-%d", i)
		if err := env.EnsureNamespace(ctx, ns); err != nil {
			return err
		}
		namespaces = append(namespaces, ns)
	}

	mgr := exec.Command(filepath.Join(root, "bin", "manager"), "--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		"--zap-log-level", "error")
	mgr.Env = append(os.Environ(), "KUBECONFIG="+env.Kubeconfig)
	mgr.Stdout, mgr.Stderr = os.Stdout, os.Stderr
	if err := mgr.Start(); err != nil {
		return fmt.Errorf("starting bin/manager (make build): %w", err)
	}
	defer func() { _ = mgr.Process.Kill(); _ = mgr.Wait() }()
	peak := func() int64 { return vmHWM(mgr.Process.Pid) }

	fmt.Printf("controllers: %d images in %d namespaces, then %d DiskVolumes cloned from them (manager: bin/manager, concurrency 8)\n",
		benchImages, benchNamespaces, benchImages*disksPerImage)
	before, err := apiRequests(ctx, &cfg)
	if err != nil {
		return err
	}
	if f := os.Getenv("BENCH_PPROF"); f != "" {
		go profileAPIServer(ctx, &cfg, f)
	}
	start := time.Now()
	err = parallel(benchImages, func(i int) error {
		vmi := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("image-%d", i), Namespace: namespaces[i%benchNamespaces]},
			Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{HTTP: common.HTTPURL(fmt.Sprintf("https://images.example.com/%d.qcow2", i))}}}
		q := resource.MustParse("1Gi")
		vmi.Spec.Resources.Requests.Storage = &q
		return c.Create(ctx, vmi)
	})
	if err != nil {
		return err
	}
	created := time.Since(start)
	if err := waitCount(ctx, c, &corev1.PodList{}, benchImages, time.Minute*10); err != nil {
		return err
	}
	imagesDone := time.Since(start)
	report("images: golden PVC + import pod each", benchImages, created, imagesDone, peak())
	if err := reportRequests(ctx, &cfg, before, benchImages); err != nil {
		return err
	}

	// The kubelet: every import succeeds.
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods); err != nil {
		return err
	}
	msg, _ := json.Marshal(transfer.Result{Succeeded: true, Format: "qcow2", VirtualSize: 1 << 29})
	start = time.Now()
	err = parallel(len(pods.Items), func(i int) error {
		p := &pods.Items[i]
		p.Status.Phase = corev1.PodSucceeded
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "importer", State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{Message: string(msg)}}}}
		return c.Status().Update(ctx, p)
	})
	if err != nil {
		return err
	}
	if err := waitReady(ctx, c, benchImages, 10*time.Minute); err != nil {
		return err
	}
	report("images: Ready after their imports ended", benchImages, 0, time.Since(start), peak())

	start = time.Now()
	err = parallel(benchImages*disksPerImage, func(i int) error {
		img := i % benchImages
		d := &diskvolume.DiskVolume{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("disk-%d", i), Namespace: namespaces[img%benchNamespaces]},
			Spec: diskvolume.DiskVolumeSpec{Source: diskvolume.DiskVolumeSource{Image: &diskvolume.ImageSource{
				Name: common.LocalName(fmt.Sprintf("image-%d", img)), Kind: diskvolume.ImageKindVirtualMachineImage}}}}
		return c.Create(ctx, d)
	})
	if err != nil {
		return err
	}
	created = time.Since(start)
	if err := waitCount(ctx, c, &corev1.PersistentVolumeClaimList{}, benchImages*(1+disksPerImage), 2*time.Minute); err != nil {
		d := &diskvolume.DiskVolume{}
		_ = c.Get(ctx, client.ObjectKey{Namespace: namespaces[0], Name: "disk-0"}, d)
		b, _ := json.Marshal(d)
		return fmt.Errorf("%w; for example: %s", err, b)
	}
	report("disks: CSI-clone PVC each", benchImages*disksPerImage, created, time.Since(start), peak())
	return nil
}

func report(what string, n int, created, done time.Duration, rss int64) {
	fmt.Printf("  %-40s %6d objects  created in %6.1f s  all children after %6.1f s  %7.1f objects/s  manager peak RSS %6.1f MiB\n",
		what, n, created.Seconds(), done.Seconds(), float64(n)/done.Seconds(), float64(rss)/(1<<20))
}

// parallel runs f(0..n-1) on benchWorkers goroutines and returns the first error.
func parallel(n int, f func(int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  = make(chan int)
	)
	for range benchWorkers {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					first = cmpErr(first, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// waitCount waits until n objects of list's kind exist.
func waitCount(ctx context.Context, c client.WithWatch, list client.ObjectList, n int, limit time.Duration) error {
	return waitWatch(ctx, c, list, n, limit, func(client.Object) bool { return true })
}

// waitReady waits until n images are Ready.
func waitReady(ctx context.Context, c client.WithWatch, n int, limit time.Duration) error {
	return waitWatch(ctx, c, &hypercloud.VirtualMachineImageList{}, n, limit, func(o client.Object) bool {
		return o.(*hypercloud.VirtualMachineImage).Status.Phase == common.PhaseReady
	})
}

// waitWatch waits until n objects of list's kind satisfy ok. It follows one watch rather than
// listing again and again, so the measurement does not load the apiserver it measures.
func waitWatch(ctx context.Context, c client.WithWatch, list client.ObjectList, n int, limit time.Duration, ok func(client.Object) bool) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	matched := map[types.UID]bool{}
	for {
		w, err := c.Watch(ctx, list)
		if err != nil {
			return err
		}
		for ev := range w.ResultChan() {
			o, isObj := ev.Object.(client.Object)
			if !isObj {
				continue
			}
			switch {
			case ev.Type == watch.Deleted || !ok(o):
				delete(matched, o.GetUID())
			default:
				matched[o.GetUID()] = true
			}
			if len(matched) >= n {
				w.Stop()
				return nil
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			return fmt.Errorf("%d of %d after %s", len(matched), n, limit)
		}
		clear(matched) // the watch ended: a new one lists everything again
	}
}

// apiRequests reads the apiserver's request counts by verb and resource from its /metrics.
func apiRequests(ctx context.Context, cfg *rest.Config) (map[string]float64, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	tp := expfmt.NewTextParser(model.UTF8Validation)
	families, err := tp.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, m := range families["apiserver_request_total"].GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		key := l["verb"] + " " + l["resource"]
		if l["subresource"] != "" {
			key += "/" + l["subresource"]
		}
		out[key] += m.GetCounter().GetValue()
	}
	return out, nil
}

// reportRequests prints the apiserver requests made since before, per object: what the
// manager (and the benchmark's own creates and watch) cost the apiserver.
func reportRequests(ctx context.Context, cfg *rest.Config, before map[string]float64, n int) error {
	after, err := apiRequests(ctx, cfg)
	if err != nil {
		return err
	}
	var rows []string
	for k, v := range after {
		if d := v - before[k]; d >= float64(n)/10 {
			rows = append(rows, fmt.Sprintf("%s %.2f", k, d/float64(n)))
		}
	}
	slices.Sort(rows)
	fmt.Printf("  %-40s %s\n", "apiserver requests per object", strings.Join(rows, ", "))
	return nil
}

// profileAPIServer writes a 10-second CPU profile of kube-apiserver to file ($BENCH_PPROF, taken
// while the images are made): go tool pprof shows where the apiserver's time per image goes.
func profileAPIServer(ctx context.Context, cfg *rest.Config, file string) {
	hc, err := rest.HTTPClientFor(cfg)
	if err == nil {
		var req *http.Request
		if req, err = http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+"/debug/pprof/profile?seconds=10", nil); err == nil {
			var resp *http.Response
			if resp, err = hc.Do(req); err == nil {
				defer resp.Body.Close()
				var b []byte
				if b, err = io.ReadAll(resp.Body); err == nil {
					err = os.WriteFile(file, b, 0o600)
				}
			}
		}
	}
	if err != nil {
		fmt.Println("  profiling kube-apiserver:", err)
	}
}

// vmHWM is a process's peak resident set, from /proc.
func vmHWM(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
