package disk_test

// The populator's disks are DiskVolumes: its test runs on this suite's control plane and
// manager (controllers/populator).

import (
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/disk"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/ctrltest"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
	"github.com/diskpipe/diskpipe/controllers/populator"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// TestPopulator fills a plain PVC whose dataSourceRef names a VirtualMachineImage: a
// DiskVolume of the claim's shape is made, its volume handed to the claim (this test plays
// the PV controller's part, binding), and the DiskVolume removed; the claim's events tell it.
func TestPopulator(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ns := namespace(t)
	readyImage(t, ns, "fedora", classCSI)

	claim := imageClaim(ns, "fedora", classCSI, "10Gi")
	g.Expect(env.Client.Create(t.Context(), claim)).To(Succeed())
	name := "populate-" + string(claim.UID)

	d := &diskvolume.DiskVolume{}
	g.Eventually(func() error { return env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, d) }, 20*time.Second).Should(Succeed())
	g.Expect(d.Spec.Source.Image).To(Equal(&diskvolume.ImageSource{Name: "fedora", Kind: diskvolume.ImageKindVirtualMachineImage}))
	g.Expect(d.Spec.Resources.Requests.Storage.String()).To(Equal("10Gi"))
	g.Expect(*d.Spec.StorageClassName).To(Equal(classCSI))
	g.Expect(metav1.IsControlledBy(d, claim)).To(BeTrue(), "the claim owns it: deleting the claim takes it")

	// The DiskVolume's PVC is made as any disk's: on shared storage with a snapshot class,
	// restored from the image's golden snapshot, then grown.
	fill := pvcOf(t, ns, disk.PrimeName(d.UID))
	g.Expect(fill.Spec.DataSource).To(Equal(&corev1.TypedLocalObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: "vmim-fedora-golden"}))
	ctrltest.Fill(t, env, ns, fill.Name, name+"-grow-0", name, transfer.Result{Format: "raw", VirtualSize: 10090985472})
	pv := &corev1.PersistentVolume{}
	g.Expect(env.Client.Get(t.Context(), client.ObjectKey{Name: pvcOf(t, ns, name).Spec.VolumeName}, pv)).To(Succeed())

	// Once the disk is Ready, its volume is pointed at the claim.
	g.Eventually(func() claimRef {
		_ = env.Client.Get(t.Context(), client.ObjectKeyFromObject(pv), pv)
		if pv.Spec.ClaimRef == nil {
			return claimRef{}
		}
		return claimRef{pv.Spec.ClaimRef.Name, string(pv.Spec.ClaimRef.UID)}
	}, 20*time.Second).Should(Equal(claimRef{"root", string(claim.UID)}))

	// The PV controller binds the claim; the DiskVolume goes.
	g.Expect(env.Client.Get(t.Context(), client.ObjectKeyFromObject(claim), claim)).To(Succeed())
	claim.Spec.VolumeName = pv.Name
	g.Expect(env.Client.Update(t.Context(), claim)).To(Succeed())
	g.Eventually(func() bool {
		err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(d), d)
		return client.IgnoreNotFound(err) == nil && (err != nil || !d.DeletionTimestamp.IsZero())
	}, 20*time.Second).Should(BeTrue(), "the DiskVolume is deleted once the claim is bound")

	g.Eventually(func() []string { return eventReasons(t, ns, claim.UID) }, 20*time.Second).
		Should(ContainElements(populator.ReasonPopulating, populator.ReasonPopulated))
}

