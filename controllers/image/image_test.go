package image_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/ctrltest"
	"github.com/diskpipe/diskpipe/controllers/internal/hostcopy"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/controllers/manager"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore/objectstoretest"
	"github.com/diskpipe/diskpipe/objectstore/uploads"
	"github.com/diskpipe/diskpipe/test/testenv"
)

var (
	env *testenv.Env
	mgr *ctrltest.Manager
	// store is the bundled object store the manager presigns objectStore sources for.
	store *objectstoretest.Server
)

func TestMain(m *testing.M) {
	hostcopy.ServingPoll = time.Hour // a copy from another namespace is woken by its clone source's pod
	testenv.RunTests(m, &env)
}

var managerOnce sync.Once

// startManager runs the controllers once per test binary against the test's apiserver.
func startManager(t *testing.T) {
	t.Helper()
	managerOnce.Do(func() {
		var stop func()
		store, stop = objectstoretest.StartShared(env.TempDir())
		env.OnStop(stop)
		cfg := store.ClientConfig()
		cfg.Region = "us-east-1"
		var err error
		if mgr, err = ctrltest.StartManager(env, manager.Options{ObjectStore: &cfg}); err != nil {
			t.Fatal(err)
		}
	})
}

// kubelet plays the kubelet's part for an importer pod.
func kubelet(t *testing.T, ns, name string, phase corev1.PodPhase, res *transfer.Result, exit int32) {
	t.Helper()
	ctrltest.Kubelet(t, env, ns, name, phase, res, exit)
}

func newImage(ns, name string, size string, retry int32) *hypercloud.VirtualMachineImage {
	v := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: hypercloud.VirtualMachineImageSpec{
			Source: hypercloud.VirtualMachineImageSource{HTTP: "https://images.example.com/ubuntu.qcow2",
				HTTPOptions: &common.HTTPOptions{SecretRef: "basic", CertConfigMap: "ca", UserAgent: "Mozilla/5.0 (compatible; mirror-friendly)"},
				Checksum:    "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"},
			Retry: ptr.To(common.RetryLimit(retry))}}
	if size != "" {
		q := resource.MustParse(size)
		v.Spec.Resources.Requests.Storage = &q
	}
	return v
}

func status(t *testing.T, obj client.Object, st *common.ImageStatus) func() *common.ImageStatus {
	return func() *common.ImageStatus {
		_ = env.Client.Get(t.Context(), client.ObjectKeyFromObject(obj), obj)
		return st
	}
}

func phase(st *common.ImageStatus) common.Phase { return st.Phase }

func readyReason(st *common.ImageStatus) string {
	if c := meta.FindStatusCondition(st.Conditions, common.ConditionReady); c != nil {
		return c.Reason
	}
	return ""
}

// phaseReasonMessage is "<phase> <Ready reason>: <message>", or the phase alone.
func phaseReasonMessage(st *common.ImageStatus) string {
	c := meta.FindStatusCondition(st.Conditions, common.ConditionReady)
	if c == nil {
		return string(st.Phase)
	}
	return string(st.Phase) + " " + c.Reason + ": " + c.Message
}

