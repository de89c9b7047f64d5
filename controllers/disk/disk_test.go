package disk_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/admission"
	"github.com/diskpipe/diskpipe/controllers/disk"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/ctrltest"
	"github.com/diskpipe/diskpipe/controllers/internal/hostcopy"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
	"github.com/diskpipe/diskpipe/controllers/manager"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	// A copy from another namespace is woken by its clone source's pod (hostcopy.Wakes), not
	// by asking again: TestCrossNamespace's importer starts only if that works.
	hostcopy.ServingPoll = time.Hour
	testenv.RunTests(m, &env)
}

// The storage the tests stand in for: one CSI driver with an Immediate class, a
// WaitForFirstConsumer class, a class that prefers snapshots, and a VolumeSnapshotClass; and
// a second driver without snapshots.
const (
	driver     = "csi.diskpipe.test"
	classCSI   = "csi"
	classWFFC  = "csi-wffc"
	classSnap  = "csi-snap"
	classOther = "other"
	// classChart has no annotation: the installation's defaults (the chart's
	// cloneStrategy.storageClasses) prefer snapshots for it.
	classChart  = "csi-chart"
	snapClass   = "csi-snapshots"
	goldenSize  = "2Gi"
	goldenBytes = 2 << 30
)

var setupOnce sync.Once

// managerUser is who the manager is in these tests.
const managerUser = "system:serviceaccount:diskpipe-system:diskpipe-manager"

func setup(t *testing.T) {
	t.Helper()
	setupOnce.Do(func() {
		ctx := t.Context()
		wffc := storagev1.VolumeBindingWaitForFirstConsumer
		for _, sc := range []*storagev1.StorageClass{
			{ObjectMeta: metav1.ObjectMeta{Name: classCSI, Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}}, Provisioner: driver},
			{ObjectMeta: metav1.ObjectMeta{Name: classWFFC}, Provisioner: driver, VolumeBindingMode: &wffc},
			{ObjectMeta: metav1.ObjectMeta{Name: classSnap, Annotations: map[string]string{disk.AnnotationCloneStrategy: "Snapshot"}}, Provisioner: driver},
			{ObjectMeta: metav1.ObjectMeta{Name: classOther}, Provisioner: "other.diskpipe.test"},
			{ObjectMeta: metav1.ObjectMeta{Name: classChart}, Provisioner: driver},
		} {
			if err := env.Client.Create(ctx, sc); err != nil {
				t.Fatal(err)
			}
		}
		if err := env.Client.Create(ctx, &snapshotv1.VolumeSnapshotClass{ObjectMeta: metav1.ObjectMeta{Name: snapClass},
			Driver: driver, DeletionPolicy: snapshotv1.VolumeSnapshotContentDelete}); err != nil {
			t.Fatal(err)
		}
		host, port, certDir, err := env.InstallWebhooks(ctx, admission.Configuration("diskpipe-system", "diskpipe-webhook", nil))
		if err != nil {
			t.Fatal(err)
		}
		// The manager runs with nothing but the chart's RBAC: whatever these tests exercise, it
		// is allowed to do.
		user, err := env.ApplyChartRBAC(ctx, "diskpipe-system")
		if err != nil || user != managerUser {
			t.Fatal(user, err)
		}
		cfg, err := env.UserConfig(managerUser)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ctrltest.StartManagerAs(env, cfg, manager.Options{
			Webhook:         &manager.WebhookOptions{Host: host, Port: port, CertDir: certDir},
			CloneStrategies: disk.StrategyDefaults{StorageClasses: map[string]common.CloneStrategy{classChart: common.CloneStrategySnapshot}},
			// As the chart configures it: pods run as an account made for them, behind a policy.
			Importer: importpod.Config{ServiceAccountName: "diskpipe-importer", NetworkPolicy: &importpod.NetworkPolicyConfig{
				ManagerNamespace: "diskpipe-system", ManagerLabels: map[string]string{"app.kubernetes.io/component": "manager"}}},
			// Its Lease is in the release namespace, where the chart's Role allows it.
			LeaderElection: true, LeaderElectionNamespace: "diskpipe-system",
		}); err != nil {
			t.Fatal(err)
		}
	})
}

func namespace(t *testing.T) string {
	t.Helper()
	ns, err := env.CreateNamespace(t.Context(), "disk")
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// readyImage makes a VirtualMachineImage and plays its import to Ready.
func readyImage(t *testing.T, ns, name, class string) *hypercloud.VirtualMachineImage {
	t.Helper()
	return readyImageWith(t, ns, name, class, nil)
}

// readyImageWith is readyImage, its golden PVC bound to a volume that volume shapes (its node
// affinity), unless nil.
func readyImageWith(t *testing.T, ns, name, class string, volume func(*corev1.PersistentVolume)) *hypercloud.VirtualMachineImage {
	t.Helper()
	return readyImageOf(t, newImage(ns, name, class), volume)
}

func newImage(ns, name, class string) *hypercloud.VirtualMachineImage {
	vmi := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{HTTP: common.HTTPURL("https://images.example.com/" + name + ".qcow2")}}}
	vmi.Spec.Resources.Requests.Storage = ctrltest.Quantity(goldenSize)
	vmi.Spec.StorageClassName = &class
	return vmi
}

// readyImageOf makes vmi (of newImage) and brings it to Ready as readyImageWith does.
func readyImageOf(t *testing.T, vmi *hypercloud.VirtualMachineImage, volume func(*corev1.PersistentVolume)) *hypercloud.VirtualMachineImage {
	t.Helper()
	ns, name := vmi.Namespace, vmi.Name
	g := NewWithT(t)
	g.Expect(env.Client.Create(t.Context(), vmi)).To(Succeed())
	ctrltest.BindWith(t, env, ns, "vmim-"+name, volume)
	ctrltest.Complete(t, env, ns, "vmim-"+name+"-import-0", transfer.Result{Format: "qcow2", VirtualSize: 1 << 30})
	g.Eventually(func() common.Phase {
		_ = env.Client.Get(t.Context(), client.ObjectKeyFromObject(vmi), vmi)
		return vmi.Status.Phase
	}, 20*time.Second).Should(Equal(common.PhaseReady))
	return vmi
}

