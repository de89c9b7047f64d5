package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/diskpipe/diskpipe/test/browser"
	"github.com/diskpipe/diskpipe/test/framework"
)

// benchUpload uploads the 4 GiB disk with `kubectl diskpipe upload` through the upload proxy
// into the bundled store of a local cluster, beside `aws s3 cp` of the same file into the
// same store, and reports the proxy's peak RSS.
func benchUpload(root, work string) error {
	raw, err := fsImage(work)
	if err != nil {
		return err
	}
	dir := filepath.Join(work, "upload-cluster")
	_ = os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	ctrllog.SetLogger(logr.Discard()) // the test cluster's client logs nothing worth reading here
	c, err := framework.Start(ctx, framework.Options{Kind: framework.Local, Dir: dir})
	if err != nil {
		return err
	}
	defer c.Stop()
	if err := c.EnsureNamespace(ctx, "bench"); err != nil {
		return err
	}
	endpoint, access, secret, err := c.StoreAccess(ctx)
	if err != nil {
		return err
	}
	size := fileSize(raw)
	runs := benchRuns()
	fmt.Printf("bench-upload: %s, %.2f GiB; store on %s, upload proxy on %s; %d rounds, medians\n", raw, float64(size)/(1<<30), endpoint, c.UploadURL(), runs)

	awsEnv := []string{"AWS_ACCESS_KEY_ID=" + access, "AWS_SECRET_ACCESS_KEY=" + secret, "AWS_DEFAULT_REGION=us-east-1",
		"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null"}
	aws := func(args ...string) []string {
		return append([]string{"--endpoint-url", endpoint, "--no-cli-pager"}, args...)
	}
	if _, err := timedEnv("mb", 0, awsEnv, "/usr/bin/aws", aws("s3", "mb", "s3://bench")...); err != nil {
		return err
	}
	page, err := newConsolePage(ctx, c, filepath.Join(work, "chromium"))
	if err != nil {
		return err
	}
	defer page.close()
	lc, _ := framework.LocalCluster(c)
	// settle waits, untimed, for the image an upload made to be imported, then deletes it:
	// the next contender has the machine to itself, and the store its room.
	settle := func(name string) error {
		if _, stderr, err := c.Kubectl(ctx, nil, "wait", "-n", "bench", "--for=jsonpath={.status.phase}=Ready", "--timeout=15m", "virtualmachineimage/"+name); err != nil {
			return fmt.Errorf("the import of %s: %w: %s", name, err, stderr)
		}
		if _, stderr, err := c.Kubectl(ctx, nil, "delete", "-n", "bench", "--wait", "--timeout=5m", "virtualmachineimage/"+name); err != nil {
			return fmt.Errorf("%w: %s", err, stderr)
		}
		return nil
	}
	var refs, plugins, pages []measurement
	var tabRSS int64
	for i := range runs {
		dropCaches()
		ref, err := timedEnv("aws s3 cp (reference)", size, awsEnv, "/usr/bin/aws", aws("s3", "cp", "--only-show-errors", raw, "s3://bench/disk.raw")...)
		if err != nil {
			return err
		}
		if _, err := timedEnv("rm", 0, awsEnv, "/usr/bin/aws", aws("s3", "rm", "--only-show-errors", "s3://bench/disk.raw")...); err != nil {
			return err
		}
		dropCaches()
		name := fmt.Sprintf("bench-%d", i)
		plugin, err := timedEnv("kubectl diskpipe upload", size, []string{"KUBECONFIG=" + c.KubeconfigFile()}, filepath.Join(root, "bin", "kubectl-diskpipe"),
			"upload", name, "--file", raw, "--create", "--size", "5Gi", "--no-wait", "-n", "bench")
		if err != nil {
			return err
		}
		if err := settle(name); err != nil {
			return err
		}
		// The same file from the console's page in Chromium, through the gateway.
		name = fmt.Sprintf("bench-browser-%d", i)
		m, err := page.upload(name, raw)
		if err != nil {
			return err
		}
		tabRSS = max(tabRSS, m.peakRSS)
		if err := settle(name); err != nil {
			return err
		}
		fmt.Printf("round %d: aws %.2f s, kubectl diskpipe upload %.2f s (%.2fx), page %.2f s (%.2fx the upload)\n", i+1,
			ref.wall.Seconds(), plugin.wall.Seconds(), plugin.wall.Seconds()/ref.wall.Seconds(), m.wall.Seconds(), m.wall.Seconds()/plugin.wall.Seconds())
		refs, plugins, pages = append(refs, ref), append(plugins, plugin), append(pages, m)
	}
	proxyRSS, err := peakRSS(lc.PID("uploadproxy"))
	if err != nil {
		return err
	}
	gatewayRSS, err := peakRSS(lc.PID("gateway"))
	if err != nil {
		return err
	}
	ref, plugin, pg := median(refs), median(plugins), median(pages)
	fmt.Println()
	fmt.Println(ref)
	fmt.Println(plugin)
	fmt.Println(pg, "(the tab's renderer)")
	fmt.Printf("%-34s %8.1f MiB peak RSS (VmHWM)\n", "gateway", float64(gatewayRSS)/(1<<20))
	fmt.Printf("%-34s %8.1f MiB peak RSS (VmHWM, over every upload)\n", "upload proxy", float64(proxyRSS)/(1<<20))
	fmt.Printf("\nmedians: upload wall / aws s3 cp wall: %.2fx (target <= 1.20x); proxy peak RSS %.0f MiB (target <= 128 MiB)\n",
		plugin.wall.Seconds()/ref.wall.Seconds(), float64(proxyRSS)/(1<<20))
	fmt.Printf("medians: browser wall / kubectl diskpipe upload wall: %.2fx (target <= 1.30x); the tab's peak RSS %.0f MiB\n",
		pg.wall.Seconds()/plugin.wall.Seconds(), float64(tabRSS)/(1<<20))
	fmt.Printf("each round's ratios: upload/aws %s; browser/upload %s\n", roundRatios(plugins, refs), roundRatios(pages, plugins))
	return nil
}

