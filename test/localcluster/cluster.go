// Package localcluster runs diskpipe on one machine without a container runtime, for the
// end-to-end tests and `make demo`: etcd and kube-apiserver (built from Go modules), diskpipe's
// CRDs with the VolumeSnapshot and KubeVirt VirtualMachine CRDs, StorageClasses and a
// VolumeSnapshotClass of a CSI stand-in, the bundled object store, the manager (with its
// webhooks) and the upload proxy as real processes, and a node agent that runs diskpipe's
// pods as processes. It is test infrastructure: production runs on real clusters through the
// Helm chart.
package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	uploadapi "github.com/diskpipe/diskpipe/apis/upload/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/admission"
	cdipolicy "github.com/diskpipe/diskpipe/controllers/cdi/policy"
	"github.com/diskpipe/diskpipe/objectstore/objectstoretest"
	"github.com/diskpipe/diskpipe/test/freeport"
	"github.com/diskpipe/diskpipe/test/testenv"
	"github.com/diskpipe/diskpipe/uploadproxy"
)

// Options shape a cluster.
type Options struct {
	// Bin holds diskpipe's binaries (make build): manager, importer, exporter, uploadproxy.
	Bin string
	// Dir holds the volumes, the store's data and the processes' logs.
	Dir string
	// Log receives what the cluster does.
	Log io.Writer
}

// Cluster is a running local cluster.
type Cluster struct {
	*testenv.Env
	// Store is the bundled object store; UploadURL the upload proxy's address, GatewayURL
	// the console's gateway's (its pages at /), both plain HTTP on loopback.
	Store      *objectstoretest.Server
	UploadURL  string
	GatewayURL string
	// Classes are the StorageClasses of the CSI stand-in; the first is the default.
	Classes []string

	opts  Options
	procs []*exec.Cmd
	// managerArgs start the manager again after RestartManager.
	managerArgs []string
	// metrics is where the manager serves /metrics; killed holds what each killed run of
	// it served last.
	metrics string
	killed  []string
	// identities are the kubeconfigs of the processes that act as the chart's service
	// accounts (the manager and the upload proxy), with only the chart's RBAC.
	identities map[string]string
	stopStore  func()
	agent      *agent
	cancel     context.CancelFunc
	wg         sync.WaitGroup
}

