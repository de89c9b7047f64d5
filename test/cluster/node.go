package cluster

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/test/testenv"
)

// registry is where the registry listens; containerd pulls diskpipe's and the pause image from
// it over plain HTTP.
const registry = "127.0.0.1:5055"

// PauseImage is the sandbox image containerd runs for every pod.
const PauseImage = registry + "/pause:diskpipe"

// images starts the registry and pushes diskpipe's image and the pause image into it.
func (c *Cluster) images(ctx context.Context) error {
	c.Registry = registry
	cfg := c.path("registry", "config.yml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, `version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: %s}, delete: {enabled: true}}
http: {addr: %s}
`, c.path("registry", "data"), registry), 0o644); err != nil {
		return err
	}
	c.step("registry on %s", registry)
	if err := c.start("registry", "/usr/bin/docker-registry", "serve", cfg); err != nil {
		return err
	}
	if err := c.wait(ctx, "the registry", "registry", 30*time.Second, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+registry+"/v2/", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}); err != nil {
		return err
	}
	for archive, ref := range map[string]string{c.opts.Pause: PauseImage, c.opts.Image: c.Image()} {
		c.step("push %s", ref)
		out, err := exec.CommandContext(ctx, c.bin("image"), "push", "--archive", archive, ref).CombinedOutput() //nolint:gosec // hack/image
		if err != nil {
			return fmt.Errorf("pushing %s (make image builds the archives): %w: %s", ref, err, out)
		}
	}
	return nil
}

// Image is diskpipe's image as the cluster pulls it: the chart's default tag in the registry.
func (c *Cluster) Image() string { return registry + "/diskpipe:" + ImageTag }

// KubeletRoot is the kubelet's root directory in the node's mount namespace: KubeVirt's
// virt-handler hard-codes it.
const KubeletRoot = "/var/lib/kubelet"

// nodeNamespace starts the node's own PID and mount namespace, whose PID 1 is the harness's
// pause binary (it reaps orphans): containerd and the kubelet, and so every pod, run in it.
// KubeVirt's virt-handler needs what it gives: a PID 1 whose /proc/1/ns/mnt it may read (the
// machine's own init is out of reach here), the kubelet's root at /var/lib/kubelet (the
// harness's directory, bind-mounted there in the namespace only), and shared mount propagation
// for its Bidirectional mounts. The kubelet's directory is also a shared mount on the machine:
// what the CSI driver (in the test's process) mounts there reaches the kubelet, and what the
// kubelet mounts the teardown finds.
func (c *Cluster) nodeNamespace(ctx context.Context) error {
	root := c.path("kubelet", "root")
	if err := os.MkdirAll(root, 0o750); err != nil {
		return err
	}
	if err := os.MkdirAll(KubeletRoot, 0o750); err != nil { // empty on the machine
		return err
	}
	for _, args := range [][]string{{"--bind", root, root}, {"--make-shared", root}} {
		if out, err := exec.CommandContext(ctx, "mount", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("mount %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	initBin := c.bin(filepath.Join("linux_"+runtime.GOARCH, "pause"))
	if _, err := os.Stat(initBin); err != nil {
		return fmt.Errorf("the node's init (make pause-image builds it): %w", err)
	}
	c.step("the node's PID and mount namespace")
	// The init names the cluster's directory, so that a later teardown finds it.
	script := fmt.Sprintf("set -e; mount --make-rshared /; mount --bind %q %s; exec %q %q", root, KubeletRoot, initBin, root)
	if err := c.start("node", "unshare", "--pid", "--fork", "--mount", "--mount-proc", "--propagation", "unchanged", "--", "sh", "-c", script); err != nil {
		return err
	}
	return c.wait(ctx, "the node's namespace", "node", 30*time.Second, func(context.Context) error {
		pid, err := c.nodeInit(initBin)
		c.nodePID = pid
		return err
	})
}

// nodeInit finds PID 1 of the node's namespace, as the machine sees it: the child of unshare
// that runs initBin, with its mount in place.
func (c *Cluster) nodeInit(initBin string) (int, error) {
	c.mu.Lock()
	var unshare int
	for _, p := range c.procs {
		if p.name == "node" {
			unshare = p.cmd.Process.Pid
		}
	}
	c.mu.Unlock()
	children, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", unshare, unshare))
	if err != nil {
		return 0, err
	}
	for _, f := range strings.Fields(string(children)) {
		pid, _ := strconv.Atoi(f)
		if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); exe == initBin {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no %s under unshare (%d) yet", initBin, unshare)
}

// startInNode starts a component inside the node's namespace.
func (c *Cluster) startInNode(name, bin string, args ...string) error {
	return c.start(name, "nsenter", append([]string{"--target", strconv.Itoa(c.nodePID), "--pid", "--mount", "--", bin}, args...)...)
}

// node starts containerd, the kubelet, kube-proxy and CoreDNS, and waits until the node is
// Ready.
func (c *Cluster) node(ctx context.Context) error {
	if err := c.nodeNamespace(ctx); err != nil {
		return err
	}
	sock := c.path("containerd", "containerd.sock")
	hosts := c.path("containerd", "certs.d", registry)
	if err := os.MkdirAll(hosts, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(hosts, "hosts.toml"), fmt.Appendf(nil, `server = "http://%s"
[host."http://%s"]
  capabilities = ["pull", "resolve"]
`, registry, registry), 0o644); err != nil {
		return err
	}
	// restrict_oom_score_adj: this machine's root lacks CAP_SYS_RESOURCE, and runc fails to
	// lower a container's oom_score_adj without it. device_ownership_from_security_context:
	// a block volume's device belongs to the pod's runAsUser and runAsGroup, so that a
	// non-root importer can write it (what KubeVirt and CDI ask of containerd too).
	config := c.path("containerd", "config.toml")
	if err := os.WriteFile(config, fmt.Appendf(nil, `version = 2
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  device_ownership_from_security_context = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = %q
`, c.path("containerd", "root"), c.path("containerd", "state"), sock, PauseImage, c.bin("cni"), c.path("cni", "net.d"),
		c.path("containerd", "certs.d")), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(c.path("cni", "net.d", "10-diskpipe.conflist"), fmt.Appendf(nil, `{
  "cniVersion": "1.0.0",
  "name": "diskpipe",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q, "gateway": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, Bridge, PodSubnet, NodeIP, c.path("cni", "ipam")), 0o644); err != nil {
		return err
	}
	c.step("containerd")
	if err := c.startInNode("containerd", "containerd", "--config", config); err != nil {
		return err
	}
	if err := c.wait(ctx, "containerd", "containerd", time.Minute, func(ctx context.Context) error {
		return exec.CommandContext(ctx, "ctr", "--address", sock, "version").Run()
	}); err != nil {
		return err
	}

	server := "https://" + net.JoinHostPort(NodeIP, apiPort)
	kubeletKC, err := c.pki.Kubeconfig("kubelet", server, "system:node:"+NodeName, "system:nodes")
	if err != nil {
		return err
	}
	kubeletConfig := c.path("kubelet", "config.yaml")
	if err := os.WriteFile(kubeletConfig, fmt.Appendf(nil, `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
resolvConf: ""
clusterDNS: [%s]
clusterDomain: cluster.local
containerRuntimeEndpoint: unix://%s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "%s", imagefs.available: "%s"}
podLogsDir: %s
volumePluginDir: %s
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: %s}}
authorization: {mode: AlwaysAllow}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
serializeImagePulls: false
maxPods: 200
`, NodeIP, sock, EvictionDiskFree, EvictionDiskFree, c.path("logs", "pods"), c.path("kubelet", "volume-plugins"), c.pki.CAFile), 0o644); err != nil {
		return err
	}
	c.step("kubelet")
	if err := c.startInNode("kubelet", c.bin("kubelet"), "--config", kubeletConfig, "--kubeconfig", kubeletKC,
		"--root-dir", KubeletRoot, "--cert-dir", c.path("kubelet", "pki"),
		"--hostname-override", NodeName, "--node-ip", NodeIP); err != nil {
		return err
	}

	proxyKC, err := c.pki.Kubeconfig("kube-proxy", server, "system:kube-proxy")
	if err != nil {
		return err
	}
	proxyConfig := c.path("kube-proxy.yaml")
	if err := os.WriteFile(proxyConfig, fmt.Appendf(nil, `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: %s
hostnameOverride: %s
clientConnection: {kubeconfig: %s}
conntrack: {maxPerCore: 0}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
`, ClusterCIDR, NodeName, proxyKC), 0o644); err != nil {
		return err
	}
	c.step("kube-proxy (iptables)")
	if err := c.start("kube-proxy", c.bin("kube-proxy"), "--config", proxyConfig); err != nil {
		return err
	}

	corefile := c.path("Corefile")
	if err := os.WriteFile(corefile, fmt.Appendf(nil, `.:53 {
    bind %s
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig %s
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
}
`, NodeIP, c.Kubeconfig), 0o644); err != nil {
		return err
	}
	c.step("CoreDNS on %s:53", NodeIP)
	if err := c.start("coredns", c.bin("coredns"), "-conf", corefile); err != nil {
		return err
	}

	if err := c.wait(ctx, "the node to be Ready", "kubelet", 3*time.Minute, func(ctx context.Context) error {
		n := &corev1.Node{}
		if err := c.Client.Get(ctx, client.ObjectKey{Name: NodeName}, n); err != nil {
			return err
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				if cond.Status == corev1.ConditionTrue {
					return nil
				}
				return fmt.Errorf("%s: %s", cond.Reason, cond.Message)
			}
		}
		return fmt.Errorf("no Ready condition")
	}); err != nil {
		return err
	}
	return c.wait(ctx, "CoreDNS to answer", "coredns", time.Minute, func(ctx context.Context) error {
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, net.JoinHostPort(NodeIP, "53"))
		}}
		addrs, err := r.LookupHost(ctx, "kubernetes.default.svc.cluster.local")
		if err != nil {
			return err
		}
		if len(addrs) == 0 || addrs[0] != APIServerIP {
			return fmt.Errorf("kubernetes.default is %v", addrs)
		}
		return nil
	})
}

// ImageTag is the chart's appVersion, which is its default image tag and the tag `make image`
// stamps.
var ImageTag = func() string {
	data, err := os.ReadFile(testenv.Path("charts", "diskpipe", "Chart.yaml"))
	if err != nil {
		return "latest"
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "appVersion:"); ok {
			return strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	return "latest"
}()