func newDiskVolume(ns, name string, src diskvolume.DiskVolumeSource, class, size string) *diskvolume.DiskVolume {
	d := &diskvolume.DiskVolume{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: diskvolume.DiskVolumeSpec{Source: src}}
	if class != "" {
		d.Spec.StorageClassName = &class
	}
	if size != "" {
		d.Spec.Resources.Requests.Storage = ctrltest.Quantity(size)
	}
	return d
}

func fromImage(ns, name string) diskvolume.DiskVolumeSource {
	return diskvolume.DiskVolumeSource{Image: &diskvolume.ImageSource{Name: common.LocalName(name), Namespace: ns, Kind: diskvolume.ImageKindVirtualMachineImage}}
}

// diskStatus returns a function that reads obj's status, for Eventually.
func diskStatus(t *testing.T, obj client.Object, st *common.DiskStatus) func() *common.DiskStatus {
	return func() *common.DiskStatus {
		_ = env.Client.Get(t.Context(), client.ObjectKeyFromObject(obj), obj)
		return st
	}
}

func phase(st *common.DiskStatus) common.Phase { return st.Phase }

func condition(typ string) func(st *common.DiskStatus) string {
	return func(st *common.DiskStatus) string {
		if c := meta.FindStatusCondition(st.Conditions, typ); c != nil {
			return c.Reason + ": " + c.Message
		}
		return ""
	}
}

func pvcOf(t *testing.T, ns, name string) *corev1.PersistentVolumeClaim {
	t.Helper()
	pvc := &corev1.PersistentVolumeClaim{}
	NewWithT(t).Eventually(func() error { return env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, pvc) },
		20*time.Second).Should(Succeed())
	return pvc
}

// TestCSIClone is the seed's VirtualMachinePvc: a CSI clone of the golden PVC (of a class
// whose driver has no VolumeSnapshotClass, so that automatic is a CSI clone), larger than
// the image, so disk.img is grown to the volume by a grow pod once the clone is bound. The
// clone and the grow happen in a PVC of diskpipe's (the prime); the disk's own PVC is bound to
// that volume only once the disk is whole.
func TestCSIClone(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ns := namespace(t)
	vmi := readyImage(t, ns, "ubuntu", classOther)

	vmpvc := &hypercloud.VirtualMachinePvc{ObjectMeta: metav1.ObjectMeta{Name: "vm-disk", Namespace: ns},
		Spec: hypercloud.VirtualMachinePvcSpec{VirtualMachineImageName: "ubuntu",
			PVC: common.PVCTemplate{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}}}}
	vmpvc.Spec.PVC.Resources.Requests.Storage = ctrltest.Quantity("10Gi")
	vmpvc.Spec.PVC.StorageClassName = ptr.To(classOther)
	g.Expect(env.Client.Create(t.Context(), vmpvc)).To(Succeed())

	prime := disk.PrimeName(vmpvc.UID)
	pvc := pvcOf(t, ns, prime)
	g.Expect(pvc.Spec.DataSource).To(Equal(&corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "vmim-ubuntu"}))
	g.Expect(pvc.Spec.Resources.Requests.Storage().String()).To(Equal("10Gi"))
	g.Expect(pvc.Labels).To(HaveKeyWithValue(goldenimage.LabelCloneOf, string(vmi.UID)), "marked while cloning")
	g.Expect(metav1.IsControlledBy(pvc, vmpvc)).To(BeTrue())
	g.Eventually(diskStatus(t, vmpvc, &vmpvc.Status), 20*time.Second).Should(WithTransform(condition(disk.ConditionCloneStrategy),
		Equal(`FellBack: CSIClone, because Snapshot is not possible: no VolumeSnapshotClass for the driver "other.diskpipe.test"`)))
	g.Expect(vmpvc.Status.CloneStrategy).To(Equal(common.CloneStrategyCSIClone))

	primed := ctrltest.Bind(t, env, ns, prime)
	grow := ctrltest.Pod(t, env, ns, "vm-disk-grow-0")
	args := strings.Join(grow.Spec.Containers[0].Args, " ")
	g.Expect(args).To(ContainSubstring("--grow-only"))
	g.Expect(args).To(ContainSubstring("--target /data/disk.img --overhead 0.06 --capacity 10737418240"))
	g.Expect(grow.Spec.Volumes).To(ContainElement(HaveField("PersistentVolumeClaim.ClaimName", prime)))

	// The disk's PVC exists while the pod runs, pre-bound to the prime's volume and Pending:
	// a VM made now waits for it.
	final := pvcOf(t, ns, "vm-disk")
	g.Expect(final.Spec.VolumeName).To(Equal(primed.Spec.VolumeName))
	g.Expect(final.Spec.DataSource).To(BeNil())
	g.Expect(final.Annotations).To(HaveKeyWithValue(disk.AnnotationPrime, prime))
	g.Expect(metav1.IsControlledBy(final, vmpvc)).To(BeTrue())
	g.Consistently(func() corev1.PersistentVolumeClaimPhase { return pvcOf(t, ns, "vm-disk").Status.Phase }, time.Second).
		ShouldNot(Equal(corev1.ClaimBound))

	ctrltest.Complete(t, env, ns, "vm-disk-grow-0", transfer.Result{Format: "raw", VirtualSize: 10090985472})
	g.Eventually(diskStatus(t, vmpvc, &vmpvc.Status), 20*time.Second).Should(WithTransform(condition(common.ConditionReady),
		HavePrefix("HandingOver: the disk is complete")))
	g.Expect(vmpvc.Status.Phase).To(Equal(common.PhaseCloning))
	ctrltest.Bind(t, env, ns, "vm-disk") // the PV controller, once the volume's claimRef is the disk's PVC

	g.Eventually(diskStatus(t, vmpvc, &vmpvc.Status), 20*time.Second).Should(WithTransform(phase, Equal(common.PhaseReady)))
	g.Expect(condition(common.ConditionReady)(&vmpvc.Status)).To(MatchRegexp(`^Made: CSIClone of .*/ubuntu in \d+ s$`))
	g.Eventually(func() bool {
		p := &corev1.PersistentVolumeClaim{}
		err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: prime}, p)
		return apierrors.IsNotFound(err) || (err == nil && !p.DeletionTimestamp.IsZero()) // pvc-protection holds it here
	}, 20*time.Second).Should(BeTrue(), "the prime goes; its volume is the disk's")
	g.Expect(vmpvc.Status.PVCName).To(Equal("vm-disk"))
	g.Expect(vmpvc.Status.VirtualSize.Value()).To(Equal(int64(10090985472)))
	g.Expect(vmpvc.Status.Capacity.String()).To(Equal("10Gi"))
	g.Eventually(func() map[string]string { return pvcOf(t, ns, "vm-disk").Labels }, 20*time.Second).ShouldNot(HaveKey(goldenimage.LabelCloneOf))

	// The same size as the image: nothing to grow; Ready once bound.
	same := newDiskVolume(ns, "same-size", fromImage("", "ubuntu"), classOther, "")
	g.Expect(env.Client.Create(t.Context(), same)).To(Succeed())
	g.Expect(pvcOf(t, ns, "same-size").Spec.Resources.Requests.Storage().String()).To(Equal(goldenSize))
	g.Eventually(diskStatus(t, same, &same.Status), 20*time.Second).Should(WithTransform(condition(common.ConditionReady),
		HavePrefix("WaitingForBinding")))
	g.Consistently(diskStatus(t, same, &same.Status), 2*time.Second).Should(WithTransform(condition(common.ConditionReady),
		HavePrefix("WaitingForBinding")))
	ctrltest.Bind(t, env, ns, "same-size")
	g.Eventually(diskStatus(t, same, &same.Status), 20*time.Second).Should(WithTransform(phase, Equal(common.PhaseReady)))
	g.Expect(env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "same-size-grow-0"}, &corev1.Pod{})).
		To(WithTransform(apierrors.IsNotFound, BeTrue()))

	// Asking for exactly the golden PVC's size, which holds more than the image's 1 GiB disk:
	// the clone is grown to fill it, as a copy would be, so the guest sees what was asked.
	asked := newDiskVolume(ns, "asked", fromImage("", "ubuntu"), classOther, goldenSize)
	g.Expect(env.Client.Create(t.Context(), asked)).To(Succeed())
	ctrltest.Bind(t, env, ns, disk.PrimeName(asked.UID))
	grow = ctrltest.Pod(t, env, ns, "asked-grow-0")
	g.Expect(strings.Join(grow.Spec.Containers[0].Args, " ")).To(ContainSubstring("--grow-only"))

	// Smaller than the image: refused, with the sizes.
	small := newDiskVolume(ns, "small", fromImage("", "ubuntu"), classOther, "1Gi")
	g.Expect(env.Client.Create(t.Context(), small)).To(Succeed())
	g.Eventually(diskStatus(t, small, &small.Status), 20*time.Second).Should(WithTransform(condition(common.ConditionReady),
		Equal("TooSmall: the disk asks for 1Gi but its source needs 2Gi: ask for at least that")))
	g.Expect(small.Status.Phase).To(Equal(common.PhaseFailed))
}

