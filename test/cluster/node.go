package cluster

import (
	"context"
	"fmt"
	"io"
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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/test/testenv"
)

// registry is where the registry listens; containerd pulls diskpipe's and the pause image from
// it over plain HTTP.
const registry = "127.0.0.1:5055"

// registryOnNodeIP is where nodes on networks of their own reach the registry
// (registryForward).
const registryOnNodeIP = NodeIP + ":5055"

// registryForward makes the registry reachable at registryOnNodeIP too, until ctx ends: its
// name (the machine's loopback address, in every image reference) is out of reach of a node
// with a network of its own.
func registryForward(ctx context.Context) error {
	l, err := net.Listen("tcp", registryOnNodeIP)
	if err != nil {
		return err
	}
	go func() { <-ctx.Done(); l.Close() }()
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer in.Close()
				out, err := net.Dial("tcp", registry)
				if err != nil {
					return
				}
				defer out.Close()
				go func() { _, _ = io.Copy(out, in); _ = out.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(in, out)
			}()
		}
	}()
	return nil
}

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

// KubeletRoot is the kubelet's root directory in a node's mount namespace: KubeVirt's
// virt-handler hard-codes it.
const KubeletRoot = "/var/lib/kubelet"

// node is one of the cluster's nodes. The first is on the machine's network: its pod bridge
// (Bridge, NodeIP) carries the control plane's address too. Every other node has a network
// namespace of its own (netns), joined to the machine by a veth pair (the machine's end
// 10.243.<index>.1, the node's .2), with a pod bridge of its own whose address is the node's;
// the machine routes each node's pod subnet to it, so pods of all nodes reach each other, the
// control plane and the tests' servers.
type node struct {
	index     int    // from 1
	name      string // the Node's name
	ip        string // its address: its pod bridge's
	podSubnet string
	netns     string // its network namespace's name; "" on the machine's network
	pid       int    // PID 1 of its namespaces, as the machine sees it
}

// kubeVirtNodeDirs are the host paths where KubeVirt's handler keeps a node's state (its
// DaemonSet's hostPath volumes besides the kubelet's).
var kubeVirtNodeDirs = []string{"/run/kubevirt", "/run/kubevirt-private", "/run/kubevirt-libvirt-runtimes", "/var/lib/kubevirt-node-labeller"}

// MaxNodes is how many nodes a cluster may have: each takes a /24 of ClusterCIDR.
const MaxNodes = 8

// newNode is the index-th node (from 1).
func newNode(index int) *node {
	if index == 1 {
		return &node{index: 1, name: NodeName, ip: NodeIP, podSubnet: PodSubnet}
	}
	return &node{index: index, name: fmt.Sprintf("%s-%d", NodeName, index), ip: fmt.Sprintf("10.244.%d.1", index-1),
		podSubnet: fmt.Sprintf("10.244.%d.0/24", index-1), netns: fmt.Sprintf("dpnode-%d", index)}
}

// proc is the name of a component of the node, as the cluster's processes and logs name it.
func (n *node) proc(component string) string {
	if n.index == 1 {
		return component
	}
	return fmt.Sprintf("%s-%d", component, n.index)
}

// veth is the machine's end of the node's veth pair and its address, and the node's address.
func (n *node) veth() (link, machine, nodeEnd string) {
	return fmt.Sprintf("dpv-%d", n.index), fmt.Sprintf("10.243.%d.1", n.index), fmt.Sprintf("10.243.%d.2", n.index)
}

// nodePath is a path of node n's own parts (containerd, kubelet, CNI) under the cluster's
// directory: the first node's where a single-node cluster always had them, the others' under
// node<index> (short: the kubelet's plugin sockets are under it, and a socket's path has at
// most 107 bytes).
func (c *Cluster) nodePath(n *node, elem ...string) string {
	if n.index == 1 {
		return c.path(elem...)
	}
	return c.path(append([]string{fmt.Sprintf("node%d", n.index)}, elem...)...)
}