// Start brings the cluster up.
func Start(ctx context.Context, o Options) (c *Cluster, err error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		_ = os.Setenv("KUBEBUILDER_ASSETS", o.Bin)
	}
	env, err := testenv.Start()
	if err != nil {
		return nil, err
	}
	c = &Cluster{Env: env, opts: o, Classes: []string{"cephrbd", "sc", "thick"}}
	started := c // what a failure stops: the error returns give nil
	defer func() {
		if err != nil {
			started.Stop()
		}
	}()
	for i, name := range c.Classes {
		sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: Driver}
		if i == 0 {
			sc.Annotations = map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}
		}
		if err := env.Client.Create(ctx, sc); err != nil {
			return nil, err
		}
	}
	if err := env.Client.Create(ctx, &snapshotv1.VolumeSnapshotClass{ObjectMeta: metav1.ObjectMeta{Name: "local"},
		Driver: Driver, DeletionPolicy: snapshotv1.VolumeSnapshotContentDelete}); err != nil {
		return nil, err
	}

	c.Store, c.stopStore = objectstoretest.StartShared(filepath.Join(o.Dir, "objectstore"))
	creds, err := writeFiles(filepath.Join(o.Dir, "objectstore-credentials"), map[string][]byte{
		"accessKeyId": []byte(c.Store.AccessKey), "secretAccessKey": []byte(c.Store.SecretKey)})
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Log, "cluster: apiserver %s, object store %s\n", env.Config.Host, c.Store.Endpoint)

	if err := env.InstallFinalizerPolicy(ctx); err != nil {
		return nil, err
	}
	host, port, certDir, err := env.InstallWebhooks(ctx, admission.Configuration("diskpipe-system", "diskpipe-webhook", nil, cdipolicy.SourceKinds()...),
		uploadproxy.APIService(uploadapi.GroupVersion, "diskpipe-system", "diskpipe-webhook", 443, nil))
	if err != nil {
		return nil, err
	}
	// The manager acts with the chart's RBAC only, and is configured by the chart.
	managerKubeconfig, err := c.managerIdentity(ctx)
	if err != nil {
		return nil, err
	}
	config, err := c.managerConfig(ctx)
	if err != nil {
		return nil, err
	}
	c.identities = map[string]string{"manager": managerKubeconfig}
	// The upload proxy too acts with only the chart's rights (it once ran as an administrator
	// here, which hid that the chart did not let it read images).
	if c.identities["uploadproxy"], err = c.UserKubeconfig(c.opts.Dir, "system:serviceaccount:"+ManagerNamespace+":"+testenv.ChartRelease+"-uploadproxy",
		"system:serviceaccounts", "system:serviceaccounts:"+ManagerNamespace, "system:authenticated"); err != nil {
		return nil, err
	}
	upload, err := freeport.Addr("127.0.0.1")
	if err != nil {
		return nil, err
	}
	c.UploadURL = "http://" + upload
	if c.metrics, err = freeport.Addr("127.0.0.1"); err != nil {
		return nil, err
	}
	// Upload tokens as the chart has them: the manager issues them, the proxy checks them.
	tokenSecret := ManagerNamespace + "/" + testenv.ChartRelease + "-upload-token"
	c.managerArgs = []string{"--config", config, "--objectstore-endpoint", c.Store.Endpoint,
		"--objectstore-credentials-dir", creds, "--objectstore-scoped-credentials", "--metrics-bind-address", c.metrics, "--metrics-secure=false", "--health-probe-bind-address", "0",
		"--webhook-port", strconv.Itoa(port), "--webhook-cert-dir", certDir,
		"--upload-token-secret", tokenSecret, "--upload-proxy-url", c.UploadURL,
		"--owner-key-secret", ManagerNamespace + "/" + testenv.ChartRelease + "-owner-key"}
	if err := c.run("manager", c.managerArgs...); err != nil {
		return nil, err
	}
	if err := waitListening(net.JoinHostPort(host, strconv.Itoa(port))); err != nil {
		return nil, fmt.Errorf("the manager's webhooks: %w", err)
	}
	if err := testenv.WaitAPIService(ctx, env.Client, uploadproxy.TokenAPIService); err != nil {
		return nil, err
	}
	if err := c.run("uploadproxy", "--listen", upload, "--objectstore-endpoint", c.Store.Endpoint, "--objectstore-credentials-dir", creds,
		"--token-secret", tokenSecret); err != nil {
		return nil, err
	}
	if err := waitListening(upload); err != nil {
		return nil, fmt.Errorf("the upload proxy: %w", err)
	}
	if err := c.startGateway(ctx); err != nil {
		return nil, err
	}

	cs := &csi{c: env.Client, dir: o.Dir}
	c.agent = &agent{c: env.Client, csi: cs, bin: o.Bin, dir: o.Dir, log: o.Log, running: map[types.UID]*process{}, subnet: newSubnet()}
	loop, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.wg.Go(func() {
		for loop.Err() == nil {
			pods := &corev1.PodList{}
			if err := env.Client.List(loop, pods); err == nil {
				if err := cs.sync(loop, pods.Items); err != nil {
					fmt.Fprintf(o.Log, "csi: %v\n", err)
				}
				c.agent.sync(loop, pods.Items)
			}
			select {
			case <-loop.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	return c, nil
}

// run starts one of diskpipe's binaries against the cluster, logging to Dir/<name>.log.
func (c *Cluster) run(name string, args ...string) error {
	logf, err := os.OpenFile(filepath.Join(c.opts.Dir, name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(c.opts.Bin, name), args...) //nolint:gosec // diskpipe's own binaries
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig)
	if kc, ok := c.identities[name]; ok {
		cmd.Env = append(cmd.Env, "KUBECONFIG="+kc) // the later KUBECONFIG wins
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s (make build): %w", name, err)
	}
	c.procs = append(c.procs, cmd)
	go func() { _ = cmd.Wait(); logf.Close() }()
	return nil
}

// startGateway runs the console's gateway as the chart's gateway service account, with only
// the rights the chart gives it (rendered with gateway.enabled), sending uploads to the proxy.
func (c *Cluster) startGateway(ctx context.Context) error {
	objs, _, err := testenv.RenderChart(ctx, testenv.ChartRelease, ManagerNamespace, "--show-only", "templates/gateway.yaml",
		"--set", "gateway.enabled=true", "--set", "gateway.tls.issued=false")
	if err != nil {
		return err
	}
	for _, o := range objs {
		if k := o.GetKind(); k == "ClusterRole" || k == "ClusterRoleBinding" {
			if err := c.Client.Create(ctx, o); err != nil {
				return fmt.Errorf("the gateway's %s: %w", k, err)
			}
		}
	}
	user := "system:serviceaccount:" + ManagerNamespace + ":" + testenv.ChartRelease + "-gateway"
	if c.identities["gateway"], err = c.UserKubeconfig(c.opts.Dir, user, "system:serviceaccounts", "system:serviceaccounts:"+ManagerNamespace, "system:authenticated"); err != nil {
		return err
	}
	addr, err := freeport.Addr("127.0.0.1")
	if err != nil {
		return err
	}
	c.GatewayURL = "http://" + addr
	if err := c.run("gateway", "--addr", addr, "--metrics-addr", "0", "--upload-proxy-url", c.UploadURL, "--upload-proxy-allow-http"); err != nil {
		return err
	}
	if err := waitListening(addr); err != nil {
		return fmt.Errorf("the gateway: %w", err)
	}
	return nil
}

// ManagerNamespace is where the chart's service accounts and roles are installed.
const ManagerNamespace = "diskpipe-system"

// managerIdentity applies the chart's RBAC and writes a kubeconfig of the manager's service
// account, which has those rights and nothing else.
func (c *Cluster) managerIdentity(ctx context.Context) (string, error) {
	user, err := c.ApplyChartRBAC(ctx, ManagerNamespace)
	if err != nil {
		return "", err
	}
	return c.UserKubeconfig(c.opts.Dir, user)
}

// managerConfig writes the manager's --config file as the chart renders it, for pods of the
// local image: importer pods run as the chart's service account, behind its NetworkPolicy.
func (c *Cluster) managerConfig(ctx context.Context) (string, error) {
	repository, tag, _ := strings.Cut(Image, ":")
	objs, _, err := testenv.RenderChart(ctx, testenv.ChartRelease, ManagerNamespace, "--show-only", "templates/manager.yaml",
		"--set", "image.repository="+repository, "--set", "image.tag="+tag, "--set", testenv.ThickOverhead,
		// Every server of the local cluster (the tests', the store, pods) listens on loopback.
		"--set", "importer.allowedDestinations={127.0.0.0/8}")
	if err != nil {
		return "", err
	}
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" {
			data, _, _ := unstructured.NestedString(o.Object, "data", "config.yaml")
			p := filepath.Join(c.opts.Dir, "manager-config.yaml")
			return p, os.WriteFile(p, []byte(data), 0o600)
		}
	}
	return "", errors.New("the chart rendered no manager ConfigMap")
}

// VolumePath is the directory that holds a bound PVC's data (disk.img on a filesystem volume);
// "" when the PVC is not bound to a volume.
func (c *Cluster) VolumePath(ns, pvc string) string {
	claim := &corev1.PersistentVolumeClaim{}
	if err := c.agent.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: pvc}, claim); err != nil || claim.Spec.VolumeName == "" {
		return ""
	}
	return c.agent.csi.volumeDir(claim.Spec.VolumeName)
}