// TestSnapshotStrategy restores disks from the image's one golden VolumeSnapshot, on a class
// that prefers snapshots.
func TestSnapshotStrategy(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ns := namespace(t)
	vmi := readyImage(t, ns, "fedora", classSnap)
	for _, name := range []string{"a", "b"} {
		g.Expect(env.Client.Create(t.Context(), newDiskVolume(ns, name, fromImage("", "fedora"), classSnap, ""))).To(Succeed())
	}
	for _, name := range []string{"a", "b"} {
		pvc := pvcOf(t, ns, name)
		g.Expect(pvc.Spec.DataSource).To(Equal(&corev1.TypedLocalObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"),
			Kind: "VolumeSnapshot", Name: "vmim-fedora-golden"}))
	}
	snaps := &snapshotv1.VolumeSnapshotList{}
	g.Expect(env.Client.List(t.Context(), snaps, client.InNamespace(ns))).To(Succeed())
	g.Expect(snaps.Items).To(HaveLen(1), "one golden snapshot per image")
	snap := snaps.Items[0]
	g.Expect(*snap.Spec.Source.PersistentVolumeClaimName).To(Equal("vmim-fedora"))
	g.Expect(*snap.Spec.VolumeSnapshotClassName).To(Equal(snapClass))
	g.Expect(metav1.IsControlledBy(&snap, vmi)).To(BeTrue())
	g.Eventually(func() string {
		_ = env.Client.Get(t.Context(), client.ObjectKeyFromObject(vmi), vmi)
		return vmi.Status.SnapshotName
	}, 20*time.Second).Should(Equal("vmim-fedora-golden"))

	a := &diskvolume.DiskVolume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "a"}}
	// The status that records the choice is written after the PVC is made.
	g.Eventually(diskStatus(t, a, &a.Status), 20*time.Second).Should(
		WithTransform(condition(disk.ConditionCloneStrategy), Equal("Preferred: Snapshot, as preferred")))
	ctrltest.Bind(t, env, ns, "a")
	g.Eventually(diskStatus(t, a, &a.Status), 20*time.Second).Should(WithTransform(phase, Equal(common.PhaseReady)))
}