// podLogs is where node n's kubelet writes its pods' logs: a directory of its own, since a
// kubelet removes from its directory the logs of pods it does not know.
func (c *Cluster) podLogs(n *node) string {
	if n.index == 1 {
		return c.path("logs", "pods")
	}
	return c.path("logs", "pods-"+n.name)
}

// NodeNames are the cluster's nodes, the first the one the control plane's address is on.
func (c *Cluster) NodeNames() []string {
	names := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		names[i] = n.name
	}
	return names
}

// nodeNamespace starts node n's own PID and mount namespace (and, past the first node, its
// network namespace), whose PID 1 is the harness's pause binary (it reaps orphans):
// containerd and the kubelet, and so every pod, run in it. KubeVirt's virt-handler needs what
// it gives: a PID 1 whose /proc/1/ns/mnt it may read (the machine's own init is out of reach
// here), the kubelet's root at /var/lib/kubelet (the harness's directory, bind-mounted there
// in the namespace only), and shared mount propagation for its Bidirectional mounts. The
// kubelet's directory is also a shared mount on the machine: what the CSI driver (in the
// test's process) mounts there reaches the kubelet, and what the kubelet mounts the teardown
// finds.
func (c *Cluster) nodeNamespace(ctx context.Context, n *node) error {
	root := c.nodePath(n, "kubelet", "root")
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
	c.step("%s: its PID and mount namespace", n.name)
	// The init names the node's kubelet directory, so that a later teardown finds it.
	script := fmt.Sprintf("set -e; mount --make-rshared /; mount --bind %q %s; ", root, KubeletRoot)
	if n.index > 1 {
		// KubeVirt's handler keeps its VMs' sockets, mounts and records on the node's own
		// paths: past the first node (which has the machine's), each node has its own.
		for _, dir := range kubeVirtNodeDirs {
			own := c.nodePath(n, "kubevirt", filepath.Base(dir))
			if err := os.MkdirAll(own, 0o755); err != nil {
				return err
			}
			script += fmt.Sprintf("mkdir -p %s; mount --bind %q %s; ", dir, own, dir)
		}
	}
	script += fmt.Sprintf("exec %q %q", initBin, root)
	args := []string{"--pid", "--fork", "--mount", "--mount-proc", "--propagation", "unchanged"}
	if n.netns != "" {
		args = append(args, "--net")
	}
	if err := c.start(n.proc("node"), "unshare", append(args, "--", "sh", "-c", script)...); err != nil {
		return err
	}
	if err := c.wait(ctx, n.name+"'s namespace", n.proc("node"), 30*time.Second, func(context.Context) error {
		pid, err := c.nodeInit(n, initBin)
		n.pid = pid
		return err
	}); err != nil {
		return err
	}
	if n.netns != "" {
		return c.nodeNetwork(n)
	}
	return nil
}