// TestImport is a VirtualMachineImage's life: golden PVC and a restricted importer pod with
// the source's arguments and mounts, progress read from the running pod, then the result.
func TestImport(t *testing.T) {
	startManager(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "import")
	g.Expect(err).NotTo(HaveOccurred())
	vmi := newImage(ns, "ubuntu18.04", "10Gi", 3)
	g.Expect(env.Client.Create(ctx, vmi)).To(Succeed())

	pvc := &corev1.PersistentVolumeClaim{}
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vmim-ubuntu18.04"}, pvc)
	}, 20*time.Second).Should(Succeed())
	g.Expect(pvc.Spec.Resources.Requests.Storage().String()).To(Equal("10Gi"))
	g.Expect(metav1.IsControlledBy(pvc, vmi)).To(BeTrue())

	pod := &corev1.Pod{}
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vmim-ubuntu18.04-import-0"}, pod)
	}, 20*time.Second).Should(Succeed())
	c := pod.Spec.Containers[0]
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"--source http", "--url https://images.example.com/ubuntu.qcow2", "--auth-dir /var/run/diskpipe/auth",
		"--ca-file /var/run/diskpipe/ca", "--checksum sha256:9f86", "--target /data/disk.img", "--capacity 10737418240",
		"--user-agent Mozilla/5.0 (compatible; mirror-friendly)"} {
		g.Expect(args).To(ContainSubstring(want))
	}
	g.Expect(pod.Spec.RestartPolicy).To(Equal(corev1.RestartPolicyNever))
	g.Expect(*pod.Spec.SecurityContext.RunAsNonRoot).To(BeTrue())
	g.Expect(pod.Spec.SecurityContext.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
	g.Expect(*c.SecurityContext.AllowPrivilegeEscalation).To(BeFalse())
	g.Expect(c.SecurityContext.Capabilities.Drop).To(ContainElement(corev1.Capability("ALL")))
	g.Expect(*pod.Spec.AutomountServiceAccountToken).To(BeFalse())
	var mounted []string
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.Secret != nil:
			mounted = append(mounted, "secret/"+v.Secret.SecretName)
		case v.ConfigMap != nil:
			mounted = append(mounted, "configmap/"+v.ConfigMap.Name)
		case v.PersistentVolumeClaim != nil:
			mounted = append(mounted, "pvc/"+v.PersistentVolumeClaim.ClaimName)
		case v.EmptyDir != nil:
			mounted = append(mounted, "emptyDir/"+v.Name)
		}
	}
	slices.Sort(mounted)
	g.Expect(mounted).To(Equal([]string{"configmap/ca", "pvc/vmim-ubuntu18.04", "secret/basic"}), "an http source writes nothing but the disk")

	// Running: progress comes from the pod's metrics.
	mgr.Metrics <- "diskpipe_transfer_bytes_done 5.36870912e+08\ndiskpipe_transfer_bytes_total 1.073741824e+09\ndiskpipe_transfer_bytes_per_second 1e+08\n"
	kubelet(t, ns, pod.Name, corev1.PodRunning, nil, 0)
	g.Eventually(status(t, vmi, &vmi.Status), 20*time.Second).Should(WithTransform(func(st *common.ImageStatus) string {
		return string(st.Phase) + " " + st.Progress + " " + readyReason(st)
	}, Equal("Importing 50.0% Running")))
	<-mgr.Metrics

	kubelet(t, ns, pod.Name, corev1.PodSucceeded, &transfer.Result{Succeeded: true, Format: "qcow2", VirtualSize: 2361393152,
		BytesRead: 600 << 20, Digest: "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", DurationSeconds: 12}, 0)
	g.Eventually(status(t, vmi, &vmi.Status), 20*time.Second).Should(WithTransform(phase, Equal(common.PhaseReady)))
	g.Expect(vmi.Status.Format).To(Equal("qcow2"))
	g.Expect(vmi.Status.VirtualSize.Value()).To(Equal(int64(2361393152)))
	g.Expect(vmi.Status.PVCName).To(Equal("vmim-ubuntu18.04"))
	g.Expect(vmi.Status.Digest).To(HavePrefix("sha256:9f86"))
	g.Expect(vmi.Status.ObservedGeneration).To(Equal(vmi.Generation))
	g.Expect(readyReason(&vmi.Status)).To(Equal("Imported"))
	g.Eventually(func() bool {
		return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{}))
	}, 20*time.Second).Should(BeTrue(), "the finished importer pod is deleted")

	// Changing only labels never re-imports.
	g.Expect(ctrltest.Update(ctx, env.Client, vmi, func() { vmi.Labels = map[string]string{"team": "a"} })).To(Succeed())
	g.Consistently(func() int {
		pods := &corev1.PodList{}
		_ = env.Client.List(ctx, pods, client.InNamespace(ns))
		return len(pods.Items)
	}, 2*time.Second).Should(Equal(0))

	// Deleting a Ready image removes its golden PVC.
	g.Expect(env.Client.Delete(ctx, vmi)).To(Succeed())
	g.Eventually(func() bool {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(pvc), pvc)
		return err != nil || pvc.DeletionTimestamp != nil
	}, 20*time.Second).Should(BeTrue())
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKeyFromObject(vmi), vmi) }, 20*time.Second).ShouldNot(Succeed())
}

// TestRetries: a transient failure is retried with a new pod, up to the limit; a permanent one
// ends the import at once.
func TestRetries(t *testing.T) {
	startManager(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "retry")
	g.Expect(err).NotTo(HaveOccurred())

	flaky := newImage(ns, "flaky", "1Gi", 1)
	g.Expect(env.Client.Create(ctx, flaky)).To(Succeed())
	kubelet(t, ns, "vmim-flaky-import-0", corev1.PodFailed, &transfer.Result{Reason: transfer.ReasonSourceUnavailable, Transient: true, Message: "503"}, 3)
	g.Eventually(status(t, flaky, &flaky.Status), 20*time.Second).Should(WithTransform(readyReason, Equal("Retrying")))
	g.Expect(flaky.Status.Retries).To(Equal(int32(1)))
	// The next attempt comes after the backoff (2 s), as a new pod.
	kubelet(t, ns, "vmim-flaky-import-1", corev1.PodFailed, nil, 137) // killed: no result
	g.Eventually(status(t, flaky, &flaky.Status), 20*time.Second).Should(WithTransform(phase, Equal(common.PhaseFailed)))
	g.Expect(readyReason(&flaky.Status)).To(Equal(string(transfer.ReasonInternal)))
	g.Expect(meta.FindStatusCondition(flaky.Status.Conditions, common.ConditionReady).Message).To(ContainSubstring("exit code 137"))

	bad := newImage(ns, "bad", "1Gi", 3)
	g.Expect(env.Client.Create(ctx, bad)).To(Succeed())
	kubelet(t, ns, "vmim-bad-import-0", corev1.PodFailed, &transfer.Result{Reason: transfer.ReasonChecksumMismatch, Message: "checksum mismatch"}, 1)
	g.Eventually(status(t, bad, &bad.Status), 20*time.Second).Should(WithTransform(phase, Equal(common.PhaseFailed)))
	g.Expect(readyReason(&bad.Status)).To(Equal("ChecksumMismatch"))
	g.Expect(bad.Status.Retries).To(Equal(int32(0)))
	g.Consistently(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vmim-bad-import-1"}, &corev1.Pod{})
	}, 3*time.Second).ShouldNot(Succeed(), "a permanent failure is not retried")
}