// TestAutomatic: with nothing preferring a strategy, the disks of an image on shared storage
// whose driver has a VolumeSnapshotClass are restored from its one golden snapshot; those of an
// image on a node-local volume, or of a driver with no snapshot class, are CSI clones.
func TestAutomatic(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ns := namespace(t)
	readyImage(t, ns, "shared", classCSI)
	readyImageWith(t, ns, "local", classCSI, func(pv *corev1.PersistentVolume) {
		pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{"automatic-node"}}}}}}}
	})
	readyImage(t, ns, "nosnap", classOther)
	restored := "Preferred: Snapshot of the image's golden VolumeSnapshot, the default on shared storage whose driver has a VolumeSnapshotClass: one snapshot serves every disk of the image"
	golden := corev1.TypedLocalObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: "vmim-shared-golden"}
	for _, tc := range []struct {
		disk, image, class string
		source             corev1.TypedLocalObjectReference
		condition          string
	}{
		{"s1", "shared", classCSI, golden, restored},
		{"s2", "shared", classCSI, golden, restored},
		{"l", "local", classCSI, corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "vmim-local"}, "Preferred: CSIClone, as preferred"},
		{"n", "nosnap", classOther, corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "vmim-nosnap"},
			`FellBack: CSIClone, because Snapshot is not possible: no VolumeSnapshotClass for the driver "other.diskpipe.test"`},
	} {
		d := newDiskVolume(ns, tc.disk, fromImage("", tc.image), tc.class, "")
		g.Expect(env.Client.Create(t.Context(), d)).To(Succeed())
		g.Expect(pvcOf(t, ns, tc.disk).Spec.DataSource).To(Equal(&tc.source), tc.disk)
		g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(condition(disk.ConditionCloneStrategy), Equal(tc.condition)), tc.disk)
	}
	snaps := &snapshotv1.VolumeSnapshotList{}
	g.Expect(env.Client.List(t.Context(), snaps, client.InNamespace(ns))).To(Succeed())
	g.Expect(snaps.Items).To(HaveLen(1), "one golden snapshot, of the shared image, serves both its disks")
	g.Expect(*snaps.Items[0].Spec.Source.PersistentVolumeClaimName).To(Equal("vmim-shared"))

	// A staging image (a DataVolume's) serves one disk: cloned, not snapshotted and restored.
	// Labelled as the CDI side makes it: from the start (a label added later may reach the
	// disk controller's cache after the disk does).
	staged := newImage(ns, "staged", classCSI)
	staged.Labels = map[string]string{goldenimage.LabelStaging: "true"}
	readyImageOf(t, staged, nil)
	st := newDiskVolume(ns, "st", fromImage("", "staged"), classCSI, "")
	g.Expect(env.Client.Create(t.Context(), st)).To(Succeed())
	g.Expect(pvcOf(t, ns, "st").Spec.DataSource).To(Equal(&corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "vmim-staged"}))

	// The golden snapshot failed (a snapshot class the storage cannot serve): later disks are
	// CSI clones, and say why; the disks made from it wait, as they asked.
	snap := &snaps.Items[0]
	snap.Status = &snapshotv1.VolumeSnapshotStatus{Error: &snapshotv1.VolumeSnapshotError{Message: ptr.To("no backup target")}}
	g.Expect(env.Client.Status().Update(t.Context(), snap)).To(Succeed())
	later := newDiskVolume(ns, "later", fromImage("", "shared"), classCSI, "")
	g.Expect(env.Client.Create(t.Context(), later)).To(Succeed())
	g.Expect(pvcOf(t, ns, "later").Spec.DataSource).To(Equal(&corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "vmim-shared"}))
	g.Eventually(diskStatus(t, later, &later.Status), 20*time.Second).Should(WithTransform(condition(disk.ConditionCloneStrategy),
		Equal("FellBack: CSIClone, because Snapshot is not possible: the image's golden VolumeSnapshot vmim-shared-golden failed: no backup target")))
}

// TestSnapshotClassAnnotation: a StorageClass's diskpipe.io/snapshot-class names the class of
// its images' golden snapshots (the driver's default is not taken); one that names a class of
// another driver leaves Snapshot impossible, and the condition says why.
func TestSnapshotClassAnnotation(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t)
	const picked = "picked.diskpipe.test" // a driver of its own: its default class is no other test's
	for name, isDefault := range map[string]string{"picked-default": "true", "picked-local": "false"} {
		g.Expect(env.Client.Create(ctx, &snapshotv1.VolumeSnapshotClass{ObjectMeta: metav1.ObjectMeta{Name: name,
			Annotations: map[string]string{"snapshot.storage.kubernetes.io/is-default-class": isDefault}},
			Driver: picked, DeletionPolicy: snapshotv1.VolumeSnapshotContentDelete})).To(Succeed())
	}
	for class, named := range map[string]string{"csi-picked": "picked-local", "csi-misnamed": snapClass} {
		g.Expect(env.Client.Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: class,
			Annotations: map[string]string{storage.AnnotationSnapshotClass: named}}, Provisioner: picked})).To(Succeed())
		readyImage(t, ns, class, class)
		d := newDiskVolume(ns, class, fromImage("", class), class, "")
		g.Expect(env.Client.Create(ctx, d)).To(Succeed())
		pvcOf(t, ns, class)
	}
	snap := &snapshotv1.VolumeSnapshot{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vmim-csi-picked-golden"}, snap)).To(Succeed())
	g.Expect(snap.Spec.VolumeSnapshotClassName).To(Equal(ptr.To("picked-local")), "the annotation's class, not the driver's default")
	d := &diskvolume.DiskVolume{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "csi-misnamed"}}
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(condition(disk.ConditionCloneStrategy), Equal(
		`FellBack: CSIClone, because Snapshot is not possible: the StorageClass csi-misnamed's annotation diskpipe.io/snapshot-class names the VolumeSnapshotClass "csi-snapshots", of the driver "csi.diskpipe.test", not "picked.diskpipe.test"`)))
	g.Expect(pvcOf(t, ns, "csi-misnamed").Spec.DataSource).To(Equal(&corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "vmim-csi-misnamed"}))
}

// TestInstallationDefaults: with neither the disk nor its class saying, the installation's
// per-class default (the chart's cloneStrategy.storageClasses) is preferred.
func TestInstallationDefaults(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ns := namespace(t)
	readyImage(t, ns, "alpine", classChart)
	d := newDiskVolume(ns, "d", fromImage("", "alpine"), classChart, "")
	g.Expect(env.Client.Create(t.Context(), d)).To(Succeed())
	g.Expect(pvcOf(t, ns, "d").Spec.DataSource.Kind).To(Equal("VolumeSnapshot"))
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(
		WithTransform(condition(disk.ConditionCloneStrategy), Equal("Preferred: Snapshot, as preferred")))
}

// TestMisnamedStrategy: a class's annotation that names no strategy is not read, and the disk's
// condition says so (the strategy is chosen as if it were not there).
func TestMisnamedStrategy(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t)
	g.Expect(env.Client.Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "csi-rsync",
		Annotations: map[string]string{disk.AnnotationCloneStrategy: "Rsync"}}, Provisioner: driver})).To(Succeed())
	readyImage(t, ns, "alpine", "csi-rsync")
	d := newDiskVolume(ns, "d", fromImage("", "alpine"), "csi-rsync", "")
	g.Expect(env.Client.Create(ctx, d)).To(Succeed())
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(condition(disk.ConditionCloneStrategy), HaveSuffix(
		`; the StorageClass csi-rsync's annotation diskpipe.io/clone-strategy, "Rsync", names none of [Automatic CSIClone Snapshot HostAssisted] and is not read`)))
}

