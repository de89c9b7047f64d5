package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// What the end-to-end specs ask of a cluster (test/e2e's Cluster), answered by the real node.

// APIClient is a direct client as the administrator.
func (c *Cluster) APIClient() client.Client { return c.Client }

// EnsureNamespace makes a namespace that enforces Pod Security "restricted", like every
// namespace where diskpipe runs pods here.
func (c *Cluster) EnsureNamespace(ctx context.Context, name string) error {
	return c.Namespace(ctx, name)
}

// HostAddress is where a test's own servers listen so that pods reach them: the node's address.
func (c *Cluster) HostAddress() string { return NodeIP }

// VolumePath is the directory of a bound PVC's volume in the harness's CSI driver (disk.img of
// a filesystem volume, block.img of a block one).
func (c *Cluster) VolumePath(ns, pvc string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	claim := &corev1.PersistentVolumeClaim{}
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: pvc}, claim); err != nil || claim.Spec.VolumeName == "" {
		return c.path("csi", "volumes", "unbound-"+ns+"-"+pvc)
	}
	pv := &corev1.PersistentVolume{}
	if err := c.Client.Get(ctx, client.ObjectKey{Name: claim.Spec.VolumeName}, pv); err != nil || pv.Spec.CSI == nil {
		return c.path("csi", "volumes", "unknown-"+claim.Spec.VolumeName)
	}
	return c.path("csi", "volumes", pv.Spec.CSI.VolumeHandle)
}

// KillPod SIGKILLs a running pod's container through containerd, as the kernel's OOM killer or
// a crash would: the kubelet sees it end without a result.
func (c *Cluster) KillPod(ns, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pod := &corev1.Pod{}
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pod); err != nil {
		return err
	}
	n := c.nodeNamed(pod.Spec.NodeName)
	if n == nil {
		return fmt.Errorf("pod %s/%s is on node %q, none of the cluster's", ns, name, pod.Spec.NodeName)
	}
	for _, s := range pod.Status.ContainerStatuses {
		if id, ok := strings.CutPrefix(s.ContainerID, "containerd://"); ok && s.State.Running != nil {
			return run("ctr", "--address", c.nodePath(n, "containerd", "containerd.sock"), "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", id)
		}
	}
	return fmt.Errorf("pod %s/%s has no running container", ns, name)
}

// nodeNamed is the cluster's node of that name, or nil.
func (c *Cluster) nodeNamed(name string) *node {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// RestartManager SIGKILLs the manager's containers and deletes their pods, as a node's loss
// would; their Deployment makes new ones, which elect a leader and adopt what was running.
// (Deleting a pod alone leaves its container running for a while after the pod is gone.)
func (c *Cluster) RestartManager() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A manager on a node whose agents are stopped (StopNode) cannot be killed: deleted, it
	// would run on unseen beside its successor, counting what no scrape reads. Not now, then.
	running, err := c.componentPods(ctx, "manager")
	if err != nil {
		return err
	}
	for _, p := range running {
		if c.agentsStopped(p.Spec.NodeName) {
			return fmt.Errorf("the manager pod %s is on %s, whose kubelet and containerd are stopped: not restarted now", p.Name, p.Spec.NodeName)
		}
	}
	// Its counters die with it: keep what it served last (ManagerCounter).
	scrape, cancelScrape := context.WithTimeout(ctx, 10*time.Second)
	texts, err := c.ManagerMetrics(scrape)
	cancelScrape()
	c.mu.Lock()
	c.killedMetrics = append(c.killedMetrics, texts...)
	if err != nil {
		c.unscraped = append(c.unscraped, err)
	}
	c.mu.Unlock()
	deploy := &appsv1.Deployment{}
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: ReleaseNamespace, Name: Release + "-manager"}, deploy); err != nil {
		return err
	}
	pods, err := c.componentPods(ctx, "manager")
	if err != nil {
		return err
	}
	old := map[types.UID]bool{}
	for _, p := range pods {
		old[p.UID] = true
		_ = c.KillPod(p.Namespace, p.Name) // one that is not running has nothing to kill
	}
	if err := c.Client.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(ReleaseNamespace),
		client.MatchingLabels{"app.kubernetes.io/component": "manager"}, client.GracePeriodSeconds(0)); err != nil {
		return err
	}
	// The Deployment's status still counts the deleted pods ready for a moment: wait for new
	// pods, all ready.
	return c.podsReady(ctx, "new manager pods", "manager", ptr.Deref(deploy.Spec.Replicas, 1), old)
}