// TestProbeAndTemplate: an ImageTemplate without a size is probed first, and its PVC sized
// from the virtual size; its registry source becomes the importer's arguments; deleting it
// mid-import stops the pod.
func TestProbeAndTemplate(t *testing.T) {
	startManager(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "probe")
	g.Expect(err).NotTo(HaveOccurred())
	imt := &virtualmachine.ImageTemplate{ObjectMeta: metav1.ObjectMeta{Name: "centos", Namespace: ns},
		Spec: virtualmachine.ImageTemplateSpec{Source: virtualmachine.ImageTemplateSource{
			Registry: &common.RegistrySource{URL: "docker://quay.io/containerdisks/centos-stream:9", SecretRef: "pull", Architecture: "arm64"}}}}
	g.Expect(env.Client.Create(ctx, imt)).To(Succeed())

	probe := &corev1.Pod{}
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "imt-centos-probe-0"}, probe)
	}, 20*time.Second).Should(Succeed())
	g.Expect(strings.Join(probe.Spec.Containers[0].Args, " ")).To(ContainSubstring("--source registry --url docker://quay.io/containerdisks/centos-stream:9 --auth-dir /var/run/diskpipe/auth --architecture arm64 --probe"))
	// The root filesystem is read-only: the registry client's CA directory is written in a
	// small scratch /tmp.
	g.Expect(probe.Spec.Volumes).To(HaveLen(2), "a probe mounts no volume, only the pull secret and its scratch /tmp")
	g.Expect(probe.Spec.Volumes[1].EmptyDir).To(Equal(&corev1.EmptyDirVolumeSource{SizeLimit: &importpod.ScratchSize}))
	g.Expect(probe.Spec.Containers[0].VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "scratch", MountPath: "/tmp"}))
	kubelet(t, ns, probe.Name, corev1.PodSucceeded, &transfer.Result{Succeeded: true, Format: "qcow2", VirtualSize: 10 << 30}, 0)

	pvc := &corev1.PersistentVolumeClaim{}
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "imt-centos"}, pvc)
	}, 20*time.Second).Should(Succeed())
	size := pvc.Spec.Resources.Requests.Storage().Value()
	g.Expect(float64(size)).To(BeNumerically(">=", float64(10<<30)/0.94), "virtual size plus 6 %% filesystem overhead")
	g.Expect(size % (1 << 20)).To(BeZero())
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "imt-centos-import-0"}, &corev1.Pod{})
	}, 20*time.Second).Should(Succeed())
	g.Expect(pvc.Spec.AccessModes).To(Equal([]corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}))

	g.Expect(env.Client.Delete(ctx, imt)).To(Succeed())
	g.Eventually(func() int {
		pods := &corev1.PodList{}
		_ = env.Client.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{goldenimage.LabelRole: "importer"})
		n := 0
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				n++
			}
		}
		return n
	}, 20*time.Second).Should(BeZero())
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKeyFromObject(imt), imt) }, 20*time.Second).ShouldNot(Succeed())
}