// TestSnapshotNameTerminating: an image made again while its earlier self's golden snapshot is
// still being deleted. A disk of the default strategy clones the image's volume instead, and
// says why; one that asks for Snapshot waits for the name, says so, and is restored from the
// image's own snapshot once it is free.
func TestSnapshotNameTerminating(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t)
	old := &snapshotv1.VolumeSnapshot{ObjectMeta: metav1.ObjectMeta{Name: "vmim-again-golden", Namespace: ns, Finalizers: []string{"diskpipe.test/restoring"}},
		Spec: snapshotv1.VolumeSnapshotSpec{Source: snapshotv1.VolumeSnapshotSource{PersistentVolumeClaimName: ptr.To("vmim-again")}, VolumeSnapshotClassName: ptr.To(snapClass)}}
	g.Expect(env.Client.Create(ctx, old)).To(Succeed())
	g.Expect(env.Client.Delete(ctx, old)).To(Succeed())
	readyImage(t, ns, "again", classCSI)

	auto := newDiskVolume(ns, "auto", fromImage("", "again"), classCSI, "")
	g.Expect(env.Client.Create(ctx, auto)).To(Succeed())
	g.Eventually(diskStatus(t, auto, &auto.Status), 20*time.Second).Should(WithTransform(condition(disk.ConditionCloneStrategy), Equal(
		"FellBack: CSIClone, because Snapshot is not possible: the VolumeSnapshot vmim-again-golden, the name of the image's golden snapshot, is not the image's")))
	g.Expect(pvcOf(t, ns, "auto").Spec.DataSource.Kind).To(Equal("PersistentVolumeClaim"))

	asked := newDiskVolume(ns, "asked", fromImage("", "again"), classCSI, "")
	asked.Spec.CloneStrategy = ptr.To(common.CloneStrategySnapshot)
	g.Expect(env.Client.Create(ctx, asked)).To(Succeed())
	g.Eventually(diskStatus(t, asked, &asked.Status), 20*time.Second).Should(WithTransform(condition(common.ConditionReady), Equal(
		"NameTerminating: a VolumeSnapshot named vmim-again-golden, not made for this object (most often an earlier object's of the same name), is still being deleted: this object's is made once it is gone")))
	g.Expect(asked.Status.Phase).To(Equal(common.PhasePending))

	g.Expect(ctrltest.Update(ctx, env.Client, old, func() { old.Finalizers = nil })).To(Succeed())
	g.Expect(pvcOf(t, ns, "asked").Spec.DataSource).To(Equal(&corev1.TypedLocalObjectReference{APIGroup: ptr.To(snapshotv1.GroupName), Kind: "VolumeSnapshot", Name: "vmim-again-golden"}))
	snap := &snapshotv1.VolumeSnapshot{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vmim-again-golden"}, snap)).To(Succeed())
	g.Expect(snap.Labels[goldenimage.LabelImage]).NotTo(BeEmpty(), "the image's own snapshot")
}

// TestClaimNameTerminating: a disk made again while its earlier self's PVC is still being
// deleted (its VM's pod still uses it): bound, and marked as handed over by a prime. The disk
// is not made of it: it waits, says so, and fills a claim of its own once the name is free.
func TestClaimNameTerminating(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t)
	readyImage(t, ns, "debian", classCSI)
	old := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "again", Namespace: ns, Finalizers: []string{"diskpipe.test/in-use"},
		Annotations: map[string]string{disk.AnnotationPrime: "prime-of-the-earlier-disk"}},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: ptr.To(classOther),
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("4Gi")}}}}
	g.Expect(env.Client.Create(ctx, old)).To(Succeed())
	ctrltest.Bind(t, env, ns, "again")
	g.Expect(env.Client.Delete(ctx, old)).To(Succeed())

	d := newDiskVolume(ns, "again", fromImage("", "debian"), classOther, "4Gi")
	g.Expect(env.Client.Create(ctx, d)).To(Succeed())
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(condition(common.ConditionReady), Equal(
		"NameTerminating: a PersistentVolumeClaim named again, not made for this object (most often an earlier object's of the same name), is still being deleted: this object's is made once it is gone")))
	g.Expect(d.Status.Phase).To(Equal(common.PhasePending))

	// Its earlier self's importer pod still stops, too.
	oldPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "again-clone-0", Namespace: ns, Finalizers: []string{"diskpipe.test/stopping"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "importer", Image: "diskpipe:test"}}}}
	g.Expect(env.Client.Create(ctx, oldPod)).To(Succeed())
	g.Expect(env.Client.Delete(ctx, oldPod)).To(Succeed())

	g.Expect(ctrltest.Update(ctx, env.Client, old, func() { old.Finalizers = nil })).To(Succeed())
	g.Expect(pvcOf(t, ns, disk.PrimeName(d.UID)).Spec.DataSource).To(BeNil(), "a claim of its own, filled by a copy")
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(condition(common.ConditionReady), HavePrefix(
		"NameTerminating: a Pod named again-clone-0, not made for this object")))
	g.Expect(ctrltest.Update(ctx, env.Client, oldPod, func() { oldPod.Finalizers = nil })).To(Succeed())
	g.Eventually(func() bool {
		pod := &corev1.Pod{}
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "again-clone-0"}, pod) == nil && metav1.IsControlledBy(pod, d)
	}, 20*time.Second).Should(BeTrue(), "its own importer, once the name is free")
}

