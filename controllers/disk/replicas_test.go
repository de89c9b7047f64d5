package disk_test

import (
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/disk"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/image"
	"github.com/diskpipe/diskpipe/controllers/internal/ctrltest"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// TestReplicaPolicy: a node-local image's spec.replicas pre-warms the nodes its selector
// matches (a replica each, made once the image is Ready, none on the image's own node), and
// deletes a replica of another node no disk was made from for evictAfter; a pre-warmed node
// keeps its replica however old.
func TestReplicaPolicy(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t)
	for name, pool := range map[string]string{"policy-home": "warm", "policy-warm": "warm", "policy-cold": "cold"} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name, "pool": pool}}}
		g.Expect(client.IgnoreAlreadyExists(env.Client.Create(ctx, node))).To(Succeed())
	}
	vmi := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "warmed", Namespace: ns},
		Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{HTTP: common.HTTPURL("https://images.example.com/warmed.qcow2")},
			Replicas: &common.ReplicaPolicy{NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "warm"}},
				EvictAfter: &metav1.Duration{Duration: time.Hour}}}}
	vmi.Spec.Resources.Requests.Storage = ctrltest.Quantity(goldenSize)
	vmi.Spec.StorageClassName = ptr.To(classWFFC)
	g.Expect(env.Client.Create(ctx, vmi)).To(Succeed())
	ctrltest.BindWith(t, env, ns, "vmim-warmed", ctrltest.OnNode("policy-home"))
	replicas := func() map[string]string {
		list := &diskvolume.DiskVolumeList{}
		g.Expect(env.Client.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{goldenimage.LabelReplicaOf: string(vmi.UID)})).To(Succeed())
		out := map[string]string{}
		for _, d := range list.Items {
			if d.DeletionTimestamp.IsZero() {
				out[d.Annotations[storage.AnnotationSelectedNode]] = d.Name
			}
		}
		return out
	}
	g.Consistently(replicas, 2*time.Second).Should(BeEmpty(), "nothing is warmed before the image is Ready")
	ctrltest.Complete(t, env, ns, "vmim-warmed-import-0", transfer.Result{Format: "qcow2", VirtualSize: 1 << 30})
	g.Eventually(replicas, 20*time.Second).Should(HaveKey("policy-warm"))
	g.Expect(replicas()).NotTo(HaveKey("policy-home"), "the image's own node has its volume")
	g.Expect(replicas()).NotTo(HaveKey("policy-cold"), "a node the selector does not match is not warmed")
	warm := &diskvolume.DiskVolume{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: replicas()["policy-warm"]}, warm)).To(Succeed())
	g.Expect(metav1.IsControlledBy(warm, vmi)).To(BeTrue())

	// A replica is read-only as its image is, known by its name: its labels, annotations and
	// marks, which the namespace may strip, do not matter; nor does a pod naming a replica
	// that is still to be made get in first. A name of the form with another hash is no
	// replica.
	admin, err := env.User("alice", "system:masters")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(admin.Create(ctx, podMounting(ns, "rewrite", warm.Name))).To(MatchError(ContainSubstring(
		"the PVC " + warm.Name + " is a replica of a golden image of diskpipe on a node, which later disks on that node are cloned from, and is read-only")))
	golden := &goldenimage.Golden{Obj: vmi, PVC: pvcOf(t, ns, "vmim-warmed")}
	g.Expect(admin.Create(ctx, podMounting(ns, "early", goldenimage.ReplicaName(golden, "policy-cold")))).To(MatchError(ContainSubstring("is a replica")))
	g.Expect(admin.Create(ctx, podMounting(ns, "lookalike", "replica-warmed-0123456789ab"))).To(Succeed())

	// A replica a disk on the cold node made, last used two hours ago, is evicted; the warm
	// node's, as old, stays.
	cold := goldenimage.Replica(golden, diskvolume.ImageKindVirtualMachineImage, "policy-cold")
	cold.Annotations[goldenimage.AnnotationReplicaUsed] = time.Now().Add(-2 * time.Hour).UTC().Format(time.RFC3339)
	g.Expect(owned.Create(ctx, env.Client, vmi, cold)).To(Succeed())
	g.Expect(ctrltest.Update(ctx, env.Client, warm, func() {
		metav1.SetMetaDataAnnotation(&warm.ObjectMeta, goldenimage.AnnotationReplicaUsed, time.Now().Add(-2*time.Hour).UTC().Format(time.RFC3339))
	})).To(Succeed())
	g.Eventually(func() bool {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(cold), cold)
		return apierrors.IsNotFound(err) || (err == nil && !cold.DeletionTimestamp.IsZero())
	}, 20*time.Second).Should(BeTrue(), "the cold node's replica is evicted")
	g.Consistently(replicas, 2*time.Second).Should(HaveKey("policy-warm"))
}

