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
	fmt.Printf("bench-upload: %s, %.2f GiB; store on %s, upload proxy on %s\n", raw, float64(size)/(1<<30), endpoint, c.UploadURL())

	awsEnv := []string{"AWS_ACCESS_KEY_ID=" + access, "AWS_SECRET_ACCESS_KEY=" + secret, "AWS_DEFAULT_REGION=us-east-1",
		"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null"}
	aws := func(args ...string) []string {
		return append([]string{"--endpoint-url", endpoint, "--no-cli-pager"}, args...)
	}
	if _, err := timedEnv("mb", 0, awsEnv, "/usr/bin/aws", aws("s3", "mb", "s3://bench")...); err != nil {
		return err
	}
	dropCaches()
	ref, err := timedEnv("aws s3 cp (reference)", size, awsEnv, "/usr/bin/aws", aws("s3", "cp", "--only-show-errors", raw, "s3://bench/disk.raw")...)
	if err != nil {
		return err
	}
	dropCaches()
	plugin, err := timedEnv("kubectl diskpipe upload", size, []string{"KUBECONFIG=" + c.KubeconfigFile()}, filepath.Join(root, "bin", "kubectl-diskpipe"),
		"upload", "bench", "--file", raw, "--create", "--size", "5Gi", "--no-wait", "-n", "bench")
	if err != nil {
		return err
	}
	lc, _ := framework.LocalCluster(c)
	proxyRSS, err := peakRSS(lc.PID("uploadproxy"))
	if err != nil {
		return err
	}
	fmt.Println(ref)
	fmt.Println(plugin)
	fmt.Printf("%-34s %8.1f MiB peak RSS (VmHWM)\n", "upload proxy", float64(proxyRSS)/(1<<20))
	fmt.Printf("\nupload wall / aws s3 cp wall: %.2fx (target <= 1.20x); proxy peak RSS %.0f MiB (target <= 128 MiB)\n",
		plugin.wall.Seconds()/ref.wall.Seconds(), float64(proxyRSS)/(1<<20))

	// The same file from the console's page in Chromium, through the gateway.
	page, tab, err := browserUpload(ctx, c, raw, filepath.Join(work, "chromium"))
	if err != nil {
		return err
	}
	gatewayRSS, err := peakRSS(lc.PID("gateway"))
	if err != nil {
		return err
	}
	if proxyRSS, err = peakRSS(lc.PID("uploadproxy")); err != nil {
		return err
	}
	fmt.Println(page, "(the tab's renderer)")
	_ = tab
	fmt.Printf("%-34s %8.1f MiB peak RSS (VmHWM)\n", "gateway", float64(gatewayRSS)/(1<<20))
	fmt.Printf("%-34s %8.1f MiB peak RSS (VmHWM, over both uploads)\n", "upload proxy", float64(proxyRSS)/(1<<20))
	fmt.Printf("\nbrowser wall / kubectl diskpipe upload wall: %.2fx (target <= 1.30x)\n", page.wall.Seconds()/plugin.wall.Seconds())
	return nil
}

// browserUpload uploads file from the console's page in a headless Chromium, signed in as a
// user of namespace bench, and answers the upload's wall time (from the click to the page's
// "done", which follows the proxy's check of the page's digest) and the peak RSS of the tab's
// renderer process.
func browserUpload(ctx context.Context, c framework.Cluster, file, dir string) (measurement, int64, error) {
	m := measurement{name: "console page in Chromium", bytes: fileSize(file)}
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
		return m, 0, fmt.Errorf("%w: %s", err, stderr)
	}
	token, stderr, err := c.Kubectl(ctx, nil, "create", "token", "console", "-n", "bench")
	if err != nil {
		return m, 0, fmt.Errorf("%w: %s", err, stderr)
	}
	url, stop, err := c.ConsoleURL(ctx)
	if err != nil {
		return m, 0, err
	}
	defer stop()
	_ = os.RemoveAll(dir)
	bctx, cancel, err := browser.New(dir)
	if err != nil {
		return m, 0, err
	}
	defer cancel()
	if err := chromedp.Do(bctx, browser.SignIn(url, strings.TrimSpace(token), "bench")); err != nil {
		return m, 0, err
	}
	tab := rendererHWM(dir)
	dropCaches()
	start := time.Now()
	uctx, cancelUpload := context.WithTimeout(bctx, 30*time.Minute)
	defer cancelUpload()
	if err := chromedp.Do(uctx, browser.Upload("bench-browser", file), browser.Done("bench-browser")); err != nil {
		return m, 0, fmt.Errorf("the page's upload: %w", err)
	}
	m.wall = time.Since(start)
	m.peakRSS = tab()
	return m, m.peakRSS, nil
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