// TestFallback falls back to a host-assisted copy when the storage cannot clone, says why,
// and copies with an importer pod that mounts the golden PVC read-only.
func TestFallback(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ns := namespace(t)
	readyImage(t, ns, "debian", classCSI)
	d := newDiskVolume(ns, "other-class", fromImage("", "debian"), classOther, "4Gi")
	g.Expect(env.Client.Create(t.Context(), d)).To(Succeed())
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(condition(disk.ConditionCloneStrategy), Equal(
		`FellBack: HostAssisted, because CSIClone is not possible: the image's storage class is "csi" and the disk's "other"; `+
			`Snapshot is not possible: the image's driver is "csi.diskpipe.test" and the disk's "other.diskpipe.test"`)))
	pvc := pvcOf(t, ns, disk.PrimeName(d.UID))
	g.Expect(pvc.Spec.DataSource).To(BeNil())
	ctrltest.Bind(t, env, ns, pvc.Name)

	pod := ctrltest.Pod(t, env, ns, "other-class-clone-0")
	args := strings.Join(pod.Spec.Containers[0].Args, " ")
	g.Expect(args).To(ContainSubstring("--source file --path /source/disk.img"))
	g.Expect(args).To(ContainSubstring("--grow"))
	g.Expect(args).To(ContainSubstring("--target /data/disk.img --overhead 0.06 --capacity 4294967296"))
	var source *corev1.PersistentVolumeClaimVolumeSource
	for _, v := range pod.Spec.Volumes {
		if v.Name == "source" {
			source = v.PersistentVolumeClaim
		}
	}
	g.Expect(source).To(Equal(&corev1.PersistentVolumeClaimVolumeSource{ClaimName: "vmim-debian", ReadOnly: true}))
	g.Expect(pod.Spec.Containers[0].VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "source", MountPath: "/source", ReadOnly: true}))

	// A transient failure is retried as a new pod; then the copy succeeds.
	ctrltest.Kubelet(t, env, ns, "other-class-clone-0", corev1.PodFailed,
		&transfer.Result{Reason: transfer.ReasonSourceUnavailable, Transient: true, Message: "read error"}, 3)
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(condition(common.ConditionReady), HavePrefix("Retrying")))
	ctrltest.Fill(t, env, ns, pvc.Name, "other-class-clone-1", "other-class", transfer.Result{Format: "raw", VirtualSize: 4037017600, DurationSeconds: 3})
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(phase, Equal(common.PhaseReady)))
	g.Expect(d.Status.Retries).To(Equal(int32(1)))
	g.Expect(d.Status.VirtualSize.Value()).To(Equal(int64(4037017600)))

	// A block disk from a filesystem image cannot be a storage clone either.
	blk := newDiskVolume(ns, "block", fromImage("", "debian"), classCSI, "")
	blk.Spec.VolumeMode = ptr.To(corev1.PersistentVolumeBlock)
	g.Expect(env.Client.Create(t.Context(), blk)).To(Succeed())
	pod = ctrltest.Pod(t, env, ns, "block-clone-0")
	g.Expect(strings.Join(pod.Spec.Containers[0].Args, " ")).To(ContainSubstring("--target /dev/diskpipe-target"))
	g.Eventually(diskStatus(t, blk, &blk.Status), 20*time.Second).Should(WithTransform(condition(disk.ConditionCloneStrategy),
		ContainSubstring("Filesystem volume and the disk a Block volume")))

	// A permanent failure ends the disk, and the clone no longer holds the image.
	ctrltest.Kubelet(t, env, ns, "block-clone-0", corev1.PodFailed,
		&transfer.Result{Reason: transfer.ReasonTooLarge, Message: "the image's virtual size 2.0 GiB is larger than the block device (1.0 GiB)"}, 1)
	g.Eventually(diskStatus(t, blk, &blk.Status), 20*time.Second).Should(WithTransform(phase, Equal(common.PhaseFailed)))
	g.Expect(condition(common.ConditionReady)(&blk.Status)).To(HavePrefix("TooLarge: "))
	g.Eventually(func() map[string]string { return pvcOf(t, ns, disk.PrimeName(blk.UID)).Labels }, 20*time.Second).ShouldNot(HaveKey(goldenimage.LabelCloneOf))
}