// TestNodePull: a container disk with pullMethod Node is run by the probe and import pods
// themselves, so that the node's runtime pulls it (its pull Secret an image pull secret), with
// the importer copied in by an init container of diskpipe's image; settings that only diskpipe's
// own pull reads are refused with the reason.
func TestNodePull(t *testing.T) {
	startManager(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "node-pull")
	g.Expect(err).NotTo(HaveOccurred())
	vmi := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "fedora", Namespace: ns},
		Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{
			Registry: &common.RegistrySource{URL: "docker://mirror.example.com/containerdisks/fedora:41", SecretRef: "pull", PullMethod: common.PullMethodNode}}}}
	refused := vmi.DeepCopy()
	refused.Name, refused.Spec.Source.Registry.CertConfigMap = "with-ca", "ca"
	g.Expect(env.Client.Create(ctx, refused)).To(MatchError(ContainSubstring(
		"with pullMethod Node the node pulls the image with its own settings: certConfigMap, insecureSkipTLSVerify, architecture and signature apply to pullMethod Pod only")))
	artifact := vmi.DeepCopy()
	artifact.Name, artifact.Spec.Source.Registry.Disk = "artifact", "rootdisk"
	g.Expect(env.Client.Create(ctx, artifact)).To(MatchError(ContainSubstring(
		"a KubeVirt VM artifact is not a container image a node can run: import its disk with pullMethod Pod (the default)")))
	g.Expect(env.Client.Create(ctx, vmi)).To(Succeed())
	// With pullMethod Pod, the importer picks the artifact's disk.
	picked := vmi.DeepCopy()
	picked.ObjectMeta = metav1.ObjectMeta{Name: "picked", Namespace: ns}
	picked.Spec.Source.Registry.PullMethod, picked.Spec.Source.Registry.Disk = "", "rootdisk"
	g.Expect(env.Client.Create(ctx, picked)).To(Succeed())
	probe := ctrltest.Pod(t, env, ns, "vmim-picked-probe-0")
	g.Expect(strings.Join(probe.Spec.Containers[0].Args, " ")).To(ContainSubstring("--source registry --url docker://mirror.example.com/containerdisks/fedora:41 --auth-dir /var/run/diskpipe/auth --disk rootdisk --probe"))

	for i, name := range []string{"vmim-fedora-probe-0", "vmim-fedora-import-0"} {
		pod := ctrltest.Pod(t, env, ns, name)
		ctr := pod.Spec.Containers[0]
		g.Expect(ctr.Image).To(Equal("mirror.example.com/containerdisks/fedora:41"), name)
		g.Expect(ctr.Command).To(Equal([]string{"/diskpipe/importer"}), name)
		g.Expect(strings.Join(ctr.Args, " ")).To(ContainSubstring("--source containerdisk --path /disk"), name)
		g.Expect(strings.Join(ctr.Args, " ")).NotTo(ContainSubstring("--url"), name)
		g.Expect(ctr.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "diskpipe", MountPath: "/diskpipe", ReadOnly: true}), name)
		g.Expect(pod.Spec.InitContainers).To(HaveLen(1), name)
		install := pod.Spec.InitContainers[0]
		g.Expect(install.Image).NotTo(Equal(ctr.Image), name)
		g.Expect(install.Command).To(Equal([]string{"/importer"}), name)
		g.Expect(install.Args).To(Equal([]string{"--install", "/diskpipe/importer"}), name)
		g.Expect(*install.SecurityContext.ReadOnlyRootFilesystem).To(BeTrue(), name)
		g.Expect(pod.Spec.ImagePullSecrets).To(ContainElement(corev1.LocalObjectReference{Name: "pull"}), name)
		g.Expect(ctr.ImagePullPolicy).To(Equal(corev1.PullAlways), "%s: the registry is asked whether this pod may pull it", name)
		if i == 0 {
			kubelet(t, ns, name, corev1.PodSucceeded, &transfer.Result{Succeeded: true, Format: "qcow2", VirtualSize: 5 << 30}, 0)
			ctrltest.Bind(t, env, ns, "vmim-fedora")
		}
	}
	// A node that cannot pull the image: the kubelet's reason is the image's.
	pod := ctrltest.Pod(t, env, ns, "vmim-fedora-import-0")
	pod.Status.Phase = corev1.PodPending
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "importer", State: corev1.ContainerState{
		Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: "pull access denied"}}}}
	g.Expect(env.Client.Status().Update(ctx, pod)).To(Succeed())
	g.Eventually(func() string {
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(vmi), vmi)
		if c := meta.FindStatusCondition(vmi.Status.Conditions, common.ConditionReady); c != nil {
			return c.Message
		}
		return ""
	}, 20*time.Second).Should(Equal("waiting for the pod vmim-fedora-import-0 to start: its container importer is ErrImagePull: pull access denied"))
}

// TestSizeRequired: a source whose size only an import can tell (compressed raw) waits for the
// user to give a size, without probing again, and imports once the spec has one.
func TestSizeRequired(t *testing.T) {
	startManager(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "size")
	g.Expect(err).NotTo(HaveOccurred())
	vmi := newImage(ns, "fedora", "", 3)
	g.Expect(env.Client.Create(ctx, vmi)).To(Succeed())
	kubelet(t, ns, "vmim-fedora-probe-0", corev1.PodSucceeded, &transfer.Result{Succeeded: true, Format: "raw", VirtualSize: -1}, 0)
	g.Eventually(status(t, vmi, &vmi.Status), 20*time.Second).Should(WithTransform(readyReason, Equal("SizeRequired")))
	g.Consistently(func() int {
		pods := &corev1.PodList{}
		_ = env.Client.List(ctx, pods, client.InNamespace(ns))
		return len(pods.Items)
	}, 3*time.Second).Should(BeZero(), "no second probe")

	g.Expect(ctrltest.Update(ctx, env.Client, vmi, func() { vmi.Spec.Resources.Requests.Storage = ctrltest.Quantity("20Gi") })).To(Succeed())
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vmim-fedora-import-0"}, &corev1.Pod{})
	}, 20*time.Second).Should(Succeed())
}