// KillPod kills the process of a running pod, as a node failure or OOM kill would: it ends
// without a result.
func (c *Cluster) KillPod(ns, name string) error { return c.agent.kill(ns, name) }

// RestartManager kills the manager, as a crash or a node loss would, and starts it again.
func (c *Cluster) RestartManager() error {
	// Its counters die with it, as a pod's do: keep what it served last.
	if text, err := c.scrapeManager(2 * time.Second); err == nil {
		c.killed = append(c.killed, text)
	}
	for i, p := range c.procs {
		if filepath.Base(p.Path) == "manager" && p.Process != nil {
			_ = p.Process.Kill()
			c.procs = append(c.procs[:i], c.procs[i+1:]...)
			break
		}
	}
	time.Sleep(time.Second) // its webhook port is free again
	return c.run("manager", c.managerArgs...)
}

// ManagerCounter sums a counter of the manager's metrics, all its labels, over every run of
// the manager: the running one, and each killed one as it was just before RestartManager
// killed it. (A run killed before it served its metrics had started no controller.)
func (c *Cluster) ManagerCounter(name string) (float64, error) {
	text, err := c.scrapeManager(10 * time.Second)
	if err != nil {
		return 0, err
	}
	return testenv.SumCounter(append(c.killed, text), name)
}

// scrapeManager reads the manager's /metrics, trying for up to wait while it starts.
func (c *Cluster) scrapeManager(wait time.Duration) (string, error) {
	deadline := time.Now().Add(wait)
	for {
		resp, err := http.Get("http://" + c.metrics + "/metrics") //nolint:gosec,noctx // the local manager
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr == nil && resp.StatusCode == http.StatusOK {
				return string(b), nil
			}
			err = errors.New(resp.Status)
			if rerr != nil {
				err = rerr
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the manager's metrics: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Namespace creates a namespace ready for pods.
func (c *Cluster) Namespace(ctx context.Context, name string) error {
	return c.EnsureNamespace(ctx, name)
}

// Stop stops everything and removes nothing of Dir.
func (c *Cluster) Stop() {
	if c.cancel != nil {
		c.cancel()
		c.wg.Wait()
	}
	if c.agent != nil {
		c.agent.stop()
	}
	for _, p := range c.procs {
		if p.Process != nil {
			_ = p.Process.Signal(os.Interrupt)
		}
	}
	time.Sleep(200 * time.Millisecond)
	for _, p := range c.procs {
		if p.Process != nil {
			_ = p.Process.Kill()
		}
	}
	if c.stopStore != nil {
		c.stopStore()
	}
	_ = c.Env.Stop()
}

func waitListening(addr string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.Dial("tcp", addr)
		if err == nil {
			return conn.Close()
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// PID is the process id of one of diskpipe's binaries the cluster runs (uploadproxy,
// manager), or 0.
func (c *Cluster) PID(name string) int {
	for _, p := range c.procs {
		if filepath.Base(p.Path) == name && p.Process != nil {
			return p.Process.Pid
		}
	}
	return 0
}