// TestPopulatorFailure tells a claim whose image does not import why it stays Pending.
func TestPopulatorFailure(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ns := namespace(t)
	vmi := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "broken", Namespace: ns},
		Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{HTTP: "https://images.example.com/broken.qcow2"}}}
	vmi.Spec.Resources.Requests.Storage = ctrltest.Quantity(goldenSize)
	vmi.Spec.StorageClassName = ptr.To(classCSI)
	vmi.Spec.Retry = ptr.To(common.RetryLimit(0))
	g.Expect(env.Client.Create(t.Context(), vmi)).To(Succeed())
	ctrltest.Bind(t, env, ns, "vmim-broken")
	ctrltest.Kubelet(t, env, ns, "vmim-broken-import-0", corev1.PodFailed,
		&transfer.Result{Reason: transfer.ReasonSourceNotFound, Message: "404 Not Found"}, 1)

	claim := imageClaim(ns, "broken", "", "4Gi")
	g.Expect(env.Client.Create(t.Context(), claim)).To(Succeed())
	g.Eventually(func() []string { return eventReasons(t, ns, claim.UID) }, 30*time.Second).Should(ContainElement(populator.ReasonPopulateFailed), func() string {
		d := &diskvolume.DiskVolume{}
		_ = env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "populate-" + string(claim.UID)}, d)
		_ = env.Client.Get(t.Context(), client.ObjectKeyFromObject(vmi), vmi)
		return fmt.Sprintf("disk %+v\nimage %+v", d.Status, vmi.Status)
	})
	g.Expect(claim.Spec.VolumeName).To(BeEmpty())
}

type claimRef struct{ name, uid string }

// imageClaim is a ReadWriteOnce PVC "root" of class (empty: the default) and size whose
// dataSourceRef names the VirtualMachineImage image.
func imageClaim(ns, image, class, size string) *corev1.PersistentVolumeClaim {
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "root", Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:     corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
			DataSourceRef: &corev1.TypedObjectReference{APIGroup: ptr.To(hypercloud.GroupVersion.Group), Kind: "VirtualMachineImage", Name: image},
		}}
	if class != "" {
		claim.Spec.StorageClassName = &class
	}
	return claim
}

// eventReasons are the reasons of the events about the object of that UID.
func eventReasons(t *testing.T, ns string, uid k8stypes.UID) []string {
	t.Helper()
	list := &eventsv1.EventList{}
	if err := env.Client.List(t.Context(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var reasons []string
	for _, e := range list.Items {
		if e.Regarding.UID == uid {
			reasons = append(reasons, e.Reason)
		}
	}
	return reasons
}

// TestPopulatorWaitsForFirstConsumer fills a claim of a class that binds on first consumer
// only once the scheduler has chosen a node for it, and has the disk provisioned there.
func TestPopulatorWaitsForFirstConsumer(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ns := namespace(t)
	readyImage(t, ns, "alpine", classWFFC)
	claim := imageClaim(ns, "alpine", classWFFC, goldenSize)
	g.Expect(env.Client.Create(t.Context(), claim)).To(Succeed())
	name := "populate-" + string(claim.UID)
	g.Eventually(func() []string { return eventReasons(t, ns, claim.UID) }, 20*time.Second).Should(ContainElement(populator.ReasonPopulating))
	d := &diskvolume.DiskVolume{}
	g.Consistently(func() error { return env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, d) }, 2*time.Second).
		ShouldNot(Succeed(), "no disk before a pod uses the claim")

	// The scheduler placed the claim's first pod.
	g.Expect(env.Client.Get(t.Context(), client.ObjectKeyFromObject(claim), claim)).To(Succeed())
	metav1.SetMetaDataAnnotation(&claim.ObjectMeta, storage.AnnotationSelectedNode, "node-a")
	g.Expect(env.Client.Update(t.Context(), claim)).To(Succeed())
	g.Eventually(func() error { return env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, d) }, 20*time.Second).Should(Succeed())
	prime := pvcOf(t, ns, disk.PrimeName(d.UID)) // grown to the claim's size by a pod, so filled in a prime
	g.Expect(prime.Annotations).To(HaveKeyWithValue(storage.AnnotationSelectedNode, "node-a"), "provisioned where the claim's pod runs")
}