// TestNameTerminating: an image made again while its earlier self's golden PVC is still being
// deleted (a pod still used it) waits for the name, says so, and imports once it is free; it
// does not fail, and does not take the old claim.
func TestNameTerminating(t *testing.T) {
	startManager(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "again")
	g.Expect(err).NotTo(HaveOccurred())
	old := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "vmim-fedora", Namespace: ns, Finalizers: []string{"diskpipe.test/in-use"}},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	g.Expect(env.Client.Create(ctx, old)).To(Succeed())
	g.Expect(env.Client.Delete(ctx, old)).To(Succeed())

	vmi := newImage(ns, "fedora", "10Gi", 3)
	g.Expect(env.Client.Create(ctx, vmi)).To(Succeed())
	g.Eventually(status(t, vmi, &vmi.Status), 20*time.Second).Should(WithTransform(phaseReasonMessage, Equal(
		"Pending NameTerminating: a PersistentVolumeClaim named vmim-fedora, not made for this object (most often an earlier object's of the same name), is still being deleted: this object's is made once it is gone")))
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vmim-fedora-import-0"}, &corev1.Pod{})).NotTo(Succeed())

	g.Expect(ctrltest.Update(ctx, env.Client, old, func() { old.Finalizers = nil })).To(Succeed())
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vmim-fedora-import-0"}, &corev1.Pod{})
	}, 20*time.Second).Should(Succeed())
	pvc := &corev1.PersistentVolumeClaim{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vmim-fedora"}, pvc)).To(Succeed())
	g.Expect(metav1.IsControlledBy(pvc, vmi)).To(BeTrue())
}

// TestClaimedSizeBounded: a size a source claims near 2^63 (a crafted header) fails the
// image with the reason, before any volume is sized from it (where it would overflow).
func TestClaimedSizeBounded(t *testing.T) {
	startManager(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "size")
	g.Expect(err).NotTo(HaveOccurred())
	vmi := newImage(ns, "huge", "", 3)
	g.Expect(env.Client.Create(ctx, vmi)).To(Succeed())
	kubelet(t, ns, "vmim-huge-probe-0", corev1.PodSucceeded, &transfer.Result{Succeeded: true, Format: "qcow2", VirtualSize: 1<<63 - 1}, 0)
	g.Eventually(status(t, vmi, &vmi.Status), 20*time.Second).Should(WithTransform(readyReason, Equal("TooLarge")))
	g.Expect(vmi.Status.Phase).To(Equal(common.PhaseFailed))
	g.Expect(meta.FindStatusCondition(vmi.Status.Conditions, common.ConditionReady).Message).To(Equal(
		"the source claims a virtual size of 9223372036854775807 bytes; diskpipe imports disks of at most 1125899906842624 bytes (1 PiB)"))
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vmim-huge"}, &corev1.PersistentVolumeClaim{})).NotTo(Succeed())
}

// TestBlockVolume: a Block image's importer gets the PVC as a device and writes to it.
func TestBlockVolume(t *testing.T) {
	startManager(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "block")
	g.Expect(err).NotTo(HaveOccurred())
	vmi := newImage(ns, "raw-block", "4Gi", 3)
	vmi.Spec.VolumeMode = ptr.To(corev1.PersistentVolumeBlock)
	vmi.Spec.StorageClassName = ptr.To("ceph-block")
	g.Expect(env.Client.Create(ctx, vmi)).To(Succeed())

	pvc := &corev1.PersistentVolumeClaim{}
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vmim-raw-block"}, pvc)
	}, 20*time.Second).Should(Succeed())
	g.Expect(*pvc.Spec.VolumeMode).To(Equal(corev1.PersistentVolumeBlock))
	g.Expect(*pvc.Spec.StorageClassName).To(Equal("ceph-block"))
	pod := &corev1.Pod{}
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vmim-raw-block-import-0"}, pod)
	}, 20*time.Second).Should(Succeed())
	c := pod.Spec.Containers[0]
	g.Expect(c.VolumeDevices).To(Equal([]corev1.VolumeDevice{{Name: "target", DevicePath: importpod.TargetDevice}}))
	g.Expect(strings.Join(c.Args, " ")).To(ContainSubstring("--target " + importpod.TargetDevice))
	for _, m := range c.VolumeMounts {
		g.Expect(m.Name).NotTo(Equal("target"), "a block volume is not mounted as a filesystem")
	}
}

