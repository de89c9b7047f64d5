package cluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/controllers/manager"
	"github.com/diskpipe/diskpipe/test/pki"
	"github.com/diskpipe/diskpipe/test/testenv"
)

// The node's network: the bridge dp0 carries the pods, and its address is the node's, where
// the apiserver, CoreDNS and NodePorts listen. Service addresses are routed into the bridge so
// that none ever leaves the machine.
const (
	NodeName    = "diskpipe-node"
	NodeIP      = "10.244.0.1"
	Bridge      = "dp0"
	PodSubnet   = "10.244.0.0/24"
	ClusterCIDR = "10.244.0.0/16"
	ServiceCIDR = "10.96.0.0/16"
	APIServerIP = "10.96.0.1" // the kubernetes Service
	apiPort     = "6443"
	// DefaultDir is where a cluster lives unless told otherwise.
	DefaultDir = "/var/lib/diskpipe-cluster"
)

// The node shares its disk with the machine. The kubelet's usual eviction threshold (10 %, or
// even 1 % of a large shared disk) evicts diskpipe's own pods, the manager first, while
// gigabytes are still free; here it evicts only when the disk is all but full. MinFreeDisk is
// what a start asks to find free, so that a run does not come near that: the e2e suite's
// cluster grew to 3.5 GB, and its work directory holds about 1.2 GB more.
const (
	EvictionDiskFree = "256Mi"
	MinFreeDisk      = 6 << 30
)

// Options shape a cluster.
type Options struct {
	// Bin holds the binaries: kube-*, kubelet, etcd, coredns, the CSI sidecars, helm, cni/.
	Bin string
	// Dir holds everything the cluster writes (DefaultDir when empty).
	Dir string
	// Image is the OCI archive of diskpipe's image (make image); Pause that of the pause image.
	Image, Pause string
	// Chart is charts/diskpipe; HelmArgs are added to its install (e.g. --set ...).
	Chart    string
	HelmArgs []string
	// Log receives what the cluster does.
	Log io.Writer
	// KubeVirt installs the real KubeVirt (make kubevirt-images) in place of the trimmed
	// VirtualMachine CRD of test/crds/kubevirt.
	KubeVirt bool
	// KubeVirtLater returns from Start once KubeVirt's rollout has begun and diskpipe is
	// installed, rather than once KubeVirt is Available; WaitKubeVirt waits for the rest. The
	// end-to-end suite runs its other specs meanwhile.
	KubeVirtLater bool
	// Nodes is how many nodes the cluster has (default 1, at most MaxNodes).
	Nodes int
}

// Cluster is a running cluster.
type Cluster struct {
	opts Options
	// Kubeconfig is an administrator's kubeconfig; Config and Client reach the apiserver as one.
	Kubeconfig string
	Config     *rest.Config
	Client     client.Client
	// Registry is the address of the registry containerd pulls from.
	Registry string

	pki   *pki.Authority
	floor float64 // StorageFloor
	mu    sync.Mutex
	procs []*proc
	nodes []*node
	// bg ends with Stop: the parts that run in this process (the CSI driver, the registry's
	// forward) run until it does.
	bg context.Context
	// killedMetrics is what each manager pod RestartManager deleted served last; unscraped
	// says which could not be read first.
	killedMetrics []string
	unscraped     []error
	cancel        context.CancelFunc
	sysctls       map[string]string
	// kubeVirtDone is closed when KubeVirt is Available or will not be (kubeVirtErr).
	kubeVirtDone chan struct{}
	kubeVirtErr  error
}