// nodeNetwork joins node n's network namespace to the machine: a name for it (ip netns), the
// veth pair, the pod bridge, the routes both ways, and the kernel settings kube-proxy and the
// bridge need there.
func (c *Cluster) nodeNetwork(n *node) error {
	link, machine, end := n.veth()
	c.step("%s: network namespace %s, veth %s %s, pods %s on its bridge %s", n.name, n.netns, link, end, n.podSubnet, n.ip)
	in := func(args ...string) []string { return append([]string{"-n", n.netns}, args...) }
	for _, args := range [][]string{
		{"netns", "attach", n.netns, strconv.Itoa(n.pid)},
		{"link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", n.netns},
		{"addr", "add", machine + "/30", "dev", link},
		{"link", "set", link, "up"},
		in("link", "set", "lo", "up"),
		in("addr", "add", end+"/30", "dev", "eth0"),
		in("link", "set", "eth0", "up"),
		in("link", "add", Bridge, "type", "bridge"),
		in("addr", "add", n.ip+"/24", "dev", Bridge),
		in("link", "set", Bridge, "up"),
		in("route", "add", "default", "via", machine),
		{"route", "add", n.podSubnet, "via", end},
	} {
		if err := run("ip", args...); err != nil {
			return err
		}
	}
	return run("ip", "netns", "exec", n.netns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1")
}

// nodeInit finds PID 1 of node n's namespace, as the machine sees it: the child of unshare
// that runs initBin, with its mount in place.
func (c *Cluster) nodeInit(n *node, initBin string) (int, error) {
	c.mu.Lock()
	var unshare int
	for _, p := range c.procs {
		if p.name == n.proc("node") {
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

// startInNode starts a component inside node n's namespaces.
func (c *Cluster) startInNode(n *node, component, bin string, args ...string) error {
	enter := []string{"--target", strconv.Itoa(n.pid), "--pid", "--mount"}
	if n.netns != "" {
		enter = append(enter, "--net")
	}
	return c.start(n.proc(component), "nsenter", append(append(enter, "--", bin), args...)...)
}

// startNode starts node n's containerd, kubelet and kube-proxy, and waits until it is Ready.
func (c *Cluster) startNode(ctx context.Context, n *node) error {
	if err := c.nodeNamespace(ctx, n); err != nil {
		return err
	}
	for _, d := range []string{"containerd", "cni/net.d", "cni/ipam", "kubelet"} {
		if err := os.MkdirAll(c.nodePath(n, d), 0o755); err != nil {
			return err
		}
	}
	sock := c.nodePath(n, "containerd", "containerd.sock")
	hosts := c.nodePath(n, "containerd", "certs.d", registry)
	if err := os.MkdirAll(hosts, 0o755); err != nil {
		return err
	}
	// The registry's name is the machine's loopback address; a node on a network of its own
	// reaches it at the control plane's address (registryForward).
	server := "http://" + registry
	if n.netns != "" {
		server = "http://" + registryOnNodeIP
	}
	if err := os.WriteFile(filepath.Join(hosts, "hosts.toml"), fmt.Appendf(nil, `server = %q
[host.%q]
  capabilities = ["pull", "resolve"]
`, server, server), 0o644); err != nil {
		return err
	}
	// restrict_oom_score_adj: this machine's root lacks CAP_SYS_RESOURCE, and runc fails to
	// lower a container's oom_score_adj without it. device_ownership_from_security_context:
	// a block volume's device belongs to the pod's runAsUser and runAsGroup, so that a
	// non-root importer can write it (what KubeVirt and CDI ask of containerd too).
	config := c.nodePath(n, "containerd", "config.toml")
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
`, c.nodePath(n, "containerd", "root"), c.nodePath(n, "containerd", "state"), sock, PauseImage, c.bin("cni"), c.nodePath(n, "cni", "net.d"),
		c.nodePath(n, "containerd", "certs.d")), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(c.nodePath(n, "cni", "net.d", "10-diskpipe.conflist"), fmt.Appendf(nil, `{
  "cniVersion": "1.0.0",
  "name": "diskpipe",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q, "gateway": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, Bridge, n.podSubnet, n.ip, c.nodePath(n, "cni", "ipam")), 0o644); err != nil {
		return err
	}
	c.step("%s: containerd", n.name)
	if err := c.startInNode(n, "containerd", "containerd", "--config", config); err != nil {
		return err
	}
	if err := c.wait(ctx, n.name+"'s containerd", n.proc("containerd"), time.Minute, func(ctx context.Context) error {
		return exec.CommandContext(ctx, "ctr", "--address", sock, "version").Run()
	}); err != nil {
		return err
	}

	api := "https://" + net.JoinHostPort(NodeIP, apiPort)
	kubeletKC, err := c.pki.Kubeconfig(n.proc("kubelet"), api, "system:node:"+n.name, "system:nodes")
	if err != nil {
		return err
	}
	// Past the first node, each kubelet keeps its pods' cgroups under a root of its own: two
	// kubelets under one would each remove the other's pods' cgroups as orphans.
	cgroupRoot := ""
	if n.index > 1 {
		cgroupRoot = "cgroupRoot: /" + n.name
		if err := makeCgroups(n.name); err != nil {
			return fmt.Errorf("%s's cgroup: %w", n.name, err)
		}
	}
	kubeletConfig := c.nodePath(n, "kubelet", "config.yaml")
	if err := os.WriteFile(kubeletConfig, fmt.Appendf(nil, `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
%s
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
`, cgroupRoot, NodeIP, sock, EvictionDiskFree, EvictionDiskFree, c.podLogs(n), c.nodePath(n, "kubelet", "volume-plugins"), c.pki.CAFile), 0o644); err != nil {
		return err
	}
	c.step("%s: kubelet", n.name)
	if err := c.startInNode(n, "kubelet", c.bin("kubelet"), "--config", kubeletConfig, "--kubeconfig", kubeletKC,
		"--root-dir", KubeletRoot, "--cert-dir", c.nodePath(n, "kubelet", "pki"),
		"--hostname-override", n.name, "--node-ip", n.ip); err != nil {
		return err
	}

	proxyKC, err := c.pki.Kubeconfig(n.proc("kube-proxy"), api, "system:kube-proxy")
	if err != nil {
		return err
	}
	proxyConfig := c.nodePath(n, "kube-proxy.yaml")
	if err := os.WriteFile(proxyConfig, fmt.Appendf(nil, `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: %s
hostnameOverride: %s
clientConnection: {kubeconfig: %s}
conntrack: {maxPerCore: 0}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
`, ClusterCIDR, n.name, proxyKC), 0o644); err != nil {
		return err
	}
	c.step("%s: kube-proxy (iptables)", n.name)
	if n.netns == "" {
		err = c.start("kube-proxy", c.bin("kube-proxy"), "--config", proxyConfig)
	} else {
		err = c.startInNode(n, "kube-proxy", c.bin("kube-proxy"), "--config", proxyConfig)
	}
	if err != nil {
		return err
	}
	return c.nodeReady(ctx, n, time.Time{})
}

// nodeReady waits until node n is Ready by a heartbeat of its kubelet's at or after since.
func (c *Cluster) nodeReady(ctx context.Context, n *node, since time.Time) error {
	since = since.Truncate(time.Second) // a heartbeat's time has whole seconds
	return c.wait(ctx, n.name+" to be Ready", n.proc("kubelet"), 3*time.Minute, func(ctx context.Context) error {
		node := &corev1.Node{}
		if err := c.Client.Get(ctx, client.ObjectKey{Name: n.name}, node); err != nil {
			return err
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				switch {
				case cond.LastHeartbeatTime.Before(&metav1.Time{Time: since}):
					// What a kubelet said before it was stopped: the node controller may not
					// have marked it NotReady yet.
					return fmt.Errorf("no heartbeat since %s", since.Format(time.TimeOnly))
				case cond.Status == corev1.ConditionTrue:
					return nil
				}
				return fmt.Errorf("%s: %s", cond.Reason, cond.Message)
			}
		}
		return fmt.Errorf("no Ready condition")
	})
}

// makeCgroups makes the cgroup name under the root: in each controller's hierarchy on cgroup
// v1 (cpuset's with its parent's CPUs and memory nodes, which a new one lacks), in the one
// hierarchy on v2.
func makeCgroups(name string) error {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return os.MkdirAll(filepath.Join("/sys/fs/cgroup", name), 0o755)
	}
	controllers, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return err
	}
	for _, ctl := range controllers {
		root := filepath.Join("/sys/fs/cgroup", ctl.Name())
		if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
			continue
		}
		if err := os.MkdirAll(filepath.Join(root, name), 0o755); err != nil {
			return err
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if v, err := os.ReadFile(filepath.Join(root, f)); err == nil {
				if err := os.WriteFile(filepath.Join(root, name, f), v, 0o644); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// dns starts CoreDNS on the control plane's address, which every kubelet gives its pods as
// their nameserver, and waits until it answers.
func (c *Cluster) dns(ctx context.Context) error {
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