// TestObjectStoreSource imports an object of the bundled store through a presigned URL: the
// importer gets the one object for a day, never the store's keys. The URL is checked against
// the real store: it downloads the object uploaded with awscli.
func TestObjectStoreSource(t *testing.T) {
	startManager(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "objectstore")
	g.Expect(err).NotTo(HaveOccurred())
	obj := filepath.Join(t.TempDir(), "cirros.qcow2")
	g.Expect(os.WriteFile(obj, []byte("QFI\xfb not really an image, but the URL must fetch exactly these bytes"), 0o600)).To(Succeed())
	// Uploaded as the namespace, with its keys: the bucket is the namespace's.
	tenant, err := store.ClientOf(env.Client).Tenant(ctx, ns)
	g.Expect(err).NotTo(HaveOccurred())
	access, secret := tenant.Keys()
	g.Expect(tenant.EnsureBucket(ctx, "images")).To(Succeed())
	out, err := store.AWSAs(ctx, access, secret, "s3", "cp", obj, "s3://images/cirros.qcow2")
	g.Expect(err).NotTo(HaveOccurred(), out)

	vmi := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "cirros", Namespace: ns},
		Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{
			ObjectStore: &common.ObjectStoreSource{BucketName: "images", ObjectName: "cirros.qcow2"}}}}
	vmi.Spec.Resources.Requests.Storage = ctrltest.Quantity("1Gi")
	g.Expect(env.Client.Create(ctx, vmi)).To(Succeed())
	pod := ctrltest.Pod(t, env, ns, "vmim-cirros-import-0")
	args := strings.Join(pod.Spec.Containers[0].Args, " ")
	g.Expect(args).To(HavePrefix("--source http --url-file /var/run/diskpipe/url/url "))
	g.Expect(args).NotTo(ContainSubstring(store.AccessKey))

	sec := &corev1.Secret{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: pod.Name}, sec)).To(Succeed())
	g.Expect(metav1.IsControlledBy(sec, vmi)).To(BeTrue())
	url := string(sec.Data["url"])
	g.Expect(url).To(HavePrefix(store.Endpoint + "/images/cirros.qcow2?"))
	g.Expect(url).NotTo(ContainSubstring(store.SecretKey))
	resp, err := http.Get(url) //nolint:gosec,noctx // the presigned URL under test
	g.Expect(err).NotTo(HaveOccurred())
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want, _ := os.ReadFile(obj)
	g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	g.Expect(body).To(Equal(want))
	g.Eventually(status(t, vmi, &vmi.Status), 20*time.Second).Should(WithTransform(func(st *common.ImageStatus) string {
		return st.SourceType + " " + string(st.Phase)
	}, Equal("objectStore Pending")))

	// Another namespace naming the same object is refused by the store, before any pod runs.
	other, err := env.CreateNamespace(ctx, "objectstore-other")
	g.Expect(err).NotTo(HaveOccurred())
	stolen := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "stolen", Namespace: other},
		Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{
			ObjectStore: &common.ObjectStoreSource{BucketName: "images", ObjectName: "cirros.qcow2"}}}}
	stolen.Spec.Resources.Requests.Storage = ctrltest.Quantity("1Gi")
	g.Expect(env.Client.Create(ctx, stolen)).To(Succeed())
	g.Eventually(status(t, stolen, &stolen.Status), 20*time.Second).Should(WithTransform(phaseReasonMessage, HavePrefix("Failed SourceForbidden: namespace "+other+" may not read s3://images/cirros.qcow2 in the bundled object store")))
	pods := &corev1.PodList{}
	g.Expect(env.Client.List(ctx, pods, client.InNamespace(other))).To(Succeed())
	g.Expect(pods.Items).To(BeEmpty(), "no importer runs for a refused source")

	// A store that is away when the manager first acts for a namespace: it cannot make the
	// namespace's account, so no pod starts; status says why, and the import goes on once the
	// store is back.
	late, err := env.CreateNamespace(ctx, "objectstore-late")
	g.Expect(err).NotTo(HaveOccurred())
	store.Kill()
	defer store.Restart() // for the other tests, if this one fails before it restarts it
	waiting := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "waiting", Namespace: late},
		Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{
			ObjectStore: &common.ObjectStoreSource{BucketName: "late", ObjectName: "disk.qcow2"}}}}
	waiting.Spec.Resources.Requests.Storage = ctrltest.Quantity("1Gi")
	g.Expect(env.Client.Create(ctx, waiting)).To(Succeed())
	g.Eventually(status(t, waiting, &waiting.Status), 20*time.Second).Should(WithTransform(phaseReasonMessage, HavePrefix("Pending ObjectStoreUnavailable: waiting for the bundled object store to act as namespace "+late)))
	g.Expect(env.Client.List(ctx, pods, client.InNamespace(late))).To(Succeed())
	g.Expect(pods.Items).To(BeEmpty(), "no importer runs while the store is away")
	store.Restart()
	lateTenant, err := store.ClientOf(env.Client).Tenant(ctx, late)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(lateTenant.EnsureBucket(ctx, "late")).To(Succeed())
	la, ls := lateTenant.Keys()
	out, err = store.AWSAs(ctx, la, ls, "s3", "cp", obj, "s3://late/disk.qcow2")
	g.Expect(err).NotTo(HaveOccurred(), out)
	// The manager looks again every 10 s; on a loaded machine (CI's fresh run, with builds
	// beside it) its next pass and the restarted store's first answers took more than 20 s.
	ctrltest.Pod(t, env, late, "vmim-waiting-import-0")
}