// componentPods lists the pods of one of the release's components.
func (c *Cluster) componentPods(ctx context.Context, component string) ([]corev1.Pod, error) {
	pods := &corev1.PodList{}
	err := c.Client.List(ctx, pods, client.InNamespace(ReleaseNamespace), client.MatchingLabels{"app.kubernetes.io/component": component})
	return pods.Items, err
}

// podsReady waits until want pods of a component are ready, counting none of old; it counts
// pods, not their Deployment's or StatefulSet's status, which lags behind them. When the time
// is up, the error says what each pod that is not ready is waiting for.
func (c *Cluster) podsReady(ctx context.Context, what, component string, want int32, old map[types.UID]bool) error {
	return c.wait(ctx, what, "kubelet", 2*time.Minute, func(ctx context.Context) error {
		pods, err := c.componentPods(ctx, component)
		if err != nil {
			return err
		}
		var ready int32
		var waiting []string
		for _, p := range pods {
			switch {
			case old[p.UID]:
			case p.DeletionTimestamp == nil && podReady(&p):
				ready++
			default:
				waiting = append(waiting, podState(&p))
			}
		}
		if ready < want {
			return fmt.Errorf("%d of %d pods of %s ready; %s", ready, want, component, strings.Join(waiting, "; "))
		}
		return nil
	})
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podState says what a pod that is not ready is going through: its phase, the conditions
// that do not hold and why its containers wait or ended.
func podState(p *corev1.Pod) string {
	parts := []string{p.Name + " " + string(p.Status.Phase)}
	if p.DeletionTimestamp != nil {
		parts = append(parts, "deleting")
	}
	for _, cond := range p.Status.Conditions {
		if cond.Status != corev1.ConditionTrue {
			parts = append(parts, strings.TrimSpace(fmt.Sprintf("%s=%s %s %s", cond.Type, cond.Status, cond.Reason, cond.Message)))
		}
	}
	for _, st := range p.Status.ContainerStatuses {
		switch {
		case st.State.Waiting != nil:
			parts = append(parts, strings.TrimSpace(fmt.Sprintf("%s waiting: %s %s", st.Name, st.State.Waiting.Reason, st.State.Waiting.Message)))
		case st.State.Terminated != nil:
			parts = append(parts, strings.TrimSpace(fmt.Sprintf("%s ended: %s %s", st.Name, st.State.Terminated.Reason, st.State.Terminated.Message)))
		}
		if st.RestartCount > 0 {
			parts = append(parts, fmt.Sprintf("%s restarted %d times", st.Name, st.RestartCount))
		}
	}
	return strings.Join(parts, ", ")
}

// StoreInCluster is the bundled store's address as pods reach it: its Service (the chart's
// default port).
func (c *Cluster) StoreInCluster() string {
	return fmt.Sprintf("http://%s-objectstore.%s.svc:9000", Release, ReleaseNamespace)
}

// StoreAccess is the bundled store's public endpoint and its keys, read from the Secret the
// README tells users to read them from.
func (c *Cluster) StoreAccess(ctx context.Context) (endpoint, id, secret string, err error) {
	id, secret, err = c.storeKeys(ctx)
	return StoreEndpoint, id, secret, err
}

// storeKeys reads the bundled store's root keys from the Secret the chart made.
func (c *Cluster) storeKeys(ctx context.Context) (id, secret string, err error) {
	s := &corev1.Secret{}
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: ReleaseNamespace, Name: Release + "-objectstore"}, s); err != nil {
		return "", "", fmt.Errorf("the store's keys: %w", err)
	}
	return string(s.Data["accessKeyId"]), string(s.Data["secretAccessKey"]), nil
}

