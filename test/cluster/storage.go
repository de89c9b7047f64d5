package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/diskpipe/diskpipe/test/testenv"
	"github.com/diskpipe/diskpipe/uploadproxy"
)

// Classes are the StorageClasses of the harness's driver; the first is the default. All bind
// at once, like most network storage.
var Classes = []string{"cephrbd", "sc", "thick"}

// WFFCClass is a StorageClass of the harness's driver that binds a claim at its first
// consumer (volumeBindingMode WaitForFirstConsumer), like most local storage.
const WFFCClass = "local-wffc"

// LocalClass is a StorageClass of node-local volumes (LocalParameter), bound at their first
// consumer, as TopoLVM's and local-path's are: a volume lives on the node its first consumer
// runs on, and is cloned or restored only there.
const LocalClass = "node-local"

// SnapshotClass is the VolumeSnapshotClass of the harness's driver.
const SnapshotClass = "local"

// csiStore puts the CSI driver's directory on an XFS filesystem with reflink, in a sparse file
// on a loop device, where mkfs.xfs is installed (hack/setup.sh cluster installs it): clones and
// snapshot restores are then copy-on-write and take no time, as on the storage users have
// (TopoLVM's thin snapshots, Ceph RBD's clones), and only the bytes written take room. The file
// is as large as the machine's free space, less a GiB. Without XFS the directory stays on the
// machine's filesystem, where clones are full copies (as where loop devices cannot be made);
// the step says which.
func (c *Cluster) csiStore() error {
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		c.step("CSI volumes on the machine's filesystem: clones are full copies (no mkfs.xfs: hack/setup.sh cluster installs it)")
		return nil
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(c.opts.Dir, &st); err != nil {
		return err
	}
	size := int64(st.Bavail)*st.Bsize - 1<<30 //nolint:gosec // a block count
	img := c.path("csi.xfs")
	f, err := os.Create(img)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// The loop device reads and writes its file with direct I/O, as a node's own disk would be
	// written: a buffered loop keeps every page twice (the volume's and the file's) and wrote
	// 1 GiB with fdatasync at 0.9-1.2 GB/s here, where direct I/O wrote it at 1.8 GB/s.
	how := "direct I/O"
	dev, err := exec.Command("losetup", "--find", "--show", "--direct-io=on", img).Output()
	if err != nil {
		how, dev = "buffered", nil
	}
	mount := []string{"mount", "-o", "loop", img, c.path("csi")}
	if dev != nil {
		mount = []string{"mount", strings.TrimSpace(string(dev)), c.path("csi")}
	}
	for _, args := range [][]string{{"mkfs.xfs", "-q", "-m", "reflink=1", img}, mount} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil { //nolint:gosec // fixed tools
			// A machine without loop devices: the volumes stay where they are.
			c.step("CSI volumes on the machine's filesystem: clones are full copies (%s: %v: %s)", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
			if dev != nil {
				_ = exec.Command("losetup", "-d", strings.TrimSpace(string(dev))).Run() //nolint:gosec // our device
			}
			return os.Remove(img)
		}
	}
	c.step("CSI volumes on XFS with reflink (%s, sparse, %.0f GiB, a loop device with %s): clones and restores are copy-on-write", img, float64(size)/(1<<30), how)
	return c.measureFloor()
}

// StorageFloor is the rate, in bytes a second, at which the volumes' filesystem takes 1 GiB
// written and flushed (fdatasync), measured as the cluster starts: no copy into a volume can be
// faster, and every node's volumes share it (one filesystem, one disk). 0 when not measured.
func (c *Cluster) StorageFloor() float64 { return c.floor }

// measureFloor measures StorageFloor, as dd conv=fdatasync of 1 GiB would, and says it.
func (c *Cluster) measureFloor() error {
	p := c.path("csi", "floor.measure")
	defer os.Remove(p)
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i%251 + 1) // data, not zeros a file system might skip
	}
	start := time.Now()
	for range 1024 {
		if _, err := f.Write(buf); err != nil {
			return fmt.Errorf("measuring the storage floor: %w", err)
		}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("measuring the storage floor: %w", err)
	}
	took := time.Since(start)
	c.floor = float64(1<<30) / took.Seconds()
	c.step("storage floor: 1 GiB written and flushed in %.2f s (%.0f MB/s), the bound on any copy into the volumes of every node", took.Seconds(), c.floor/1e6)
	return nil
}