// TestCopySources makes images from a PVC of their namespace and from another ImageTemplate:
// host-assisted copies with the source mounted read-only, sized like the source.
func TestCopySources(t *testing.T) {
	startManager(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "copy")
	g.Expect(err).NotTo(HaveOccurred())

	vmi := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "from-pvc", Namespace: ns},
		Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{PVC: &common.PVCSource{Name: "installed"}}}}
	g.Expect(env.Client.Create(ctx, vmi)).To(Succeed())
	g.Eventually(status(t, vmi, &vmi.Status), 20*time.Second).Should(WithTransform(readyReason, Equal("SourceNotFound")))
	src := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "installed", Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeMode: ptr.To(corev1.PersistentVolumeBlock),
			Resources:  corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("3Gi")}}}}
	g.Expect(env.Client.Create(ctx, src)).To(Succeed())
	// The image looks again after its wait (nothing watches arbitrary PVCs).
	pod := &corev1.Pod{}
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vmim-from-pvc-import-0"}, pod)
	}, 45*time.Second).Should(Succeed())
	g.Expect(strings.Join(pod.Spec.Containers[0].Args, " ")).To(ContainSubstring("--source file --path /dev/diskpipe-source"))
	g.Expect(pod.Spec.Containers[0].VolumeDevices).To(ContainElement(corev1.VolumeDevice{Name: "source", DevicePath: "/dev/diskpipe-source"}))
	golden := &corev1.PersistentVolumeClaim{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vmim-from-pvc"}, golden)).To(Succeed())
	// A block volume's whole device, into a filesystem volume: the filesystem's share besides
	// (3 GiB / (1 - 6 %), in MiB), or the importer would refuse it as too large.
	g.Expect(golden.Spec.Resources.Requests.Storage().Value()).To(Equal(transfer.VolumeSizeFor(3<<30, transfer.DefaultOverhead)))
	kubelet(t, ns, pod.Name, corev1.PodSucceeded, &transfer.Result{Succeeded: true, Format: "raw", VirtualSize: 3 << 30}, 0)
	g.Eventually(status(t, vmi, &vmi.Status), 20*time.Second).Should(WithTransform(phase, Equal(common.PhaseReady)))
	g.Expect(vmi.Status.SourceType).To(Equal("pvc"))

	base := &virtualmachine.ImageTemplate{ObjectMeta: metav1.ObjectMeta{Name: "base", Namespace: ns},
		Spec: virtualmachine.ImageTemplateSpec{Source: virtualmachine.ImageTemplateSource{HTTP: &common.HTTPSource{URL: "https://images.example.com/base.img"}}}}
	base.Spec.Resources.Requests.Storage = ctrltest.Quantity("5Gi")
	g.Expect(env.Client.Create(ctx, base)).To(Succeed())
	kubelet(t, ns, "imt-base-import-0", corev1.PodSucceeded, &transfer.Result{Succeeded: true, Format: "qcow2", VirtualSize: 4 << 30}, 0)
	clone := &virtualmachine.ImageTemplate{ObjectMeta: metav1.ObjectMeta{Name: "clone", Namespace: ns},
		Spec: virtualmachine.ImageTemplateSpec{Source: virtualmachine.ImageTemplateSource{Clone: &virtualmachine.ObjectReference{Name: "base"}}}}
	g.Expect(env.Client.Create(ctx, clone)).To(Succeed())
	pod = ctrltest.Pod(t, env, ns, "imt-clone-import-0")
	g.Expect(strings.Join(pod.Spec.Containers[0].Args, " ")).To(ContainSubstring("--source file --path /source/disk.img"))
	var claims []string
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			claims = append(claims, fmt.Sprintf("%s ro=%t", v.PersistentVolumeClaim.ClaimName, v.PersistentVolumeClaim.ReadOnly))
		}
	}
	g.Expect(claims).To(ConsistOf("imt-clone ro=false", "imt-base ro=true"))
}