// TestCrossNamespace copies an image of another namespace: a clone-source pod there serves
// the golden PVC to the importer in the disk's namespace, with a token only the two hold;
// both go when the disk is made.
func TestCrossNamespace(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	images, ns := namespace(t), namespace(t)
	readyImage(t, images, "centos", classCSI)
	d := newDiskVolume(ns, "centos-disk", fromImage(images, "centos"), classCSI, "")
	g.Expect(env.Client.Create(t.Context(), d)).To(Succeed())
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(condition(disk.ConditionCloneStrategy),
		ContainSubstring("FellBack: HostAssisted, because CSIClone is not possible: the image is in namespace "+images)))
	g.Expect(d.Finalizers).To(ContainElement(disk.Finalizer))

	// Its clone source starts once the disk's volume is bound (its class binds at once).
	serveName := "clone-source-" + string(d.UID)
	g.Consistently(func() error {
		return env.Client.Get(t.Context(), client.ObjectKey{Namespace: images, Name: serveName}, &corev1.Pod{})
	}, time.Second).ShouldNot(Succeed())
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(condition(common.ConditionReady),
		Equal("WaitingForCloneSource: the copy's volume "+disk.PrimeName(d.UID)+" (storage class "+classCSI+") is not bound yet: its clone source starts when it is")))
	ctrltest.Bind(t, env, ns, disk.PrimeName(d.UID))
	serve := ctrltest.Pod(t, env, images, serveName)
	g.Expect(serve.Annotations).To(HaveKeyWithValue(hostcopy.AnnotationCopy, "DiskVolume/"+ns+"/centos-disk"))
	args := strings.Join(serve.Spec.Containers[0].Args, " ")
	g.Expect(args).To(ContainSubstring("--serve :8091 --path /source/disk.img --token-file /var/run/diskpipe/clone/token " +
		"--tls-cert-file /var/run/diskpipe/clone/tls.crt --tls-key-file /var/run/diskpipe/clone/tls.key"))
	srcToken := &corev1.Secret{}
	g.Expect(env.Client.Get(t.Context(), client.ObjectKey{Namespace: images, Name: "clone-serve-" + string(d.UID)}, srcToken)).To(Succeed())
	g.Expect(srcToken.Data["token"]).To(HaveLen(64))
	g.Expect(srcToken.Data).To(HaveKey("tls.key"), "the clone source holds its key")

	// The importer starts once the source serves.
	g.Consistently(func() error {
		return env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "centos-disk-clone-0"}, &corev1.Pod{})
	}, time.Second).ShouldNot(Succeed())
	ctrltest.Kubelet(t, env, images, serveName, corev1.PodRunning, nil, 0)
	pod := ctrltest.Pod(t, env, ns, "centos-disk-clone-0")
	args = strings.Join(pod.Spec.Containers[0].Args, " ")
	g.Expect(args).To(ContainSubstring("--source http --format raw --url https://127.0.0.1:8091/disk --ca-file /var/run/diskpipe/clone/ca.crt " +
		"--tls-server-name clone-source.diskpipe.invalid --header-file /var/run/diskpipe/clone/header --extents-url https://127.0.0.1:8091/extents"))
	myToken := &corev1.Secret{}
	g.Expect(env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "clone-trust-" + string(d.UID)}, myToken)).To(Succeed())
	g.Expect(string(myToken.Data["header"])).To(Equal("Authorization: Bearer " + string(srcToken.Data["token"])))
	g.Expect(metav1.IsControlledBy(myToken, d)).To(BeTrue())
	g.Expect(myToken.Data).To(HaveKey("ca.crt"), "the importer trusts the copy's own CA")
	g.Expect(myToken.Data).NotTo(HaveKey("tls.key"))

	ctrltest.Fill(t, env, ns, disk.PrimeName(d.UID), "centos-disk-clone-0", "centos-disk", transfer.Result{Format: "raw", VirtualSize: 2018508800,
		BytesRead: 1 << 30, FirstByteSeconds: 0.2, LastByteSeconds: 4.2, FlushedSeconds: 4.5})
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(phase, Equal(common.PhaseReady)))
	// Where the copy's time went is told.
	g.Eventually(func() string {
		list := &eventsv1.EventList{}
		g.Expect(env.Client.List(t.Context(), list, client.InNamespace(ns))).To(Succeed())
		for _, e := range list.Items {
			if e.Regarding.UID == d.UID && e.Reason == importpod.ReasonTimeline {
				return e.Note
			}
		}
		return ""
	}, 20*time.Second).Should(MatchRegexp(`^Clone of pod centos-disk-clone-0: pod made, running \+[0-9.]+s, first byte \+[0-9.]+s, last byte \+[0-9.]+s, flushed \+[0-9.]+s, result read \+[0-9.]+s; 1073741824 bytes read at 268 MB/s$`))
	g.Eventually(func() bool {
		return apierrors.IsNotFound(env.Client.Get(t.Context(), client.ObjectKey{Namespace: images, Name: serveName}, &corev1.Pod{})) &&
			apierrors.IsNotFound(env.Client.Get(t.Context(), client.ObjectKey{Namespace: images, Name: "clone-serve-" + string(d.UID)}, &corev1.Secret{}))
	}, 20*time.Second).Should(BeTrue(), "the clone source is removed")

	// Deleting a disk mid-copy removes its clone source too.
	mid := newDiskVolume(ns, "mid", fromImage(images, "centos"), classCSI, "")
	g.Expect(env.Client.Create(t.Context(), mid)).To(Succeed())
	g.Eventually(diskStatus(t, mid, &mid.Status), 20*time.Second).Should(WithTransform(func(st *common.DiskStatus) string { return string(st.CloneStrategy) }, Equal("HostAssisted")))
	midSource := "clone-source-" + string(mid.UID)
	ctrltest.Bind(t, env, ns, disk.PrimeName(mid.UID))
	ctrltest.Pod(t, env, images, midSource)
	g.Expect(env.Client.Delete(t.Context(), mid)).To(Succeed())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(env.Client.Get(t.Context(), client.ObjectKey{Namespace: images, Name: midSource}, &corev1.Pod{})) &&
			apierrors.IsNotFound(env.Client.Get(t.Context(), client.ObjectKeyFromObject(mid), mid))
	}, 20*time.Second).Should(BeTrue())
}

// TestBlankAndSnapshotDisks makes a blank disk (sparse disk.img of the volume's usable size)
// and a disk restored from a user's VolumeSnapshot.
func TestBlankAndSnapshotDisks(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ns := namespace(t)
	blank := newDiskVolume(ns, "data", diskvolume.DiskVolumeSource{Blank: &common.BlankSource{}}, "", "20Gi")
	g.Expect(env.Client.Create(t.Context(), blank)).To(Succeed())
	pod := ctrltest.Pod(t, env, ns, "data-blank-0")
	g.Expect(strings.Join(pod.Spec.Containers[0].Args, " ")).To(ContainSubstring("--source blank --grow --metrics-addr :"))
	g.Expect(pvcOf(t, ns, disk.PrimeName(blank.UID)).Spec.DataSource).To(BeNil())
	ctrltest.Fill(t, env, ns, disk.PrimeName(blank.UID), "data-blank-0", "data", transfer.Result{Format: "raw", VirtualSize: 20185088000})
	g.Eventually(diskStatus(t, blank, &blank.Status), 20*time.Second).Should(WithTransform(phase, Equal(common.PhaseReady)))
	g.Expect(condition(common.ConditionReady)(&blank.Status)).To(HavePrefix("Made: blank"))

	snap := &snapshotv1.VolumeSnapshot{ObjectMeta: metav1.ObjectMeta{Name: "backup", Namespace: ns},
		Spec: snapshotv1.VolumeSnapshotSpec{Source: snapshotv1.VolumeSnapshotSource{PersistentVolumeClaimName: ptr.To("data")}}}
	restored := newDiskVolume(ns, "restored", diskvolume.DiskVolumeSource{Snap: &diskvolume.SnapshotSource{Name: "backup"}}, "", "")
	g.Expect(env.Client.Create(t.Context(), restored)).To(Succeed())
	g.Eventually(diskStatus(t, restored, &restored.Status), 20*time.Second).Should(WithTransform(condition(common.ConditionReady),
		Equal("SnapshotNotFound: the VolumeSnapshot backup does not exist")))
	g.Expect(env.Client.Create(t.Context(), snap)).To(Succeed())
	snap.Status = &snapshotv1.VolumeSnapshotStatus{ReadyToUse: ptr.To(true), RestoreSize: ctrltest.Quantity("20Gi")}
	g.Expect(env.Client.Status().Update(t.Context(), snap)).To(Succeed())
	// The snapshot wakes the disk that waits for it.
	pvc := &corev1.PersistentVolumeClaim{}
	g.Eventually(func() error {
		return env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "restored"}, pvc)
	}, 10*time.Second).Should(Succeed())
	g.Expect(pvc.Spec.DataSource.Kind).To(Equal("VolumeSnapshot"))
	g.Expect(pvc.Spec.Resources.Requests.Storage().String()).To(Equal("20Gi"), "the snapshot's restore size")
}