// TestDeferredToConsumer: a disk of a node-local image, on a class that binds at the first
// consumer, waits for its VM's node: it is Ready (the VM may start), its PVC names the disk as
// its data source, which no CSI driver fills, and once the scheduler has chosen the node the
// populator fills the PVC there as the disk says. A claim that names a disk it was not made by
// is not filled, and says why. An image whose volume reaches every node is cloned at once
// (TestWaitForFirstConsumer).
func TestDeferredToConsumer(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ns := namespace(t)
	for _, n := range []string{"deferred-a", "deferred-b"} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{corev1.LabelHostname: n}}}
		if err := env.Client.Create(t.Context(), node); client.IgnoreAlreadyExists(err) != nil {
			t.Fatal(err)
		}
	}
	golden := readyImageWith(t, ns, "local", classWFFC, ctrltest.OnNode("deferred-a"))
	d := newDiskVolume(ns, "roaming", fromImage("", "local"), classWFFC, "")
	d.Annotations = map[string]string{"transfer.diskpipe.io/priority-class": "imports-low"}
	g.Expect(env.Client.Create(t.Context(), d)).To(Succeed())
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(phase, Equal(common.PhaseReady)))
	g.Expect(condition(common.ConditionReady)(&d.Status)).To(Equal("WaitingForFirstConsumer: made on the node its VM's pod is scheduled to, " +
		"from the image's node-local volume: cloned there, or copied once to that node as the image's replica and cloned from it (WaitForFirstConsumer)"))
	claim := pvcOf(t, ns, "roaming")
	g.Expect(claim.Spec.DataSource.Kind).To(Equal("DiskVolume"), "no CSI clone of the image, which only its node could make (the apiserver mirrors the ref)")
	g.Expect(claim.Spec.DataSourceRef).To(Equal(&corev1.TypedObjectReference{APIGroup: ptr.To(diskvolume.GroupVersion.Group), Kind: "DiskVolume", Name: "roaming"}))
	name := "populate-" + string(claim.UID)
	inner := &diskvolume.DiskVolume{}
	g.Consistently(func() error { return env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, inner) }, 2*time.Second).
		ShouldNot(Succeed(), "nothing is made before the VM's node is known")

	// The scheduler put the VM on the node the image is not on: the claim is filled there, as
	// the disk says.
	metav1.SetMetaDataAnnotation(&claim.ObjectMeta, storage.AnnotationSelectedNode, "deferred-b")
	g.Expect(env.Client.Update(t.Context(), claim)).To(Succeed())
	g.Eventually(func() error { return env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, inner) }, 20*time.Second).Should(Succeed())
	g.Expect(inner.Annotations).To(HaveKeyWithValue(storage.AnnotationSelectedNode, "deferred-b"))
	g.Expect(inner.Annotations).To(HaveKeyWithValue("transfer.diskpipe.io/priority-class", "imports-low"), "its pods as the disk's would be")
	g.Expect(inner.Spec.Source).To(Equal(d.Spec.Source))
	g.Expect(*inner.Spec.StorageClassName).To(Equal(classWFFC))
	g.Expect(inner.Spec.Resources.Requests.Storage.String()).To(Equal(goldenSize), "the claim's size")
	g.Expect(metav1.IsControlledBy(inner, claim)).To(BeTrue())
	// There it is made from the image's replica on that node, copied once.
	g.Eventually(diskStatus(t, inner, &inner.Status), 20*time.Second).Should(WithTransform(condition(common.ConditionReady), HavePrefix("WaitingForReplica: ")))
	replicas := &diskvolume.DiskVolumeList{}
	g.Expect(env.Client.List(t.Context(), replicas, client.InNamespace(ns), client.MatchingLabels{goldenimage.LabelReplicaOf: string(golden.UID)})).To(Succeed())
	g.Expect(replicas.Items).To(HaveLen(1))
	g.Expect(replicas.Items[0].Annotations).To(HaveKeyWithValue(storage.AnnotationSelectedNode, "deferred-b"))

	// Should the fill there fail for good, the disk that said Ready fails, saying why: the VM's
	// claim would otherwise wait for ever.
	g.Expect(env.Client.Get(t.Context(), client.ObjectKeyFromObject(inner), inner)).To(Succeed())
	failed := inner.DeepCopy()
	inner.Status.Phase = common.PhaseFailed
	meta.SetStatusCondition(&inner.Status.Conditions, metav1.Condition{Type: common.ConditionReady, Status: metav1.ConditionFalse,
		Reason: "ImportFailed", Message: "the node's disk is full"})
	g.Expect(env.Client.Status().Patch(t.Context(), inner, client.MergeFrom(failed))).To(Succeed()) // no lock: its controller writes it meanwhile
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(phase, Equal(common.PhaseFailed)))
	g.Expect(condition(common.ConditionReady)(&d.Status)).To(Equal(fmt.Sprintf("ImportFailed: filling PVC roaming on node deferred-b, where its VM's pod "+
		"was scheduled, failed (DiskVolume %s): the node's disk is full", name)))

	// So does a disk that a pod would fill, were it made now: grown past the image, or copied
	// by the host. That pod would pin it to the node it ran on.
	grown := newDiskVolume(ns, "grown", fromImage("", "local"), classWFFC, "4Gi")
	copied := newDiskVolume(ns, "copied", fromImage("", "local"), classWFFC, "")
	copied.Spec.CloneStrategy = ptr.To(common.CloneStrategyHostAssisted)
	for _, v := range []*diskvolume.DiskVolume{grown, copied} {
		g.Expect(env.Client.Create(t.Context(), v)).To(Succeed())
		g.Eventually(diskStatus(t, v, &v.Status), 20*time.Second).Should(WithTransform(condition(common.ConditionReady), HavePrefix("WaitingForFirstConsumer: ")), v.Name)
		c := pvcOf(t, ns, v.Name)
		g.Expect(c.Spec.DataSourceRef).To(Equal(&corev1.TypedObjectReference{APIGroup: ptr.To(diskvolume.GroupVersion.Group), Kind: "DiskVolume", Name: v.Name}), v.Name)
		pods := &corev1.PodList{}
		g.Expect(env.Client.List(t.Context(), pods, client.InNamespace(ns), client.MatchingLabels{disk.LabelDisk: string(v.UID)})).To(Succeed())
		g.Expect(pods.Items).To(BeEmpty(), "no pod fills %s before its VM's node is known", v.Name)
	}

	// A claim that names the disk but was not made by it is not filled from it.
	forged := imageClaim(ns, "", classWFFC, goldenSize)
	forged.Name, forged.Annotations = "forged", map[string]string{storage.AnnotationSelectedNode: "deferred-b"}
	forged.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: ptr.To(diskvolume.GroupVersion.Group), Kind: "DiskVolume", Name: "roaming"}
	g.Expect(env.Client.Create(t.Context(), forged)).To(Succeed())
	g.Eventually(func() []string { return eventReasons(t, ns, forged.UID) }, 20*time.Second).Should(ContainElement("PopulateUnsupported"))
	g.Expect(env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "populate-" + string(forged.UID)}, &diskvolume.DiskVolume{})).NotTo(Succeed())
	// Nor one that names the disk as its controller: an owner reference is anyone's to write.
	owner := imageClaim(ns, "", classWFFC, goldenSize)
	owner.Name, owner.Annotations = "forged-owner", map[string]string{storage.AnnotationSelectedNode: "deferred-b"}
	owner.Spec.DataSourceRef = forged.Spec.DataSourceRef
	owner.OwnerReferences = []metav1.OwnerReference{{APIVersion: diskvolume.GroupVersion.String(), Kind: "DiskVolume", Name: "roaming", UID: d.UID, Controller: ptr.To(true)}}
	g.Expect(env.Client.Create(t.Context(), owner)).To(Succeed())
	g.Eventually(func() []string { return eventReasons(t, ns, owner.UID) }, 20*time.Second).Should(ContainElement("PopulateUnsupported"))
	g.Expect(env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "populate-" + string(owner.UID)}, &diskvolume.DiskVolume{})).NotTo(Succeed())
}