// TestNodeLost: a Ready disk whose volume is on a node deleted from the cluster fails with
// NodeLost, naming the node, and is Ready again when the node comes back; a node-local image
// deletes its replica that failed so.
func TestNodeLost(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t)
	newNode := func(name string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}}}
	}
	g.Expect(client.IgnoreAlreadyExists(env.Client.Create(ctx, newNode("lost-far")))).To(Succeed())
	d := newDiskVolume(ns, "far", diskvolume.DiskVolumeSource{Blank: &common.BlankSource{}}, "", "1Gi")
	g.Expect(env.Client.Create(ctx, d)).To(Succeed())
	ctrltest.BindWith(t, env, ns, disk.PrimeName(d.UID), ctrltest.OnNode("lost-far"))
	ctrltest.Fill(t, env, ns, disk.PrimeName(d.UID), "far-blank-0", "far", transfer.Result{Format: "raw", VirtualSize: 1 << 30})
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(phase, Equal(common.PhaseReady)))

	g.Expect(env.Client.Delete(ctx, newNode("lost-far"))).To(Succeed())
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(phase, Equal(common.PhaseFailed)))
	g.Expect(condition(common.ConditionReady)(&d.Status)).To(And(HavePrefix("NodeLost: its volume pvc-"), ContainSubstring("lost-far"),
		ContainSubstring("no node of the cluster is")))

	g.Expect(env.Client.Create(ctx, newNode("lost-far"))).To(Succeed())
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(phase, Equal(common.PhaseReady)))
	g.Expect(condition(common.ConditionReady)(&d.Status)).To(ContainSubstring("in the cluster again"))

	// A replica that failed so is deleted by its image.
	vmi := readyImage(t, ns, "lost", classCSI)
	golden := &goldenimage.Golden{Obj: vmi, PVC: pvcOf(t, ns, "vmim-lost")}
	replica := goldenimage.Replica(golden, diskvolume.ImageKindVirtualMachineImage, "lost-gone")
	_, err := owned.Ensure(ctx, env.Client, vmi, replica)
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() []common.ImageReplica {
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(vmi), vmi)
		return vmi.Status.Replicas
	}, 20*time.Second).Should(ContainElement(HaveField("Node", "lost-gone")))
	lostSince := func(since time.Time) {
		g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(replica), replica); err != nil {
				return err
			}
			replica.Status.Phase = common.PhaseFailed
			replica.Status.Conditions = []metav1.Condition{{Type: common.ConditionReady, Status: metav1.ConditionFalse, LastTransitionTime: metav1.NewTime(since),
				Reason: goldenimage.ReasonNodeLost, Message: "its volume is on node lost-gone, and no node of the cluster is"}}
			return env.Client.Status().Update(ctx, replica)
		})).To(Succeed())
	}
	lostSince(time.Now())
	g.Consistently(func() error { return env.Client.Get(ctx, client.ObjectKeyFromObject(replica), replica) }, 2*time.Second).Should(Succeed(),
		"a node gone a moment ago may come back: its replica stays for image.LostReplicaGrace")
	lostSince(time.Now().Add(-image.LostReplicaGrace - time.Minute))
	g.Eventually(func() bool {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(replica), replica)
		return apierrors.IsNotFound(err) || (err == nil && !replica.DeletionTimestamp.IsZero())
	}, 20*time.Second).Should(BeTrue(), "the lost node's replica is deleted")
	g.Eventually(func() []common.ImageReplica {
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(vmi), vmi)
		return vmi.Status.Replicas
	}, 20*time.Second).ShouldNot(ContainElement(HaveField("Node", "lost-gone")))
}