// TestWaitForFirstConsumer: on a class that binds at the first consumer a cloned disk is
// Ready at once (the VM's pod is that consumer); a disk that needs a grow pod waits for it.
func TestWaitForFirstConsumer(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ns := namespace(t)
	readyImage(t, ns, "wffc", classWFFC)
	d := newDiskVolume(ns, "lazy", fromImage("", "wffc"), classWFFC, "")
	g.Expect(env.Client.Create(t.Context(), d)).To(Succeed())
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(phase, Equal(common.PhaseReady)))
	g.Expect(condition(common.ConditionReady)(&d.Status)).To(HavePrefix("WaitingForFirstConsumer: "))
	g.Expect(d.Status.Capacity).To(BeNil())
	ctrltest.Bind(t, env, ns, "lazy") // the VM's pod was scheduled
	// The bound size is noted when the disk is next reconciled (the PVC is its child).
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(func(st *common.DiskStatus) string {
		if st.Capacity == nil {
			return ""
		}
		return st.Capacity.String()
	}, Equal(goldenSize)))

	// A disk a pod would fill now (grown past the image; blank) would be bound on the node that
	// pod ran on, and its VM pinned there: it waits for its VM's node too, and is filled there
	// (TestDeferredToConsumer).
	big := newDiskVolume(ns, "big", fromImage("", "wffc"), classWFFC, "8Gi")
	blank := newDiskVolume(ns, "empty", diskvolume.DiskVolumeSource{Blank: &common.BlankSource{}}, classWFFC, "1Gi")
	for _, v := range []*diskvolume.DiskVolume{big, blank} {
		g.Expect(env.Client.Create(t.Context(), v)).To(Succeed())
		g.Eventually(diskStatus(t, v, &v.Status), 20*time.Second).Should(WithTransform(condition(common.ConditionReady), HavePrefix("WaitingForFirstConsumer: ")), v.Name)
		g.Expect(pvcOf(t, ns, v.Name).Spec.DataSourceRef.Kind).To(Equal("DiskVolume"), v.Name)
		pods := &corev1.PodList{}
		g.Expect(env.Client.List(t.Context(), pods, client.InNamespace(ns), client.MatchingLabels{disk.LabelDisk: string(v.UID)})).To(Succeed())
		g.Expect(pods.Items).To(BeEmpty(), "no pod fills %s before its VM's node is known", v.Name)
	}
	g.Expect(condition(common.ConditionReady)(&blank.Status)).To(Equal("WaitingForFirstConsumer: made blank on the node its VM's pod is scheduled to, " +
		"which it would be pinned to were it made now (WaitForFirstConsumer)"))
	// Asked to be bound now, it is filled now.
	now := newDiskVolume(ns, "now", diskvolume.DiskVolumeSource{Blank: &common.BlankSource{}}, classWFFC, "1Gi")
	now.Annotations = map[string]string{disk.AnnotationBindImmediately: "true"}
	g.Expect(env.Client.Create(t.Context(), now)).To(Succeed())
	ctrltest.Pod(t, env, ns, "now-blank-0")
	// Deferral is decided once: the annotation removed mid-fill does not defer the disk, whose
	// fill goes on.
	g.Expect(env.Client.Get(t.Context(), client.ObjectKeyFromObject(now), now)).To(Succeed())
	base := now.DeepCopy()
	now.Annotations = nil
	g.Expect(env.Client.Patch(t.Context(), now, client.MergeFrom(base))).To(Succeed()) // no lock: the controller writes it meanwhile
	g.Consistently(diskStatus(t, now, &now.Status), 3*time.Second).Should(WithTransform(condition(common.ConditionReady), Not(HavePrefix("WaitingForFirstConsumer"))))
	claim := &corev1.PersistentVolumeClaim{}
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "now"}, claim); err == nil {
		g.Expect(claim.Spec.DataSourceRef).To(BeNil(), "not deferred midway")
	}
}

// TestWaitsForImage: a disk made before its image is Ready waits, and goes on as soon as the
// image is Ready.
func TestWaitsForImage(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ns := namespace(t)
	d := newDiskVolume(ns, "early", fromImage("", "late"), classCSI, "")
	g.Expect(env.Client.Create(t.Context(), d)).To(Succeed())
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(condition(common.ConditionReady),
		Equal("SourceNotFound: the VirtualMachineImage "+ns+"/late does not exist")))
	g.Expect(d.Status.Phase).To(Equal(common.PhasePending))
	start := time.Now()
	readyImage(t, ns, "late", classCSI)
	pvcOf(t, ns, "early")
	g.Expect(time.Since(start)).To(BeNumerically("<", 15*time.Second), "woken by the image, not by a periodic retry")
}

// TestImageDeletionWaitsForClones: an image being cloned is deleted only when the clone is
// made; then its golden PVC and snapshot go with it.
func TestImageDeletionWaitsForClones(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ns := namespace(t)
	vmi := readyImage(t, ns, "arch", classCSI)
	d := newDiskVolume(ns, "arch-disk", fromImage("", "arch"), classCSI, "")
	g.Expect(env.Client.Create(t.Context(), d)).To(Succeed())
	pvcOf(t, ns, "arch-disk")
	g.Expect(env.Client.Delete(t.Context(), vmi)).To(Succeed())
	g.Eventually(func() string {
		_ = env.Client.Get(t.Context(), client.ObjectKeyFromObject(vmi), vmi)
		return string(vmi.Status.Phase)
	}, 20*time.Second).Should(Equal("Deleting"))
	g.Expect(meta.FindStatusCondition(vmi.Status.Conditions, common.ConditionReady).Message).To(
		Equal("1 disks are being cloned from this image (first: " + ns + "/arch-disk); it is deleted when they are made"))
	g.Expect(env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "vmim-arch"}, &corev1.PersistentVolumeClaim{})).To(Succeed())

	ctrltest.Bind(t, env, ns, "arch-disk")
	g.Eventually(func() bool {
		return apierrors.IsNotFound(env.Client.Get(t.Context(), client.ObjectKeyFromObject(vmi), vmi))
	},
		20*time.Second).Should(BeTrue())
	golden := &corev1.PersistentVolumeClaim{}
	err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "vmim-arch"}, golden)
	g.Expect(apierrors.IsNotFound(err) || !golden.DeletionTimestamp.IsZero()).To(BeTrue(), "the golden PVC is deleted")
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(phase, Equal(common.PhaseReady)))
}