// TestUploadSource waits for the upload proxy's marker, then imports the uploaded object
// like an objectStore source; deleting the image deletes the upload.
func TestUploadSource(t *testing.T) {
	startManager(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "upload")
	g.Expect(err).NotTo(HaveOccurred())
	vmi := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "uploaded", Namespace: ns},
		Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{Upload: &common.UploadSource{}}}}
	vmi.Spec.Resources.Requests.Storage = ctrltest.Quantity("1Gi")
	g.Expect(env.Client.Create(ctx, vmi)).To(Succeed())
	g.Eventually(status(t, vmi, &vmi.Status), 20*time.Second).Should(WithTransform(phaseAndReady, Equal("Pending WaitingForUpload: upload the image: PUT it to the upload proxy at /v1/namespaces/"+ns+"/virtualmachineimages/uploaded")))

	// What the upload proxy leaves: the object and its marker.
	key := uploads.ObjectKey(ns, "virtualmachineimages", "uploaded", string(vmi.UID))
	body := []byte("the uploaded image")
	c := store.Client()
	g.Expect(c.EnsureBucket(ctx, uploads.Bucket)).To(Succeed())
	for k, b := range map[string][]byte{key: body, uploads.MarkerKey(key): []byte("sha256:x")} {
		_, err := c.PutObject(ctx, uploads.Bucket, k, bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{})
		g.Expect(err).NotTo(HaveOccurred())
	}
	pod := &corev1.Pod{}
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vmim-uploaded-import-0"}, pod)
	}, 20*time.Second).Should(Succeed())
	g.Expect(strings.Join(pod.Spec.Containers[0].Args, " ")).To(HavePrefix("--source http --url-file /var/run/diskpipe/url/url "))
	sec := &corev1.Secret{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: pod.Name}, sec)).To(Succeed())
	resp, err := http.Get(string(sec.Data["url"])) //nolint:gosec,noctx // the presigned URL under test
	g.Expect(err).NotTo(HaveOccurred())
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	g.Expect(got).To(Equal(body))

	// The upload goes with its image.
	g.Expect(env.Client.Delete(ctx, vmi)).To(Succeed())
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKeyFromObject(vmi), vmi) }, 20*time.Second).ShouldNot(Succeed())
	for _, k := range []string{key, uploads.MarkerKey(key)} {
		_, err := c.StatObject(ctx, uploads.Bucket, k, minio.StatObjectOptions{})
		g.Expect(minio.ToErrorResponse(err).Code).To(Equal("NoSuchKey"), k)
	}
}

// TestCopyWaitsForWriters: a PVC a pod mounts read-write is not copied until that pod is
// gone (CDI's CloneSourceInUse); readers, finished pods and a pod merely labelled as
// diskpipe's (the label proves nothing without diskpipe's mark) are counted as they are.
func TestCopyWaitsForWriters(t *testing.T) {
	startManager(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "busy")
	g.Expect(err).NotTo(HaveOccurred())
	src := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "vm-disk", Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	g.Expect(env.Client.Create(ctx, src)).To(Succeed())
	mounting := func(name string, readOnly bool, labels map[string]string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "vm"}},
				Volumes: []corev1.Volume{{Name: "d", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "vm-disk", ReadOnly: readOnly}}}}}}
		g.Expect(env.Client.Create(ctx, p)).To(Succeed())
		return p
	}
	mounting("reader", true, nil)
	done := mounting("done", false, nil)
	done.Status.Phase = corev1.PodSucceeded
	g.Expect(env.Client.Status().Update(ctx, done)).To(Succeed())
	forged := mounting("virt-launcher-vm", false, map[string]string{importpod.LabelManagedBy: importpod.ManagedBy})

	vmi := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "snap", Namespace: ns},
		Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{PVC: &common.PVCSource{Name: "vm-disk"}}}}
	g.Expect(env.Client.Create(ctx, vmi)).To(Succeed())
	g.Eventually(status(t, vmi, &vmi.Status), 20*time.Second).Should(WithTransform(phaseAndReady, HavePrefix("Pending CloneSourceInUse: pod "+ns+"/virt-launcher-vm using PersistentVolumeClaim vm-disk")))
	g.Consistently(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vmim-snap-import-0"}, &corev1.Pod{})
	}, 3*time.Second).ShouldNot(Succeed(), "nothing copies the disk while its VM writes it")

	// The VM stops: the copy begins.
	g.Expect(env.Client.Delete(ctx, forged)).To(Succeed())
	ctrltest.Pod(t, env, ns, "vmim-snap-import-0")
}

// phaseAndReady is an image's phase and its Ready condition's reason and message.
func phaseAndReady(st *common.ImageStatus) string {
	c := meta.FindStatusCondition(st.Conditions, common.ConditionReady)
	if c == nil {
		return ""
	}
	return string(st.Phase) + " " + c.Reason + ": " + c.Message
}