// TestGoldenNodeLost: a Ready image whose node-local golden volume is on a node deleted from
// the cluster stays Ready (its replicas hold the bytes) and says, in its GoldenVolume
// condition, that the volume is gone with the node and how many replicas hold them; the
// condition turns True when the node comes back.
func TestGoldenNodeLost(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t)
	home := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "golden-home", Labels: map[string]string{corev1.LabelHostname: "golden-home"}}}
	g.Expect(client.IgnoreAlreadyExists(env.Client.Create(ctx, home.DeepCopy()))).To(Succeed())
	vmi := readyImageWith(t, ns, "homed", classCSI, ctrltest.OnNode("golden-home"))
	golden := func() string {
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(vmi), vmi)
		if c := meta.FindStatusCondition(vmi.Status.Conditions, image.ConditionGoldenVolume); c != nil {
			return fmt.Sprintf("%s %s %s: %s", vmi.Status.Phase, c.Status, c.Reason, c.Message)
		}
		return string(vmi.Status.Phase)
	}
	g.Consistently(golden, 2*time.Second).Should(Equal("Ready"), "nothing is said while the node is there")

	g.Expect(env.Client.Delete(ctx, home.DeepCopy())).To(Succeed())
	g.Eventually(golden, 20*time.Second).Should(And(HavePrefix("Ready False NodeLost: its volume pvc-"), ContainSubstring("golden-home"),
		ContainSubstring("no node of the cluster is"), HaveSuffix("no replica on another node holds them; no disk can be made from the image unless the node comes back")))

	g.Expect(env.Client.Create(ctx, home.DeepCopy())).To(Succeed())
	g.Eventually(golden, 20*time.Second).Should(And(HavePrefix("Ready True Reachable: its volume pvc-"), HaveSuffix("in the cluster")))
}