// AWS runs Debian's awscli against the bundled store through its NodePort, with its keys.
func (c *Cluster) AWS(ctx context.Context, args ...string) (string, error) {
	id, secret, err := c.storeKeys(ctx)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/usr/bin/aws", append([]string{"--endpoint-url", StoreEndpoint, "--no-cli-pager"}, args...)...)
	cmd.Env = []string{"AWS_ACCESS_KEY_ID=" + id, "AWS_SECRET_ACCESS_KEY=" + secret, "AWS_DEFAULT_REGION=us-east-1",
		"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null", "HOME=" + c.path()}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// StopStore scales the bundled store's StatefulSet to nothing and waits until its pod is gone.
func (c *Cluster) StopStore() error { return c.scale(&appsv1.StatefulSet{}, "objectstore", 0) }

// StartStore brings the bundled store back and waits until it is ready.
func (c *Cluster) StartStore() error { return c.scale(&appsv1.StatefulSet{}, "objectstore", 1) }

// ScaleManager gives the manager's Deployment n replicas and waits until they are ready, or,
// for 0, until its pods are gone.
func (c *Cluster) ScaleManager(n int32) error { return c.scale(&appsv1.Deployment{}, "manager", n) }

// scale gives the release's Deployment or StatefulSet of a component n replicas.
func (c *Cluster) scale(obj client.Object, component string, n int32) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := Release + "-" + component
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: ReleaseNamespace, Name: name}, obj); err != nil {
		return err
	}
	// A patch, not an update: the controllers write the object's status all the time (the
	// StatefulSet's right after its pod went), and an update from a read a moment old would
	// fail on the conflict and leave the replicas as they were.
	base := obj.DeepCopyObject().(client.Object)
	switch o := obj.(type) {
	case *appsv1.Deployment:
		o.Spec.Replicas = ptr.To(n)
	case *appsv1.StatefulSet:
		o.Spec.Replicas = ptr.To(n)
	}
	if err := c.Client.Patch(ctx, obj, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("scaling %s to %d: %w", name, n, err)
	}
	if n == 0 {
		return c.wait(ctx, "the pods of "+name+" to go", "kubelet", 2*time.Minute, func(ctx context.Context) error {
			pods, err := c.componentPods(ctx, component)
			if err != nil {
				return err
			}
			if len(pods) > 0 {
				return fmt.Errorf("%d pods left", len(pods))
			}
			return nil
		})
	}
	return c.podsReady(ctx, "rollout of "+name, component, n, nil)
}

// UploadURL is the upload proxy's Service, which kube-proxy makes reachable from the node.
// The proxy serves HTTPS with the certificate the manager issued (the chart's default).
func (c *Cluster) UploadURL() string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	svc := &corev1.Service{}
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: ReleaseNamespace, Name: Release + "-uploadproxy"}, svc); err != nil || len(svc.Spec.Ports) == 0 {
		return "https://upload-proxy-service-not-found"
	}
	return fmt.Sprintf("https://%s:%d", svc.Spec.ClusterIP, svc.Spec.Ports[0].Port)
}

// UploadClient reaches the upload proxy as a user who has its CA would (ServiceClient).
func (c *Cluster) UploadClient() *http.Client {
	return c.ServiceClient(UploadProxyCertSecret, Release+"-uploadproxy")
}

// ServiceClient reaches a Service of the release serving HTTPS with a certificate the manager
// issued, as a user who has its CA would: it trusts only the ca.crt of the Secret secret, and
// checks the certificate names the Service (<service>.<ReleaseNamespace>.svc).
func (c *Cluster) ServiceClient(secret, service string) *http.Client {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := x509.NewCertPool()
	sec := &corev1.Secret{}
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: ReleaseNamespace, Name: secret}, sec); err == nil {
		pool.AppendCertsFromPEM(sec.Data["ca.crt"])
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12, ServerName: service + "." + ReleaseNamespace + ".svc"}
	return &http.Client{Transport: t}
}

// UploadProxyCertSecret is the Secret of ReleaseNamespace the manager issues the upload
// proxy's certificate into.
const UploadProxyCertSecret = Release + "-uploadproxy-tls"

// Dir is the directory the cluster keeps its files in (logs/ holds every component's log).
func (c *Cluster) Dir() string { return filepath.Clean(c.opts.Dir) }

