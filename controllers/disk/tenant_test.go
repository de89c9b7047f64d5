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

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/disk"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/ctrltest"
)

// attack sets the scene: a golden image in a namespace of its own, whose PV a hostile tenant is
// after, and the tenant: a namespace and a client with `edit` in it only.
func attack(t *testing.T) (victim *corev1.PersistentVolume, ns string, attacker client.Client) {
	t.Helper()
	setup(t)
	victim = victimVolume(t)
	ns = namespace(t)
	attacker, err := env.Tenant(t.Context(), ns, "mallory")
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	return victim, ns, attacker
}

// victimVolume makes a golden image in a namespace of its own and returns its PV.
func victimVolume(t *testing.T) *corev1.PersistentVolume {
	t.Helper()
	ns := namespace(t)
	readyImage(t, ns, "golden", classCSI)
	pv := &corev1.PersistentVolume{}
	NewWithT(t).Expect(env.Client.Get(t.Context(), client.ObjectKey{Name: pvcOf(t, ns, "vmim-golden").Spec.VolumeName}, pv)).To(Succeed())
	return pv
}

// stillBound says that pv is still bound to the claim it was.
func stillBound(t *testing.T, pv *corev1.PersistentVolume) {
	t.Helper()
	got := &corev1.PersistentVolume{}
	NewWithT(t).Consistently(func() *corev1.ObjectReference {
		_ = env.Client.Get(t.Context(), client.ObjectKeyFromObject(pv), got)
		return got.Spec.ClaimRef
	}, 3*time.Second, 200*time.Millisecond).Should(Equal(pv.Spec.ClaimRef))
}

// TestTenantCannotTakeAVolume is the attack on a volume of another namespace: a tenant with
// `edit` in their namespace only makes, under the name of their disk's prime PVC, a PVC of
// their own, controlled by their disk, pre-bound to the victim's volume and marked filled, so
// that the manager would hand that volume to their disk's PVC. The manager does not adopt a
// PVC it did not make.
func TestTenantCannotTakeAVolume(t *testing.T) {
	g := NewWithT(t)
	victim, ns, attacker := attack(t)

	// The disk waits for its image (an upload, in the attack as shown), which gives the
	// attacker the time to make the prime first.
	d := newDiskVolume(ns, "loot", fromImage("", "later"), classOther, "")
	d.Spec.CloneStrategy = ptr.To(common.CloneStrategyHostAssisted)
	g.Expect(attacker.Create(t.Context(), d)).To(Succeed())
	forged := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: disk.PrimeName(d.UID), Namespace: ns,
		Annotations: map[string]string{disk.AnnotationFilled: "copied in 1 s"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: diskvolume.GroupVersion.String(), Kind: "DiskVolume", Name: d.Name, UID: d.UID,
			Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: victim.Spec.Capacity[corev1.ResourceStorage]}},
			StorageClassName: ptr.To(classCSI), VolumeName: victim.Name}}
	g.Expect(attacker.Create(t.Context(), forged)).To(Succeed())
	readyImage(t, ns, "later", classCSI)

	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(condition(common.ConditionReady), Equal(
		"NameTaken: a PersistentVolumeClaim named "+forged.Name+" already exists and was not made by diskpipe for this object; delete it and diskpipe makes it again")))
	g.Expect(d.Status.Phase).To(Equal(common.PhaseFailed))
	stillBound(t, victim)
	// The manager made no claim pre-bound to the victim's volume either.
	g.Expect(env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "loot"}, &corev1.PersistentVolumeClaim{})).NotTo(Succeed())
}

// TestTenantCannotHandOverAVolume: the prime is the manager's own, but its spec.volumeName,
// which a claim's owner may set once, names the victim's volume, and its owner marks it
// filled. A volume is handed over only from a claim it is bound to, checked on the volume.
func TestTenantCannotHandOverAVolume(t *testing.T) {
	g := NewWithT(t)
	victim, ns, attacker := attack(t)
	readyImage(t, ns, "mine", classCSI)

	d := newDiskVolume(ns, "loot", fromImage("", "mine"), classOther, "")
	g.Expect(attacker.Create(t.Context(), d)).To(Succeed())
	prime := pvcOf(t, ns, disk.PrimeName(d.UID))
	g.Expect(ctrltest.Update(t.Context(), attacker, prime, func() {
		prime.Spec.VolumeName = victim.Name
		metav1.SetMetaDataAnnotation(&prime.ObjectMeta, disk.AnnotationFilled, "copied in 1 s")
	})).To(Succeed())

	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(condition(common.ConditionReady), Equal(
		"VolumeNotBound: refusing to hand volume "+victim.Name+" over from the PVC "+ns+"/"+prime.Name+": the volume is bound to the claim "+
			victim.Spec.ClaimRef.Namespace+"/"+victim.Spec.ClaimRef.Name+" (uid "+string(victim.Spec.ClaimRef.UID)+"), not to it")))
	stillBound(t, victim)
}

// TestTenantCannotHoldAnImage: an image is not deleted while disks are cloned from it, found
// by a label on their PVCs in every namespace. A tenant who puts that label, with the victim
// image's UID, on PVCs of theirs (one they made, one diskpipe made for a disk of another image)
// does not hold the victim's image back.
func TestTenantCannotHoldAnImage(t *testing.T) {
	g := NewWithT(t)
	_, ns, attacker := attack(t)
	victimNS := namespace(t)
	victim := readyImage(t, victimNS, "golden", classCSI)
	readyImage(t, ns, "mine", classCSI)

	d := newDiskVolume(ns, "mine", fromImage("", "mine"), classCSI, "")
	g.Expect(attacker.Create(t.Context(), d)).To(Succeed())
	made := pvcOf(t, ns, "mine")
	g.Expect(ctrltest.Update(t.Context(), attacker, made, func() { made.Labels[goldenimage.LabelCloneOf] = string(victim.UID) })).To(Succeed())
	plain := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: ns,
		Labels: map[string]string{goldenimage.LabelCloneOf: string(victim.UID)}},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *ctrltest.Quantity("1Gi")}}}}
	g.Expect(attacker.Create(t.Context(), plain)).To(Succeed())

	g.Expect(env.Client.Delete(t.Context(), victim)).To(Succeed())
	g.Eventually(func() bool {
		return apierrors.IsNotFound(env.Client.Get(t.Context(), client.ObjectKeyFromObject(victim), victim))
	}, 20*time.Second).Should(BeTrue(), "the image is deleted; its status says %v", victim.Status.Conditions)
}