// TestReplicaCopiedFromNearest: a replica is copied from a Ready replica of its node's zone,
// else from the image's volume, else (the image's node gone from the cluster) from any Ready
// replica; the CopySource condition says which and why, and the clone-source pod reads it.
func TestReplicaCopiedFromNearest(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t)
	for name, zone := range map[string]string{"near-home": "z0", "near-a": "z1", "near-b": "z1", "near-c": "z2", "near-d": "z3"} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name, corev1.LabelTopologyZone: zone}}}
		g.Expect(client.IgnoreAlreadyExists(env.Client.Create(ctx, node))).To(Succeed())
	}
	vmi := readyImageWith(t, ns, "near", classWFFC, ctrltest.OnNode("near-home"))
	golden := &goldenimage.Golden{Obj: vmi, PVC: pvcOf(t, ns, "vmim-near")}
	replicaOn := func(node string) *diskvolume.DiskVolume {
		rep := goldenimage.Replica(golden, diskvolume.ImageKindVirtualMachineImage, node)
		_, err := owned.Ensure(ctx, env.Client, vmi, rep)
		g.Expect(err).NotTo(HaveOccurred())
		return rep
	}
	copiedFrom := func(rep *diskvolume.DiskVolume) func(g Gomega) string {
		return func(g Gomega) string {
			pod := &corev1.Pod{}
			g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "clone-source-" + string(rep.UID)}, pod)).To(Succeed())
			claim := ""
			for _, v := range pod.Spec.Volumes {
				if v.PersistentVolumeClaim != nil {
					claim = v.PersistentVolumeClaim.ClaimName
				}
			}
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(rep), rep)).To(Succeed())
			return claim + " " + condition(disk.ConditionCopySource)(&rep.Status)
		}
	}
	// The replica on near-a is copied from the image's volume (no other is Ready), and is
	// made Ready here as if the copy had ended.
	a := replicaOn("near-a")
	g.Eventually(copiedFrom(a), 20*time.Second).Should(Equal("vmim-near Nearest: copied from the image's volume"))
	g.Expect(env.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "clone-source-" + string(a.UID)}})).To(Succeed())
	g.Eventually(func() common.Phase {
		_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(a), a); err != nil || a.Status.Phase == common.PhaseReady {
				return err
			}
			a.Status.Phase = common.PhaseReady
			return env.Client.Status().Update(ctx, a)
		})
		return a.Status.Phase
	}, 20*time.Second).Should(Equal(common.PhaseReady))
	g.Consistently(func() common.Phase { _ = env.Client.Get(ctx, client.ObjectKeyFromObject(a), a); return a.Status.Phase }, 2*time.Second).Should(Equal(common.PhaseReady))
	// Its claim, bound: diskpipe's, for the replica (a claim of its name made by someone else
	// is not read from).
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: a.Name},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *ctrltest.Quantity(goldenSize)}}}}
	g.Expect(owned.Create(ctx, env.Client, a, claim)).To(Succeed())
	claim.Status.Phase = corev1.ClaimBound
	g.Expect(env.Client.Status().Update(ctx, claim)).To(Succeed())

	// A DiskVolume dressed as a replica in near-a's zone (the image as its controller, the
	// replica's labels, Ready, a bound claim, a name that sorts first) that diskpipe did not
	// make is not copied from.
	forged := goldenimage.Replica(golden, diskvolume.ImageKindVirtualMachineImage, "near-a")
	forged.Name = "replica-aaaa"
	g.Expect(controllerutil.SetControllerReference(vmi, forged, env.Client.Scheme())).To(Succeed())
	g.Expect(env.Client.Create(ctx, forged)).To(Succeed())
	g.Eventually(func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(forged), forged); err != nil {
			return err
		}
		forged.Status.Phase = common.PhaseReady
		return env.Client.Status().Update(ctx, forged)
	}, 20*time.Second).Should(Succeed())
	forgedClaim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: forged.Name},
		Spec: *claim.Spec.DeepCopy()}
	g.Expect(controllerutil.SetControllerReference(forged, forgedClaim, env.Client.Scheme())).To(Succeed())
	g.Expect(env.Client.Create(ctx, forgedClaim)).To(Succeed())
	forgedClaim.Status.Phase = corev1.ClaimBound
	g.Expect(env.Client.Status().Update(ctx, forgedClaim)).To(Succeed())

	// near-b is in near-a's zone; near-c in none that has a replica.
	g.Eventually(copiedFrom(replicaOn("near-b")), 20*time.Second).Should(Equal(a.Name + " Nearest: copied from the replica " + a.Name + " on node near-a, in zone z1"))
	g.Eventually(copiedFrom(replicaOn("near-c")), 20*time.Second).Should(Equal("vmim-near Nearest: copied from the image's volume"))

	// The image's node is gone: near-d is copied from the Ready replica.
	g.Expect(env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "near-home"}})).To(Succeed())
	g.Eventually(copiedFrom(replicaOn("near-d")), 20*time.Second).Should(And(HavePrefix(a.Name+" Nearest: copied from the replica "+a.Name+" on node near-a, as the image's volume is on "),
		ContainSubstring("near-home"), HaveSuffix("which is gone from the cluster")))
	// Nor is the forged one listed as the image's replica, or counted as one.
	listed := func() []common.ImageReplica {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(vmi), vmi)).To(Succeed())
		return vmi.Status.Replicas
	}
	g.Eventually(listed, 20*time.Second).Should(ContainElement(HaveField("Name", a.Name)))
	g.Expect(listed()).NotTo(ContainElement(HaveField("Name", forged.Name)))
}