// IdleImage is the pause image: a container that runs until it is stopped, for a pod that
// stands in for a VM's virt-launcher.
func (c *Cluster) IdleImage() string { return PauseImage }

// KubeVirt says whether the real KubeVirt runs on the node (Options.KubeVirt).
func (c *Cluster) KubeVirt() bool { return c.opts.KubeVirt }

// SnapshotPath is the directory of a snapshot in the harness's CSI driver, by its handle.
func (c *Cluster) SnapshotPath(handle string) string { return c.path("csi", "snapshots", handle) }

// Logs copies a pod's log to w from its start, following it until the pod ends or ctx does.
func (c *Cluster) Logs(ctx context.Context, ns, pod string, w io.Writer) error {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	r, err := cs.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Follow: true}).Stream(ctx)
	if err != nil {
		return err
	}
	defer r.Close()
	_, err = io.Copy(w, r)
	return err
}

// KubeconfigFile is the administrator's kubeconfig (client certificates).
func (c *Cluster) KubeconfigFile() string { return c.Kubeconfig }

// StopNode stops node name's kubelet and containerd at once (SIGKILL), as a node agent that
// crashed or hangs: the node's containers run on, unseen; after the node controller's grace
// period the Node is NotReady. StartNode starts them again with the same command lines.
func (c *Cluster) StopNode(name string) error {
	n := c.nodeNamed(name)
	if n == nil {
		return fmt.Errorf("no node %q", name)
	}
	for _, component := range []string{"kubelet", "containerd"} {
		p := c.procNamed(n.proc(component))
		if p == nil {
			return fmt.Errorf("%s has no %s", name, component)
		}
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	return nil
}

// agentsStopped says whether node name's containerd is stopped (StopNode, LoseNode).
func (c *Cluster) agentsStopped(name string) bool {
	n := c.nodeNamed(name)
	if n == nil {
		return false
	}
	p := c.procNamed(n.proc("containerd"))
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// StartNode starts node name's containerd and kubelet again after StopNode, and waits until
// the node is Ready. As systemd would, it starts the kubelet again whenever it exits (a
// containerd that has not finished its start yet), until ctx ends.
func (c *Cluster) StartNode(ctx context.Context, name string) error {
	n := c.nodeNamed(name)
	if n == nil {
		return fmt.Errorf("no node %q", name)
	}
	var err error
	since := time.Now()
	for ctx.Err() == nil {
		for _, component := range []string{"containerd", "kubelet"} {
			p := c.procNamed(n.proc(component))
			if p == nil {
				return fmt.Errorf("%s has no %s", name, component)
			}
			select {
			case <-p.done:
			default:
				continue // running
			}
			if err := c.start(p.name, p.cmd.Path, p.cmd.Args[1:]...); err != nil {
				return err
			}
		}
		if err = c.nodeReady(ctx, n, since); err == nil || c.exited(n.proc("kubelet")) == nil {
			return err
		}
		time.Sleep(3 * time.Second)
	}
	return err
}

// procNamed is the last process started under name, or nil.
func (c *Cluster) procNamed(name string) *proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.procs) - 1; i >= 0; i-- {
		if c.procs[i].name == name {
			return c.procs[i]
		}
	}
	return nil
}

// LoseNode takes node name away for good, as a machine that died: its containers killed, its
// agents stopped, and its Node deleted, as an administrator (or a cloud's node controller)
// deletes a node that will not return. Its volumes' files stay on this machine, unreachable
// through the cluster.
func (c *Cluster) LoseNode(ctx context.Context, name string) error {
	n := c.nodeNamed(name)
	if n == nil {
		return fmt.Errorf("no node %q", name)
	}
	sock := c.nodePath(n, "containerd", "containerd.sock")
	killTasks(sock)
	if err := c.StopNode(name); err != nil {
		return err
	}
	if p := c.procNamed(n.proc("kube-proxy")); p != nil {
		stopProc(p)
	}
	// The shims outlive containerd: they are found by the address they were given.
	killMatching(io.Discard, func(cmdline string) bool {
		return strings.Contains(cmdline, "containerd-shim") && strings.Contains(cmdline, sock)
	})
	return client.IgnoreNotFound(c.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}))
}
