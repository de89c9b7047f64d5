package disk_test

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/disk"
	"github.com/diskpipe/diskpipe/controllers/image"
	"github.com/diskpipe/diskpipe/controllers/internal/ctrltest"
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
	ctrltest.BindWith(t, env, ns, "vmim-warmed", func(pv *corev1.PersistentVolume) {
		pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{"policy-home"}}}}}}}
	})
	replicas := func() map[string]string {
		list := &diskvolume.DiskVolumeList{}
		g.Expect(env.Client.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{disk.LabelReplicaOf: string(vmi.UID)})).To(Succeed())
		out := map[string]string{}
		for _, d := range list.Items {
			if d.DeletionTimestamp.IsZero() {
				out[d.Annotations[disk.AnnotationSelectedNode]] = d.Name
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

	// A replica a disk on the cold node made, last used two hours ago, is evicted; the warm
	// node's, as old, stays.
	golden := &image.Golden{Obj: vmi, PVC: pvcOf(t, ns, "vmim-warmed")}
	cold := image.Replica(golden, diskvolume.ImageKindVirtualMachineImage, "policy-cold")
	cold.Annotations[image.AnnotationReplicaUsed] = time.Now().Add(-2 * time.Hour).UTC().Format(time.RFC3339)
	g.Expect(controllerutil.SetControllerReference(vmi, cold, env.Client.Scheme())).To(Succeed())
	g.Expect(env.Client.Create(ctx, cold)).To(Succeed())
	g.Expect(ctrltest.Update(ctx, env.Client, warm, func() {
		metav1.SetMetaDataAnnotation(&warm.ObjectMeta, image.AnnotationReplicaUsed, time.Now().Add(-2*time.Hour).UTC().Format(time.RFC3339))
	})).To(Succeed())
	g.Eventually(func() bool {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(cold), cold)
		return apierrors.IsNotFound(err) || (err == nil && !cold.DeletionTimestamp.IsZero())
	}, 20*time.Second).Should(BeTrue(), "the cold node's replica is evicted")
	g.Consistently(replicas, 2*time.Second).Should(HaveKey("policy-warm"))
}