// consolePage is the console's page in a headless Chromium, signed in as a user of
// namespace bench.
type consolePage struct {
	ctx   context.Context
	dir   string
	close func()
}

func newConsolePage(ctx context.Context, c framework.Cluster, dir string) (*consolePage, error) {
	if _, stderr, err := c.Kubectl(ctx, []byte(`apiVersion: v1
kind: ServiceAccount
metadata: {name: console}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: console}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: admin}
subjects: [{kind: ServiceAccount, name: console}]
---
# diskpipe's kinds, which admin holds where ClusterRoles are aggregated (not on the local cluster)
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: console-diskpipe}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: diskpipe-user}
subjects: [{kind: ServiceAccount, name: console}]
`), "apply", "-n", "bench", "-f", "-"); err != nil {
		return nil, fmt.Errorf("%w: %s", err, stderr)
	}
	token, stderr, err := c.Kubectl(ctx, nil, "create", "token", "console", "-n", "bench", "--duration=2h")
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, stderr)
	}
	url, stop, err := c.ConsoleURL(ctx)
	if err != nil {
		return nil, err
	}
	_ = os.RemoveAll(dir)
	bctx, cancel, err := browser.New(dir)
	if err != nil {
		stop()
		return nil, err
	}
	p := &consolePage{ctx: bctx, dir: dir, close: func() { cancel(); stop() }}
	if err := chromedp.Do(bctx, browser.SignIn(url, strings.TrimSpace(token), "bench")); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

// upload uploads file from the page as the image name, and answers the upload's wall time
// (from the click to the page's "done", which follows the proxy's check of the page's digest)
// and the peak RSS of the tab's renderer process.
func (p *consolePage) upload(name, file string) (measurement, error) {
	m := measurement{name: "console page in Chromium", bytes: fileSize(file)}
	tab := rendererHWM(p.dir)
	dropCaches()
	start := time.Now()
	uctx, cancelUpload := context.WithTimeout(p.ctx, 30*time.Minute)
	defer cancelUpload()
	if err := chromedp.Do(uctx, browser.Upload(name, file), browser.Done(name)); err != nil {
		return m, fmt.Errorf("the page's upload: %w", err)
	}
	m.wall = time.Since(start)
	m.peakRSS = tab()
	return m, nil
}

// rendererHWM follows the peak RSS of the renderer processes of the Chromium whose profile is
// dir (the page's tab), until the returned function is called, which returns the largest.
func rendererHWM(dir string) func() int64 {
	var peak atomic.Int64
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			for _, pid := range renderers(dir) {
				if v, err := peakRSS(pid); err == nil && v > peak.Load() {
					peak.Store(v)
				}
			}
			select {
			case <-done:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return func() int64 { close(done); <-stopped; return peak.Load() }
}

// peakRSS is a running process's peak resident set, from /proc.
func peakRSS(pid int) (int64, error) {
	if pid == 0 {
		return 0, fmt.Errorf("the process is not running")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}

// renderers are the renderer processes of the Chromium whose profile is dir: processes with
// --type=renderer descended from the one started with dir.
func renderers(dir string) []int {
	parent, cmd := map[int]int{}, map[int]string{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, st := range stats {
		b, err := os.ReadFile(st)
		if err != nil {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(st)))
		// pid (comm) state ppid ...: comm may hold spaces, so read after its ')'.
		if f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])); len(f) > 1 {
			parent[pid], _ = strconv.Atoi(f[1])
		}
		c, _ := os.ReadFile(filepath.Join(filepath.Dir(st), "cmdline"))
		cmd[pid] = string(c)
	}
	var out []int
	for pid, c := range cmd {
		if !strings.Contains(c, "--type=renderer") {
			continue
		}
		for p := parent[pid]; p > 1; p = parent[p] {
			if strings.Contains(cmd[p], dir) && !strings.Contains(cmd[p], "--type=") {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}
