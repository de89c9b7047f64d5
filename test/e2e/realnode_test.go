package e2e

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	realcluster "github.com/diskpipe/diskpipe/test/cluster"
	"github.com/diskpipe/diskpipe/test/framework"
)

// What only a real node shows: Kubernetes' own controllers (the garbage collector,
// pvc-protection, the PV binder), the CSI sidecars, a kubelet running diskpipe's pods from its
// image, and the webhooks reached through their Service. The local cluster has none of these,
// so there these specs are skipped; make test-cluster runs them.

const onlyReal = "needs the real node's garbage collector, pvc-protection, CSI sidecars, kubelet and Services: make test-cluster runs it"

// node is the real cluster, for what the specs read beyond the Cluster interface.
func node() *realcluster.Cluster {
	GinkgoHelper()
	if !real() {
		Skip(onlyReal)
	}
	c, _ := framework.RealNode(cluster)
	return c
}

// get reads a namespaced object with the administrator's client.
func get(ns, name string, obj client.Object) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return cluster.APIClient().Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj)
}

// gone says whether an object no longer exists.
func gone(ns, name string, obj client.Object) func() bool {
	return func() bool { return apierrors.IsNotFound(get(ns, name, obj)) }
}

// pvOf is the PersistentVolume bound to a PVC.
func pvOf(ns, pvc string) *corev1.PersistentVolume {
	GinkgoHelper()
	claim := &corev1.PersistentVolumeClaim{}
	Expect(get(ns, pvc, claim)).To(Succeed())
	Expect(claim.Spec.VolumeName).NotTo(BeEmpty(), "PVC %s is not bound", pvc)
	pv := &corev1.PersistentVolume{}
	Expect(get("", claim.Spec.VolumeName, pv)).To(Succeed())
	Expect(pv.Spec.CSI).NotTo(BeNil())
	return pv
}

