package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

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
	return nil
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