// storage installs the VolumeSnapshot and KubeVirt CRDs, serves the harness's CSI driver,
// starts the real sidecars that drive it, and makes its classes.
func (c *Cluster) storage(ctx context.Context) error {
	paths := []string{testenv.Path("test", "crds", "snapshot")}
	if c.opts.KubeVirt {
		c.step("CRDs: VolumeSnapshot (KubeVirt's operator installs its own)")
	} else {
		c.step("CRDs: VolumeSnapshot, KubeVirt VirtualMachine (trimmed)")
		paths = append(paths, testenv.Path("test", "crds", "kubevirt"))
	}
	crds := envtest.CRDInstallOptions{Paths: paths, ErrorIfPathMissing: true}
	if err := envtest.ReadCRDFiles(&crds); err != nil {
		return err
	}
	for _, crd := range crds.CRDs {
		if strings.HasSuffix(crd.Spec.Group, "snapshot.storage.k8s.io") {
			metav1.SetMetaDataAnnotation(&crd.ObjectMeta, "api-approved.kubernetes.io", "https://github.com/kubernetes-csi/external-snapshotter/pull/814")
		}
	}
	if _, err := envtest.InstallCRDs(c.Config, envtest.CRDInstallOptions{CRDs: crds.CRDs}); err != nil {
		return fmt.Errorf("installing CRDs: %w", err)
	}

	// One driver per node, each registered with its node's kubelet; the first's socket is the
	// sidecars' too (its controller service).
	sock := c.path("csi", "csi.sock")
	c.step("CSI driver %s (the harness's) on %d nodes, csi-provisioner, csi-snapshotter, snapshot-controller", Driver, len(c.nodes))
	log := c.logFile("csi-driver")
	for _, n := range c.nodes {
		nodeSock := sock
		if n.index > 1 {
			nodeSock = c.path("csi", "csi-"+n.name+".sock")
		}
		d := &hostPath{node: n.name, dir: c.path("csi"), log: log, loops: map[string]string{},
			kubeletRoot: c.nodePath(n, "kubelet", "root")}
		if err := d.serve(c.bg, nodeSock, c.nodePath(n, "kubelet", "root", "plugins_registry", Driver+"-reg.sock")); err != nil {
			return fmt.Errorf("the CSI driver on %s: %w", n.name, err)
		}
	}
	if err := c.Client.Create(ctx, &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: Driver},
		Spec: storagev1.CSIDriverSpec{AttachRequired: ptr.To(false), PodInfoOnMount: ptr.To(false),
			FSGroupPolicy:        ptr.To(storagev1.FileFSGroupPolicy),
			VolumeLifecycleModes: []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}}}); err != nil {
		return err
	}
	for i, name := range Classes {
		sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: Driver,
			ReclaimPolicy: ptr.To(corev1.PersistentVolumeReclaimDelete), VolumeBindingMode: ptr.To(storagev1.VolumeBindingImmediate)}
		if i == 0 {
			sc.Annotations = map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}
		}
		if err := c.Client.Create(ctx, sc); err != nil {
			return err
		}
	}
	if err := c.Client.Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: WFFCClass}, Provisioner: Driver,
		ReclaimPolicy: ptr.To(corev1.PersistentVolumeReclaimDelete), VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)}); err != nil {
		return err
	}
	if err := c.Client.Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: LocalClass}, Provisioner: Driver,
		Parameters:    map[string]string{LocalParameter: "true"},
		ReclaimPolicy: ptr.To(corev1.PersistentVolumeReclaimDelete), VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)}); err != nil {
		return err
	}
	// The client may have read the API's kinds before the CRDs were served: it reads them again
	// on a miss, which can come a moment too early.
	for start := time.Now(); ; time.Sleep(250 * time.Millisecond) {
		err := c.Client.Create(ctx, &snapshotv1.VolumeSnapshotClass{ObjectMeta: metav1.ObjectMeta{Name: SnapshotClass},
			Driver: Driver, DeletionPolicy: snapshotv1.VolumeSnapshotContentDelete})
		if err == nil {
			break
		}
		if !meta.IsNoMatchError(err) || time.Since(start) > 30*time.Second {
			return fmt.Errorf("making the VolumeSnapshotClass: %w", err)
		}
	}
	// --strict-topology: a claim that waited for its consumer is wanted on that node only, as
	// TopoLVM's deployment asks.
	if err := c.start("csi-provisioner", c.bin("csi-provisioner"), "--csi-address", sock, "--kubeconfig", c.Kubeconfig,
		"--leader-election=false", "--timeout=120s", "--extra-create-metadata", "--strict-topology"); err != nil {
		return err
	}
	if err := c.start("csi-snapshotter", c.bin("csi-snapshotter"), "--csi-address", sock, "--kubeconfig", c.Kubeconfig,
		"--leader-election=false", "--timeout=120s"); err != nil {
		return err
	}
	if err := c.start("snapshot-controller", c.bin("snapshot-controller"), "--kubeconfig", c.Kubeconfig, "--leader-election=false"); err != nil {
		return err
	}
	for _, n := range c.nodes {
		if err := c.wait(ctx, n.name+"'s kubelet to register the CSI driver", n.proc("kubelet"), 2*time.Minute, func(ctx context.Context) error {
			csiNode := &storagev1.CSINode{}
			if err := c.Client.Get(ctx, client.ObjectKey{Name: n.name}, csiNode); err != nil {
				return err
			}
			for _, d := range csiNode.Spec.Drivers {
				if d.Name == Driver {
					return nil
				}
			}
			return errors.New("not registered yet")
		}); err != nil {
			return err
		}
	}
	return nil
}