// idlePod is a restricted pod that mounts a PVC and runs until deleted, as a VM's
// virt-launcher would.
func idlePod(name, claim string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
spec:
  terminationGracePeriodSeconds: 0
  securityContext:
    runAsNonRoot: true
    runAsUser: 107
    seccompProfile: {type: RuntimeDefault}
  containers:
  - name: reader
    image: %s
    securityContext:
      allowPrivilegeEscalation: false
      capabilities: {drop: [ALL]}
  volumes:
  - name: disk
    persistentVolumeClaim:
      claimName: %s
`, name, cluster.IdleImage(), claim)
}

func diskFromImage(name, image, strategy string) string {
	return fmt.Sprintf(`apiVersion: diskvolume.kubesphere.io/v1alpha1
kind: DiskVolume
metadata:
  name: %s
spec:
  source:
    image: {name: %s, kind: VirtualMachineImage}
  cloneStrategy: %s
`, name, image, strategy)
}

var _ = Describe("on a real node: Kubernetes' controllers, CSI and webhooks", Ordered, afterKubeVirtRollout, func() {
	var (
		ns     string
		golden *corev1.PersistentVolume
	)
	BeforeAll(func() {
		node()
		ns = namespace()
		importHTTP(ns, "base", "disk.qcow2")
		golden = pvOf(ns, "vmim-base")
	})

	It("refuses a pod that mounts a golden PVC, through the webhook's Service and the certificate the manager issued", func() {
		// helm made the configuration (named after the release); the manager patched in the
		// CA of the serving certificate it issued.
		hooks := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		Expect(get("", realcluster.Release, hooks)).To(Succeed())
		var names []string
		for _, h := range hooks.Webhooks {
			names = append(names, h.Name)
		}
		Expect(names).To(ConsistOf("golden-pvcs.diskpipe.io", "diskpipe-pods.diskpipe.io",
			"diskpipe-pods-exec.diskpipe.io", "sources.diskpipe.io", "virtualmachines.diskpipe.io"))
		for _, h := range hooks.Webhooks {
			Expect(h.ClientConfig.URL).To(BeNil(), "webhook %s", h.Name)
			Expect(h.ClientConfig.Service).NotTo(BeNil(), "webhook %s", h.Name)
			Expect(h.ClientConfig.Service.Namespace).To(Equal(realcluster.ReleaseNamespace))
			Expect(get(h.ClientConfig.Service.Namespace, h.ClientConfig.Service.Name, &corev1.Service{})).To(Succeed())
			block, _ := pem.Decode(h.ClientConfig.CABundle)
			Expect(block).NotTo(BeNil(), "webhook %s has no PEM caBundle", h.Name)
			ca, err := x509.ParseCertificate(block.Bytes)
			Expect(err).NotTo(HaveOccurred())
			Expect(ca.IsCA).To(BeTrue())
		}
		_, errOut, err := cluster.Kubectl(context.Background(), []byte(idlePod("intruder", "vmim-base")), "apply", "-n", ns, "-f", "-")
		Expect(err).To(HaveOccurred(), "a pod mounting the golden PVC was admitted")
		Expect(errOut).To(ContainSubstring(`admission webhook "golden-pvcs.diskpipe.io" denied the request`))
		Expect(errOut).To(ContainSubstring("the PVC vmim-base holds a golden image of diskpipe and is read-only"))
		Expect(gone(ns, "intruder", &corev1.Pod{})()).To(BeTrue())
	})

	It("clones through the external-provisioner and restores a snapshot through the snapshotter, by CSI", func() {
		kubectl(diskFromImage("cloned", "base", "CSIClone")+"---\n"+diskFromImage("restored", "base", "Snapshot"), "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "dvol", "cloned"), 2*time.Minute, time.Second).Should(Equal("Ready Made"))
		Eventually(phase(ns, "dvol", "restored"), 2*time.Minute, time.Second).Should(Equal("Ready Made"))

		clone := pvOf(ns, "cloned")
		Expect(clone.Annotations).To(HaveKeyWithValue("pv.kubernetes.io/provisioned-by", realcluster.Driver))
		Expect(clone.Spec.CSI.VolumeAttributes).To(HaveKeyWithValue(realcluster.ContentSourceAttribute, "volume/"+golden.Spec.CSI.VolumeHandle),
			"the provisioner asked the driver for a copy of the golden volume")
		sameDisk(filepath.Join(cluster.VolumePath(ns, "cloned"), "disk.img"))

		snapName := kubectl("", "get", "vmimage", "base", "-n", ns, "-o", "jsonpath={.status.snapshotName}")
		Expect(snapName).To(Equal("vmim-base-golden"))
		snap := &snapshotv1.VolumeSnapshot{}
		Expect(get(ns, snapName, snap)).To(Succeed())
		Expect(snap.Status).NotTo(BeNil())
		Expect(snap.Status.ReadyToUse).To(HaveValue(BeTrue()))
		content := &snapshotv1.VolumeSnapshotContent{}
		Expect(get("", *snap.Status.BoundVolumeSnapshotContentName, content)).To(Succeed())
		Expect(content.Spec.Driver).To(Equal(realcluster.Driver))
		Expect(content.Status.SnapshotHandle).NotTo(BeNil(), "the csi-snapshotter recorded the driver's snapshot")
		restored := pvOf(ns, "restored")
		Expect(restored.Spec.CSI.VolumeAttributes).To(HaveKeyWithValue(realcluster.ContentSourceAttribute, "snapshot/"+*content.Status.SnapshotHandle))
		Expect(node().SnapshotPath(*content.Status.SnapshotHandle)).To(BeADirectory())
		sameDisk(filepath.Join(cluster.VolumePath(ns, "restored"), "disk.img"))
	})

	It("removes a deleted disk's PVC with the garbage collector, frees its volume only when pvc-protection lets it, and has a disk made again meanwhile wait for it", func() {
		kubectl(idlePod("reader", "cloned"), "apply", "-n", ns, "-f", "-")
		Eventually(func() corev1.PodPhase {
			pod := &corev1.Pod{}
			_ = get(ns, "reader", pod)
			return pod.Status.Phase
		}, 2*time.Minute, time.Second).Should(Equal(corev1.PodRunning))
		pv := pvOf(ns, "cloned")
		volume := cluster.VolumePath(ns, "cloned")

		kubectl("", "delete", "dvol", "cloned", "-n", ns, "--wait=true", "--timeout=60s")
		// Nothing in diskpipe deletes a disk's own PVC: its owner reference does, through the
		// garbage collector. The kubelet's pod still uses it, so pvc-protection holds it.
		claim := &corev1.PersistentVolumeClaim{}
		Eventually(func() bool { return get(ns, "cloned", claim) == nil && !claim.DeletionTimestamp.IsZero() }, time.Minute, time.Second).
			Should(BeTrue(), "the garbage collector deletes the PVC the disk owned")
		Expect(claim.Finalizers).To(ContainElement("kubernetes.io/pvc-protection"))
		Consistently(gone(ns, "cloned", &corev1.PersistentVolumeClaim{}), 5*time.Second, time.Second).Should(BeFalse(), "a PVC in use stays")
		Expect(volume).To(BeADirectory())

		// Made again meanwhile, the disk waits for its earlier self's PVC to go, and takes
		// nothing of it: its own PVC is cloned anew once the name is free.
		kubectl(diskFromImage("cloned", "base", "CSIClone"), "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "dvol", "cloned"), time.Minute, time.Second).Should(Equal("Pending NameTerminating"))

		kubectl("", "delete", "pod", "reader", "-n", ns, "--wait=true", "--timeout=60s")
		Eventually(gone("", pv.Name, &corev1.PersistentVolume{}), time.Minute, time.Second).Should(BeTrue(), "the provisioner deletes the released volume")
		Eventually(volume, 30*time.Second).ShouldNot(BeADirectory(), "the driver's DeleteVolume ran")
		Eventually(phase(ns, "dvol", "cloned"), 2*time.Minute, time.Second).Should(Equal("Ready Made"))
		Expect(pvOf(ns, "cloned").Name).NotTo(Equal(pv.Name))
		sameDisk(filepath.Join(cluster.VolumePath(ns, "cloned"), "disk.img"))
		kubectl("", "delete", "dvol", "cloned", "-n", ns, "--wait=true", "--timeout=60s")
		Eventually(gone(ns, "cloned", &corev1.PersistentVolumeClaim{}), time.Minute, time.Second).Should(BeTrue())
	})

	It("removes a deleted VM's KubeVirt VM and the disks it made, and keeps the disk it only uses", func() {
		kubectl(strings.Replace(diskFromImage("disk1-from-image", "base", "CSIClone"), "  cloneStrategy: CSIClone\n", "", 1), "apply", "-n", ns, "-f", "-")
		kubectl(seedVM(ns), "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "ksvm", "vm1"), 2*time.Minute, time.Second).Should(Equal("Ready VirtualMachineCreated"))
		Eventually(phase(ns, "dvol", "disk0-vm-blank"), 2*time.Minute, time.Second).Should(Equal("Ready Made"))
		blank := pvOf(ns, "disk0-vm-blank")

		kubectl("", "delete", "ksvm", "vm1", "-n", ns, "--wait=true", "--timeout=60s")
		Eventually(func() string {
			return observe("get", "virtualmachines.kubevirt.io,diskvolumes,pvc", "-n", ns, "-o", "name")
		}, 2*time.Minute, time.Second).Should(Equal("diskvolume.diskvolume.kubesphere.io/disk1-from-image\n"+
			"diskvolume.diskvolume.kubesphere.io/restored\n"+
			"persistentvolumeclaim/disk1-from-image\npersistentvolumeclaim/restored\npersistentvolumeclaim/vmim-base\n"),
			"the KubeVirt VM, the VM's blank disk and its PVC are gone; the image's disk the VM used stays")
		Eventually(gone("", blank.Name, &corev1.PersistentVolume{}), time.Minute, time.Second).Should(BeTrue())
	})

	It("removes a deleted image's golden PVC and snapshot, and the storage behind them", func() {
		snap := &snapshotv1.VolumeSnapshot{}
		Expect(get(ns, "vmim-base-golden", snap)).To(Succeed())
		content := *snap.Status.BoundVolumeSnapshotContentName
		c := &snapshotv1.VolumeSnapshotContent{}
		Expect(get("", content, c)).To(Succeed())
		snapshotDir := node().SnapshotPath(*c.Status.SnapshotHandle)
		volume := cluster.VolumePath(ns, "vmim-base")

		kubectl("", "delete", "vmimage", "base", "-n", ns, "--wait=true", "--timeout=60s")
		Eventually(gone(ns, "vmim-base", &corev1.PersistentVolumeClaim{}), time.Minute, time.Second).Should(BeTrue())
		Eventually(gone(ns, "vmim-base-golden", &snapshotv1.VolumeSnapshot{}), time.Minute, time.Second).Should(BeTrue())
		Eventually(gone("", content, &snapshotv1.VolumeSnapshotContent{}), time.Minute, time.Second).Should(BeTrue(), "the snapshot-controller deletes the content")
		Eventually(gone("", golden.Name, &corev1.PersistentVolume{}), time.Minute, time.Second).Should(BeTrue())
		Eventually(snapshotDir, 30*time.Second).ShouldNot(BeADirectory(), "the driver's DeleteSnapshot ran")
		Eventually(volume, 30*time.Second).ShouldNot(BeADirectory(), "the driver's DeleteVolume ran")
		// Disks made from the image are theirs to keep.
		sameDisk(filepath.Join(cluster.VolumePath(ns, "restored"), "disk.img"))
	})
})

var _ = Describe("on a real node: diskpipe's pods under a kubelet", func() {
	BeforeEach(func() { node() })

	It("writes a block PVC from a non-root importer with a read-only root filesystem", func() {
		ns := namespace()
		kubectl(vmi("block", fmt.Sprintf("    http: %s/disk.qcow2?rate=4000000", server))+"  volumeMode: Block\n  resources:\n    requests:\n      storage: 80Mi\n",
			"apply", "-n", ns, "-f", "-")
		pod := &corev1.Pod{}
		Eventually(func() bool {
			return get(ns, "vmim-block-import-0", pod) == nil && len(pod.Status.ContainerStatuses) > 0 && pod.Status.ContainerStatuses[0].State.Running != nil
		}, time.Minute, 200*time.Millisecond).Should(BeTrue(), "the kubelet runs the importer")
		Expect(pod.Spec.Containers[0].Image).To(HavePrefix(node().Registry+"/diskpipe:"), "pulled from the registry")
		Expect(*pod.Spec.SecurityContext.RunAsNonRoot).To(BeTrue())
		Expect(*pod.Spec.SecurityContext.RunAsUser).NotTo(BeZero())
		Expect(*pod.Spec.Containers[0].SecurityContext.ReadOnlyRootFilesystem).To(BeTrue())
		Expect(pod.Spec.Containers[0].VolumeDevices).NotTo(BeEmpty(), "the target is a raw block device")
		Eventually(phase(ns, "vmimage", "block"), 2*time.Minute, time.Second).Should(Equal("Ready Imported"))
		Expect(*pvOf(ns, "vmim-block").Spec.VolumeMode).To(Equal(corev1.PersistentVolumeBlock))
		sameDisk(filepath.Join(cluster.VolumePath(ns, "vmim-block"), "block.img"))
	})

	It("starts the bundled store again while the manager is down: the golden-PVC webhook leaves diskpipe's own namespace alone", func() {
		Expect(node().ScaleManager(0)).To(Succeed())
		DeferCleanup(func() { Expect(node().ScaleManager(1)).To(Succeed()) })
		// The store's pod mounts its PVC, which the webhook (failure policy Fail, and no manager
		// to answer it) would refuse.
		Expect(cluster.StopStore()).To(Succeed())
		Expect(cluster.StartStore()).To(Succeed(), "the store's StatefulSet made its pod again without the manager")
	})

	It("finishes an export when the store's pod is deleted in the middle of it, and curl downloads it from the NodePort", func() {
		ns := namespace()
		big := filepath.Join(work, "big.raw")
		makeBigDisk(big, 1<<30) // an export long enough (about 8 s here) for the store's pod to go away during it
		importHTTP(ns, "big", "big.raw")
		// An export of 512 MiB of data takes 4 to 8 s here, and a deleted pod takes seconds to
		// stop: the store may be gone only after an export finished. Export again, up to three
		// times, until the store's loss fell inside one.
		name := ""
		for attempt := 1; name == ""; attempt++ {
			Expect(attempt).To(BeNumerically("<=", 3), "in 3 exports the store's pod never went away while one ran")
			try := fmt.Sprintf("big-%d", attempt)
			kubectl(fmt.Sprintf(`apiVersion: hypercloud.tmaxanc.com/v1alpha1
kind: VirtualMachineVolumeExport
metadata:
  name: %s
spec:
  pvcName: vmim-big
  objectStore: {bucketName: e2e-big, objectName: %s.qcow2}
`, try, try), "apply", "-n", ns, "-f", "-")
			pod := &corev1.Pod{}
			Eventually(func() bool {
				return get(ns, try+"-export-0", pod) == nil && len(pod.Status.ContainerStatuses) > 0 && pod.Status.ContainerStatuses[0].State.Running != nil
			}, 2*time.Minute, 100*time.Millisecond).Should(BeTrue(), "the kubelet runs the exporter")
			logs := follow(ns, try+"-export-0")
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			Expect(cluster.APIClient().DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(realcluster.ReleaseNamespace),
				client.MatchingLabels{"app.kubernetes.io/component": "objectstore"}, client.GracePeriodSeconds(0))).To(Succeed())
			cancel()
			Eventually(phase(ns, "vmve", try), 3*time.Minute, time.Second).Should(Equal("Ready Exported"))
			retries := kubectl("", "get", "vmve", try, "-n", ns, "-o", "jsonpath={.status.retries}")
			if retries != "" || strings.Contains(logs(), "Retrying after a transient failure") {
				name = try // the store went away while the exporter ran: it retried, or its pod was replaced
			} else {
				GinkgoWriter.Printf("export %s finished before the store's pod was gone; exporter log:\n%s\n", try, logs())
			}
		}

		url := downloadURL(ns, name)
		Expect(url).To(HavePrefix(realcluster.StoreEndpoint+"/"), "the download URL names the store's NodePort")
		got := filepath.Join(work, "big.qcow2")
		run("curl", "-sSf", "-o", got, url)
		run("qemu-img", "compare", "-F", "qcow2", big, got)
		Expect(kubectl("", "get", "vmve", name, "-n", ns, "-o", "jsonpath={.status.digest}")).To(Equal("sha256:" + sha256Of(got)))
	})
})

// makeBigDisk writes a disk of size bytes, half random (so an export has real bytes to carry)
// and half a hole.
func makeBigDisk(path string, size int64) {
	GinkgoHelper()
	f, err := os.Create(path)
	Expect(err).NotTo(HaveOccurred())
	defer f.Close()
	Expect(f.Truncate(size)).To(Succeed())
	src, err := os.Open("/dev/urandom")
	Expect(err).NotTo(HaveOccurred())
	defer src.Close()
	_, err = io.CopyN(f, src, size/2)
	Expect(err).NotTo(HaveOccurred())
}

// follow collects a pod's log from now on (kubectl logs -f); the function returns what came so far.
func follow(ns, pod string) func() string {
	var (
		mu  sync.Mutex
		out bytes.Buffer
	)
	w := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return out.Write(p) })
	ctx, cancel := context.WithCancel(context.Background())
	DeferCleanup(cancel)
	go func() { _ = node().Logs(ctx, ns, pod, w) }()
	return func() string { mu.Lock(); defer mu.Unlock(); return out.String() }
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

var _ = Describe("on a real node: volume populators", func() {
	It("fills a plain PVC whose dataSourceRef names an image, bound by the PV controller, with the progress in its events, and it boots", func() {
		node()
		ns := namespace()
		importHTTP(ns, "populated", "disk.qcow2")
		kubectl(`apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: rootdisk
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests: {storage: 256Mi}
  dataSourceRef:
    apiGroup: hypercloud.tmaxanc.com
    kind: VirtualMachineImage
    name: populated
`, "apply", "-n", ns, "-f", "-")
		Eventually(func() string {
			return observe("get", "pvc", "rootdisk", "-n", ns, "-o", "jsonpath={.status.phase}")
		}, 3*time.Minute, time.Second).Should(Equal("Bound"))
		disk := filepath.Join(cluster.VolumePath(ns, "rootdisk"), "disk.img")
		Expect(fileSize(disk)).To(Equal(grown(256 << 20)))
		sameDisk(disk)
		boots(disk)
		events := kubectl("", "get", "events", "-n", ns, "--field-selector", "involvedObject.name=rootdisk", "-o", "jsonpath={.items[*].reason}")
		Expect(events).To(And(ContainSubstring("Populating"), ContainSubstring("Populated")))
		// The DiskVolume that filled it, and its PVC, are gone; the volume stays with the claim.
		Eventually(func() []string {
			return strings.Fields(observe("get", "diskvolumes,pvc", "-n", ns, "-o", "name"))
		}, time.Minute, time.Second).Should(Equal([]string{"persistentvolumeclaim/rootdisk", "persistentvolumeclaim/vmim-populated"}))
	})
})