type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// Start brings the cluster up and installs diskpipe with its chart. It needs root, runc and
// containerd; without them it says what is missing.
func Start(ctx context.Context, o Options) (c *Cluster, err error) {
	if o.Dir == "" {
		o.Dir = DefaultDir
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if err := Preflight(o.Bin); err != nil {
		return nil, err
	}
	teardown(o.Dir, o.Log) // whatever a previous run left
	_ = os.RemoveAll(filepath.Join(o.Dir, "logs"))
	if err := enoughDisk(o.Dir, o.Log); err != nil {
		return nil, err
	}
	if o.Nodes == 0 {
		o.Nodes = 1
	}
	if o.Nodes < 1 || o.Nodes > MaxNodes {
		return nil, fmt.Errorf("a cluster of %d nodes: from 1 to %d", o.Nodes, MaxNodes)
	}
	cl := &Cluster{opts: o, sysctls: map[string]string{}}
	cl.bg, cl.cancel = context.WithCancel(context.Background())
	for i := 1; i <= o.Nodes; i++ {
		cl.nodes = append(cl.nodes, newNode(i))
	}
	c = cl
	defer func() {
		if err != nil {
			cl.logTails()
			cl.Stop()
		}
	}()
	for _, d := range []string{"logs", "etcd", "kubelet", "containerd", "cni/net.d", "cni/ipam", "csi", "registry"} {
		if err := os.MkdirAll(filepath.Join(o.Dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := c.csiStore(); err != nil {
		return nil, fmt.Errorf("the CSI driver's filesystem: %w", err)
	}
	c.step("network: bridge %s %s/24, services %s routed into it", Bridge, NodeIP, ServiceCIDR)
	if err := c.network(); err != nil {
		return nil, fmt.Errorf("the node's network: %w", err)
	}
	if err := c.controlPlane(ctx); err != nil {
		return nil, err
	}
	if err := c.images(ctx); err != nil {
		return nil, err
	}
	if len(c.nodes) > 1 {
		if err := registryForward(c.bg); err != nil {
			return nil, fmt.Errorf("the registry on %s: %w", registryOnNodeIP, err)
		}
	}
	for _, n := range c.nodes {
		if err := c.startNode(ctx, n); err != nil {
			return nil, err
		}
	}
	if err := c.dns(ctx); err != nil {
		return nil, err
	}
	if err := c.storage(ctx); err != nil {
		return nil, err
	}
	if o.KubeVirt {
		if err := c.kubevirt(ctx); err != nil {
			return nil, err
		}
	}
	if err := c.install(ctx); err != nil {
		return nil, err
	}
	if o.KubeVirt {
		c.kubeVirtDone = make(chan struct{})
		go func() {
			defer close(c.kubeVirtDone)
			c.kubeVirtErr = c.kubevirtAvailable(ctx)
		}()
		if !o.KubeVirtLater {
			if err := c.WaitKubeVirt(); err != nil {
				return nil, err
			}
		}
	}
	return c, nil
}

func (c *Cluster) step(format string, args ...any) {
	fmt.Fprintf(c.opts.Log, "%s cluster: %s\n", time.Now().Format(time.TimeOnly), fmt.Sprintf(format, args...))
}

func (c *Cluster) path(elem ...string) string {
	return filepath.Join(append([]string{c.opts.Dir}, elem...)...)
}

func (c *Cluster) bin(name string) string { return filepath.Join(c.opts.Bin, name) }

// Preflight says what this machine lacks to run the cluster, or nil.
func Preflight(bin string) error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (the kubelet, containerd and the CNI plugins need it)")
	}
	for _, p := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "iptables-save", "ip", "losetup", "docker-registry", "conntrack"} {
		if _, err := exec.LookPath(p); err != nil {
			missing = append(missing, p+" (hack/setup.sh cluster installs it from Debian)")
		}
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl",
		"coredns", "csi-provisioner", "csi-snapshotter", "snapshot-controller", "helm", "cni/bridge", "cni/host-local", "cni/loopback", "cni/portmap"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			missing = append(missing, "bin/"+b+" (make cluster-tools builds it)")
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("this machine cannot run the real cluster; missing: %s", strings.Join(missing, "; "))
	}
	return nil
}

// enoughDisk says whether the disk that holds dir has MinFreeDisk free.
func enoughDisk(dir string, log io.Writer) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return fmt.Errorf("the free space under %s: %w", dir, err)
	}
	free := int64(st.Bavail) * st.Bsize
	fmt.Fprintf(log, "%s cluster: disk: %.1f GiB free under %s\n", time.Now().Format(time.TimeOnly), float64(free)/(1<<30), dir)
	if free < MinFreeDisk {
		return fmt.Errorf("%s has %.1f GiB free; the cluster and its volumes need %d GiB (the kubelet evicts pods below %s)",
			dir, float64(free)/(1<<30), MinFreeDisk>>30, EvictionDiskFree)
	}
	return nil
}

// start runs a component, its output in logs/<name>.log, in a process group of its own.
func (c *Cluster) start(name, bin string, args ...string) error {
	logf, err := os.OpenFile(c.path("logs", name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...) //nolint:gosec // the cluster's own binaries
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Env = append(os.Environ(), "PATH="+os.Getenv("PATH")+":/usr/sbin:/sbin")
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(p.done) }()
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return nil
}

// exited says whether a component has ended, for the waits to fail at once: its last run,
// when StartNode started it again.
func (c *Cluster) exited(name string) error {
	p := c.procNamed(name)
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
		return fmt.Errorf("%s exited: %s (its log: %s)", name, p.cmd.ProcessState, c.path("logs", name+".log"))
	default:
		return nil
	}
}