// logFile opens logs/<name>.log for a part that runs in this process.
func (c *Cluster) logFile(name string) *os.File {
	f, err := os.OpenFile(c.path("logs", name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return os.Stderr
	}
	return f
}

// Release and ReleaseNamespace are where diskpipe is installed.
const (
	Release          = "diskpipe"
	ReleaseNamespace = "diskpipe-system"
	// StoreNodePort is where the bundled store is published on the node's address, and
	// StoreEndpoint the URL exports' download URLs name.
	StoreNodePort = 30900
)

// StoreEndpoint is the bundled store's public endpoint: its NodePort on the node's address.
var StoreEndpoint = fmt.Sprintf("http://%s:%d", NodeIP, StoreNodePort)

// install installs diskpipe with `helm install`, as the README tells users, into a namespace
// that enforces Pod Security "restricted", and waits until every workload is ready.
func (c *Cluster) install(ctx context.Context) error {
	if err := c.Namespace(ctx, ReleaseNamespace); err != nil {
		return err
	}
	args := append([]string{"install", Release, c.opts.Chart, "--namespace", ReleaseNamespace, "--kubeconfig", c.Kubeconfig,
		"--set", "image.repository=" + registry + "/diskpipe",
		"--set", "objectStore.bundled.service.type=NodePort", "--set", fmt.Sprintf("objectStore.bundled.service.nodePort=%d", StoreNodePort),
		"--set", "objectStore.bundled.publicEndpoint=" + StoreEndpoint, "--set", "objectStore.bundled.storage.size=20Gi",
		"--set", testenv.ThickOverhead,
		// The node's own address serves the tests' images and registry: a trusted mirror inside
		// the cluster's networks, which importers otherwise may not reach.
		"--set", "importer.clusterCIDRs={" + ClusterCIDR + "," + ServiceCIDR + "}", "--set", "importer.allowedDestinations={" + NodeIP + "}",
		// The console's gateway, off by default, runs here for the specs of the console.
		"--set", "gateway.enabled=true",
		"--wait", "--timeout", "5m"}, c.opts.HelmArgs...)
	if c.opts.KubeVirt || c.opts.Nodes > 1 {
		// KubeVirt runs here: diskpipe serves it CDI's API, as in a cluster where it replaces
		// CDI (KubeVirt's dataVolumeTemplates, DataSources); and on several nodes, where
		// DataVolumes of node-local images are made on their VMs' nodes.
		args = append(args, "--set", "cdi.compatibility.enabled=true")
	}
	c.step("helm %s", strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, c.bin("helm"), args...) //nolint:gosec // the pinned helm
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+c.path("helm"), "HELM_CONFIG_HOME="+c.path("helm"), "HELM_DATA_HOME="+c.path("helm"))
	if out, err := cmd.CombinedOutput(); err != nil {
		pods, _, _ := c.Kubectl(ctx, nil, "get", "pods,pvc,events", "-n", ReleaseNamespace, "-o", "wide")
		return fmt.Errorf("helm install: %w: %s\n%s", err, out, pods)
	}
	if err := testenv.WaitAPIService(ctx, c.Client, uploadproxy.TokenAPIService); err != nil {
		return err
	}
	// helm waits for the store's pod; its NodePort answers once kube-proxy has programmed it.
	return c.wait(ctx, "the store's NodePort", "kube-proxy", time.Minute, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, StoreEndpoint, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		return resp.Body.Close()
	})
}