// wait polls check until it succeeds, the component named ends, or the time is up.
func (c *Cluster) wait(ctx context.Context, what, component string, timeout time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		if e := c.exited(component); e != nil {
			return fmt.Errorf("%s: %w", what, e)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not within %s: %w", what, timeout, err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// setSysctl sets a sysctl, remembering its value for Stop.
func (c *Cluster) setSysctl(key, value string) error {
	p := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	old, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if _, ok := c.sysctls[key]; !ok {
		c.sysctls[key] = strings.TrimSpace(string(old))
	}
	return os.WriteFile(p, []byte(value), 0o644)
}

func (c *Cluster) network() error {
	if err := run("ip", "link", "add", Bridge, "type", "bridge"); err != nil {
		return err
	}
	if err := run("ip", "addr", "add", NodeIP+"/24", "dev", Bridge); err != nil {
		return err
	}
	if err := run("ip", "link", "set", Bridge, "up"); err != nil {
		return err
	}
	if err := run("ip", "route", "add", ServiceCIDR, "dev", Bridge); err != nil {
		return err
	}
	// The kernel settings kube-proxy and the bridge need, and the ones the kubelet would set
	// itself (remembered here so that Stop restores them).
	for k, v := range map[string]string{"net.ipv4.ip_forward": "1", "net.bridge.bridge-nf-call-iptables": "1",
		"kernel.panic": "10", "kernel.panic_on_oops": "1", "vm.overcommit_memory": "1"} {
		if err := c.setSysctl(k, v); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) controlPlane(ctx context.Context) error {
	var err error
	if c.pki, err = pki.New(c.path("pki"), "diskpipe-test-cluster-ca"); err != nil {
		return err
	}
	server := "https://" + net.JoinHostPort(NodeIP, apiPort)
	apiCrt, apiKey, err := c.pki.Issue("apiserver", "kube-apiserver", nil, NodeIP, APIServerIP, "127.0.0.1", "localhost",
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")
	if err != nil {
		return err
	}
	kubeletClientCrt, kubeletClientKey, err := c.pki.Issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"})
	if err != nil {
		return err
	}
	saKey, saPub, err := c.pki.ServiceAccountKeys()
	if err != nil {
		return err
	}
	if c.Kubeconfig, err = c.pki.Kubeconfig("admin", server, "kubernetes-admin", "system:masters"); err != nil {
		return err
	}
	// The front-proxy, so that the apiserver forwards to aggregated APIs (diskpipe's upload
	// tokens), reaching their pods directly.
	frontProxy, err := pki.FrontProxyFlags(c.path("pki", "front-proxy"))
	if err != nil {
		return err
	}
	aggregator := []string{"--enable-aggregator-routing=true"}
	for _, name := range slices.Sorted(maps.Keys(frontProxy)) {
		aggregator = append(aggregator, "--"+name, frontProxy[name])
	}

	c.step("etcd")
	if err := c.start("etcd", c.bin("etcd"), "--data-dir", c.path("etcd"), "--listen-client-urls", "http://127.0.0.1:2479",
		"--advertise-client-urls", "http://127.0.0.1:2479", "--listen-peer-urls", "http://127.0.0.1:2480",
		"--initial-advertise-peer-urls", "http://127.0.0.1:2480", "--initial-cluster", "default=http://127.0.0.1:2480",
		"--unsafe-no-fsync"); err != nil {
		return err
	}
	c.step("kube-apiserver on %s", server)
	if err := c.start("kube-apiserver", c.bin("kube-apiserver"), append([]string{"--etcd-servers", "http://127.0.0.1:2479",
		"--bind-address", NodeIP, "--advertise-address", NodeIP, "--secure-port", apiPort,
		"--service-cluster-ip-range", ServiceCIDR, "--client-ca-file", c.pki.CAFile,
		"--tls-cert-file", apiCrt, "--tls-private-key-file", apiKey,
		"--service-account-key-file", saPub, "--service-account-signing-key-file", saKey,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction", "--allow-privileged=true",
		"--kubelet-client-certificate", kubeletClientCrt, "--kubelet-client-key", kubeletClientKey,
		"--kubelet-preferred-address-types", "InternalIP"}, aggregator...)...); err != nil {
		return err
	}
	if c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig); err != nil {
		return err
	}
	c.Config.QPS, c.Config.Burst = 100, 200
	if c.Client, err = client.New(c.Config, client.Options{Scheme: manager.NewScheme()}); err != nil {
		return err
	}
	if err := c.wait(ctx, "the apiserver's /readyz", "kube-apiserver", 2*time.Minute, c.ready); err != nil {
		return err
	}

	kcm, err := c.pki.Kubeconfig("controller-manager", server, "system:kube-controller-manager")
	if err != nil {
		return err
	}
	c.step("kube-controller-manager, kube-scheduler")
	if err := c.start("kube-controller-manager", c.bin("kube-controller-manager"), "--kubeconfig", kcm,
		"--authentication-kubeconfig", kcm, "--authorization-kubeconfig", kcm,
		"--bind-address", "127.0.0.1", "--secure-port", "10257", "--leader-elect=false",
		"--service-account-private-key-file", saKey, "--root-ca-file", c.pki.CAFile, "--use-service-account-credentials",
		"--cluster-signing-cert-file", c.pki.CAFile, "--cluster-signing-key-file", c.path("pki", "ca.key"),
		"--service-cluster-ip-range", ServiceCIDR, "--cluster-cidr", ClusterCIDR, "--allocate-node-cidrs=false",
		"--controllers", "*"); err != nil {
		return err
	}
	sched, err := c.pki.Kubeconfig("scheduler", server, "system:kube-scheduler")
	if err != nil {
		return err
	}
	return c.start("kube-scheduler", c.bin("kube-scheduler"), "--kubeconfig", sched,
		"--authentication-kubeconfig", sched, "--authorization-kubeconfig", sched,
		"--bind-address", "127.0.0.1", "--secure-port", "10259", "--leader-elect=false")
}

func (c *Cluster) ready(ctx context.Context) error {
	rc, err := rest.HTTPClientFor(c.Config)
	if err != nil {
		return err
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.Config.Host+"/readyz", nil)
	resp, err := rc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, body)
	}
	return nil
}

// Stop takes the cluster down: containers, processes, mounts, loop devices, network, iptables,
// cgroups and sysctls. The logs stay in Dir/logs.
func (c *Cluster) Stop() {
	if c.cancel != nil {
		c.cancel()
	}
	c.mu.Lock()
	procs := append([]*proc(nil), c.procs...)
	c.mu.Unlock()
	// The kubelets first, so that they restart nothing; then the containers; then the rest.
	for _, p := range procs {
		if p.name == "kubelet" || strings.HasPrefix(p.name, "kubelet-") {
			stopProc(p)
		}
	}
	killContainers(c.opts.Dir, c.opts.Log)
	for i := len(procs) - 1; i >= 0; i-- {
		stopProc(procs[i])
	}
	for k, v := range c.sysctls {
		_ = os.WriteFile("/proc/sys/"+strings.ReplaceAll(k, ".", "/"), []byte(v), 0o644)
	}
	teardown(c.opts.Dir, c.opts.Log)
}

func stopProc(p *proc) {
	if p.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// logTails prints the end of every component's log, for a start that failed.
func (c *Cluster) logTails() {
	entries, _ := os.ReadDir(c.path("logs"))
	for _, e := range entries {
		data, _ := os.ReadFile(c.path("logs", e.Name()))
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		fmt.Fprintf(c.opts.Log, "----- %s (last lines)\n%s\n", e.Name(), strings.Join(lines[max(0, len(lines)-15):], "\n"))
	}
}

// Namespace creates a namespace whose pods must meet Pod Security "restricted", unless it
// exists.
func (c *Cluster) Namespace(ctx context.Context, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted"}}}
	if err := c.Client.Create(ctx, ns); client.IgnoreAlreadyExists(err) != nil {
		return err
	}
	return nil
}

// Kubectl runs bin/kubectl as the administrator with stdin as its input.
func (c *Cluster) Kubectl(ctx context.Context, stdin []byte, args ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin("kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...) //nolint:gosec // the pinned kubectl
	var out, errb bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(stdin), &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// DefaultOptions are the options of a cluster of this checkout: binaries and images from bin/
// (make cluster-tools image pause-image), the chart from charts/diskpipe; the real KubeVirt
// when DISKPIPE_KUBEVIRT=1 (make kubevirt-images).
func DefaultOptions(log io.Writer) Options {
	return Options{Bin: testenv.Path("bin"), Dir: DefaultDir, Image: testenv.Path("bin", "diskpipe-image.tar"),
		Pause: testenv.Path("bin", "pause-image.tar"), Chart: testenv.ChartPath(), Log: log,
		KubeVirt: os.Getenv("DISKPIPE_KUBEVIRT") == "1", Nodes: nodesFromEnv()}
}

// nodesFromEnv is DISKPIPE_NODES (make ... NODES=3): how many nodes; 1 when unset.
func nodesFromEnv() int {
	n, err := strconv.Atoi(os.Getenv("DISKPIPE_NODES"))
	if err != nil || n < 1 {
		return 1
	}
	return n
}
