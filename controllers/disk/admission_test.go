package disk_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"

	. "github.com/onsi/gomega"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/disk"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/ctrltest"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/controllers/manager"
)

func podMounting(ns, name, claim string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "vm", Image: "quay.io/kubevirt/virt-launcher",
			VolumeMounts: []corev1.VolumeMount{{Name: "disk", MountPath: "/disk"}}}},
		Volumes: []corev1.Volume{{Name: "disk", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}}}
}

// TestGoldenPVCsAreReadOnly: only diskpipe's own pods (its importers, which every other test
// here runs through this webhook) may mount a golden PVC; anyone else, an administrator
// included, is refused with what to do instead, and may mount the disks made from it. A golden
// PVC stays one without its label, and a pod may not wait under a golden PVC's name for it.
func TestGoldenPVCsAreReadOnly(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ns := namespace(t)
	readyImage(t, ns, "golden", classCSI)
	d := newDiskVolume(ns, "mine", fromImage("", "golden"), classCSI, "")
	g.Expect(env.Client.Create(t.Context(), d)).To(Succeed())
	pvcOf(t, ns, "mine")

	admin, err := env.User("alice", "system:masters")
	g.Expect(err).NotTo(HaveOccurred())
	err = admin.Create(t.Context(), podMounting(ns, "thief", "vmim-golden"))
	g.Expect(err).To(MatchError(ContainSubstring(
		"the PVC vmim-golden holds a golden image of diskpipe and is read-only: make a disk from the image with a VirtualMachinePvc or a DiskVolume and mount that")))
	g.Expect(admin.Create(t.Context(), podMounting(ns, "vm", "mine"))).To(Succeed())
	g.Expect(admin.Create(t.Context(), podMounting(ns, "unrelated", "no-such-pvc"))).To(Succeed())

	// Its owner may remove its label: diskpipe's mark still says what it is.
	golden := pvcOf(t, ns, "vmim-golden")
	g.Expect(ctrltest.Update(t.Context(), env.Client, golden, func() { delete(golden.Labels, goldenimage.LabelGolden) })).To(Succeed())
	g.Expect(admin.Create(t.Context(), podMounting(ns, "thief2", "vmim-golden"))).To(MatchError(ContainSubstring(
		"the PVC vmim-golden holds a golden image of diskpipe and is read-only")))
	// A pod made before the image, naming the claim its image would make, is refused too.
	g.Expect(admin.Create(t.Context(), podMounting(ns, "early", "vmim-later"))).To(MatchError(ContainSubstring(
		"the PVC vmim-later does not exist yet, and a claim of that name would hold a golden image of diskpipe, which is read-only")))

	// A disk's prime, which diskpipe fills before the disk's own PVC gets its volume, is out
	// of reach while it is written; so is a claim of a prime's name not made yet.
	blank := newDiskVolume(ns, "blank", diskvolume.DiskVolumeSource{Blank: &common.BlankSource{}}, classCSI, "1Gi")
	g.Expect(env.Client.Create(t.Context(), blank)).To(Succeed())
	prime := pvcOf(t, ns, disk.PrimeName(blank.UID))
	g.Expect(admin.Create(t.Context(), podMounting(ns, "writer", prime.Name))).To(MatchError(ContainSubstring(
		"the PVC " + prime.Name + " is the DiskVolume blank while diskpipe writes it, which nobody else may mount: mount the disk's own PVC, blank, once it is made")))
	g.Expect(admin.Create(t.Context(), podMounting(ns, "early-prime", "prime-"+uuid.NewString()))).To(MatchError(ContainSubstring(
		"does not exist yet, and a claim of that name would be a disk diskpipe is still writing, which nobody else may mount")))
	g.Expect(admin.Create(t.Context(), podMounting(ns, "numbers", "prime-numbers"))).To(Succeed())
}

// TestCrossNamespaceNeedsConsent: a DiskVolume from another namespace's image is admitted only
// when that namespace's owner consented: its creator may create datavolumes/source there (as
// diskpipe's user role, part of edit, allows), or the image is public. Reading the image (the
// view role) is not enough.
func TestCrossNamespaceNeedsConsent(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	images, team := namespace(t), namespace(t)
	vmi := readyImage(t, images, "private", classCSI)

	// bob may manage DiskVolumes in his team's namespace, nothing in the images namespace.
	g.Expect(env.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "disks", Namespace: team},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"diskvolume.kubesphere.io"}, Resources: []string{"diskvolumes"}, Verbs: []string{"*"}}}})).To(Succeed())
	g.Expect(env.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "bob", Namespace: team},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "disks"},
		Subjects: []rbacv1.Subject{{Kind: "User", Name: "bob"}}})).To(Succeed())
	bob, err := env.User("bob")
	g.Expect(err).NotTo(HaveOccurred())

	// RBAC takes a moment to learn bob's new Role; until then the apiserver itself refuses him.
	g.Eventually(func() error {
		err = bob.Create(ctx, newDiskVolume(team, "stolen", fromImage(images, "private"), classCSI, ""))
		if err != nil && strings.Contains(err.Error(), `User "bob" cannot create resource`) {
			return err
		}
		return nil
	}).Should(Succeed())
	refusal := "bob may not copy the VirtualMachineImage " + images + "/private into namespace " + team +
		": copying another namespace's data needs its owner's consent, create on datavolumes/source (cdi.kubevirt.io) in " + images
	g.Expect(err).To(MatchError(ContainSubstring(refusal)))

	// Public: anyone may make disks from it.
	patch := client.MergeFrom(vmi.DeepCopy())
	vmi.Labels = map[string]string{virtualmachine.LabelImagePublic: "yes"}
	g.Expect(env.Client.Patch(ctx, vmi, patch)).To(Succeed())
	g.Eventually(func() error {
		return bob.Create(ctx, newDiskVolume(team, "public", fromImage(images, "private"), classCSI, ""))
	}, 10*time.Second).Should(Succeed())

	// A revision of a scheduled image took its parent's labels when it was made; its parent
	// made private since keeps it so.
	parent := newImage(images, "scheduled", classCSI)
	parent.Labels = map[string]string{virtualmachine.LabelImagePublic: "yes"}
	g.Expect(env.Client.Create(ctx, parent)).To(Succeed())
	rev := readyImage(t, images, "scheduled-r1", classCSI)
	patch = client.MergeFrom(rev.DeepCopy())
	rev.Labels = map[string]string{virtualmachine.LabelImagePublic: "yes"}
	rev.OwnerReferences = []metav1.OwnerReference{{APIVersion: hypercloud.GroupVersion.String(), Kind: "VirtualMachineImage",
		Name: parent.Name, UID: parent.UID, Controller: ptr.To(true)}}
	g.Expect(env.Client.Patch(ctx, rev, patch)).To(Succeed())
	g.Eventually(func() error {
		return bob.Create(ctx, newDiskVolume(team, "revision", fromImage(images, "scheduled-r1"), classCSI, ""))
	}, 10*time.Second).Should(Succeed())
	patch = client.MergeFrom(parent.DeepCopy())
	parent.Labels = nil
	g.Expect(env.Client.Patch(ctx, parent, patch)).To(Succeed())
	attempt := 0
	g.Eventually(func() error {
		attempt++
		return bob.Create(ctx, newDiskVolume(team, fmt.Sprintf("revision-%d", attempt), fromImage(images, "scheduled-r1"), classCSI, ""))
	}, 10*time.Second).Should(MatchError(ContainSubstring("bob may not copy the VirtualMachineImage " + images + "/scheduled-r1 into namespace " + team)))

	// Not public, and bob may read it (and every PVC there) with the built-in view role: a
	// viewer is not an owner.
	private := readyImage(t, images, "shared", classCSI)
	g.Expect(private.Labels).NotTo(HaveKey(virtualmachine.LabelImagePublic))
	g.Expect(env.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "bob-views", Namespace: images},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:aggregate-to-view"},
		Subjects: []rbacv1.Subject{{Kind: "User", Name: "bob"}}})).To(Succeed())
	g.Expect(env.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "bob-views-images", Namespace: images},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "diskpipe-viewer"},
		Subjects: []rbacv1.Subject{{Kind: "User", Name: "bob"}}})).To(Succeed())
	g.Eventually(func() error {
		return bob.Get(ctx, client.ObjectKeyFromObject(private), &hypercloud.VirtualMachineImage{})
	}, 10*time.Second).Should(Succeed())
	g.Expect(bob.Create(ctx, newDiskVolume(team, "viewed", fromImage(images, "shared"), classCSI, ""))).To(
		MatchError(ContainSubstring("bob may not copy the VirtualMachineImage " + images + "/shared into namespace " + team)))
	// The namespace's owner consents: bob is given the copy right there.
	g.Expect(env.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "copy-from", Namespace: images},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"cdi.kubevirt.io"}, Resources: []string{"datavolumes/source"}, Verbs: []string{"create"}}}})).To(Succeed())
	g.Expect(env.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "bob", Namespace: images},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "copy-from"},
		Subjects: []rbacv1.Subject{{Kind: "User", Name: "bob"}}})).To(Succeed())
	g.Eventually(func() error {
		return bob.Create(ctx, newDiskVolume(team, "granted", fromImage(images, "shared"), classCSI, ""))
	}, 10*time.Second).Should(Succeed())

	// Within its own namespace nothing is asked.
	own := newDiskVolume(team, "blank", diskvolume.DiskVolumeSource{Blank: &common.BlankSource{}}, "", "1Gi")
	g.Expect(bob.Create(ctx, own)).To(Succeed())
}

// TestLeastPrivilege: the manager of this suite runs with only the chart's RBAC (see setup),
// so every test here is also a test that it suffices. Importer pods get no token
// and their service account no right: they cannot read Secrets or list pods.
func TestLeastPrivilege(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ns := namespace(t)
	d := newDiskVolume(ns, "blank", diskvolume.DiskVolumeSource{Blank: &common.BlankSource{}}, "", "1Gi")
	g.Expect(env.Client.Create(t.Context(), d)).To(Succeed())
	pod := ctrltest.Pod(t, env, ns, "blank-blank-0")
	g.Expect(*pod.Spec.AutomountServiceAccountToken).To(BeFalse())
	// The manager made the pod's service account and its NetworkPolicy in the namespace.
	g.Expect(pod.Spec.ServiceAccountName).To(Equal("diskpipe-importer"))
	account := &corev1.ServiceAccount{}
	g.Expect(env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "diskpipe-importer"}, account)).To(Succeed())
	g.Expect(*account.AutomountServiceAccountToken).To(BeFalse())
	policy := &networkingv1.NetworkPolicy{}
	g.Expect(env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: importpod.NetworkPolicyName}, policy)).To(Succeed())
	g.Expect(policy.Spec.PodSelector.MatchLabels).To(HaveKeyWithValue(importpod.LabelManagedBy, importpod.ManagedBy))
	g.Expect(pod.Labels).To(HaveKeyWithValue(importpod.LabelManagedBy, importpod.ManagedBy))
	sa := "system:serviceaccount:" + ns + ":" + pod.Spec.ServiceAccountName
	// The pod is admitted where the restricted Pod Security Standard is enforced.
	restricted := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "restricted-",
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}}
	g.Expect(env.Client.Create(t.Context(), restricted)).To(Succeed())
	g.Expect(env.Client.Create(t.Context(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: pod.Spec.ServiceAccountName, Namespace: restricted.Name}})).To(Succeed())
	copied := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: restricted.Name}, Spec: *pod.Spec.DeepCopy()}
	copied.Spec.NodeName = ""
	for _, v := range copied.Spec.Volumes {
		if v.PersistentVolumeClaim != nil { // a prime's name: the golden hook keeps such names to diskpipe
			v.PersistentVolumeClaim.ClaimName = "copied-" + v.Name
		}
	}
	g.Expect(env.Client.Create(t.Context(), copied, client.DryRunAll)).To(Succeed(), "the importer pod is not admitted as restricted")
	for _, attrs := range []authorizationv1.ResourceAttributes{
		{Namespace: ns, Verb: "get", Resource: "secrets"},
		{Namespace: ns, Verb: "list", Resource: "pods"},
		{Namespace: ns, Verb: "get", Group: "hypercloud.tmaxanc.com", Resource: "virtualmachineimages"},
	} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: sa,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}, ResourceAttributes: &attrs}}
		g.Expect(env.Client.Create(t.Context(), sar)).To(Succeed())
		g.Expect(sar.Status.Allowed).To(BeFalse(), "the importer's service account may %s %s", attrs.Verb, attrs.Resource)
	}
	// The manager leads through a Lease of the release namespace (the chart's Role).
	lease := &coordinationv1.Lease{}
	g.Expect(env.Client.Get(t.Context(), client.ObjectKey{Namespace: "diskpipe-system", Name: manager.LeaderElectionID}, lease)).To(Succeed())
	g.Expect(ptr.Deref(lease.Spec.HolderIdentity, "")).NotTo(BeEmpty())
	// And the manager's role is what allows the manager, not an accident of the test set-up.
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: managerUser,
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "create", Resource: "pods"}}}
	g.Expect(env.Client.Create(t.Context(), sar)).To(Succeed())
	g.Expect(sar.Status.Allowed).To(BeTrue())
	sar = &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: managerUser,
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "list", Resource: "secrets"}}}
	g.Expect(env.Client.Create(t.Context(), sar)).To(Succeed())
	g.Expect(sar.Status.Allowed).To(BeFalse(), "the manager never lists Secrets")
}

// TestVirtualMachineChecksItsAuthor: a VirtualMachine (virtualmachine.kubesphere.io) is
// admitted only when its author may do what the manager then does for them: create the
// KubeVirt VM, read a template's image in another namespace, and use each volume of its
// hardware. Each refusal says what was missing.
func TestVirtualMachineChecksItsAuthor(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	images, team := namespace(t), namespace(t)
	readyImage(t, images, "private", classCSI)
	grant := func(ns, name string, rules ...rbacv1.PolicyRule) {
		g.Expect(env.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Rules: rules})).To(Succeed())
		g.Expect(env.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
			Subjects: []rbacv1.Subject{{Kind: "User", Name: "carol"}}})).To(Succeed())
	}
	grant(team, "ksvms", rbacv1.PolicyRule{APIGroups: []string{"virtualmachine.kubesphere.io"}, Resources: []string{"virtualmachines"}, Verbs: []string{"*"}})
	carol, err := env.User("carol")
	g.Expect(err).NotTo(HaveOccurred())
	vm := func(name, hardware string, templates ...virtualmachine.DiskVolumeTemplate) *virtualmachine.VirtualMachine {
		return &virtualmachine.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: team},
			Spec: virtualmachine.VirtualMachineSpec{Hardware: runtime.RawExtension{Raw: []byte(hardware)}, DiskVolumeTemplates: templates}}
	}
	const plain = `{"domain":{"devices":{}}}`
	refused := func(obj *virtualmachine.VirtualMachine, says string) {
		t.Helper()
		var err error
		g.Eventually(func() error { // RBAC learns carol's Role a moment after it is made
			err = carol.Create(ctx, obj)
			if err != nil && strings.Contains(err.Error(), `User "carol" cannot create resource`) {
				return err
			}
			return nil
		}, 10*time.Second).Should(Succeed())
		g.Expect(err).To(MatchError(ContainSubstring(says)), "VM %s", obj.Name)
	}

	refused(vm("novm", plain), "carol may not create virtualmachines.kubevirt.io novm in "+team+", which the KubeVirt VirtualMachine it makes needs: ask for create on virtualmachines.kubevirt.io in "+team)

	grant(team, "kubevirt-vms", rbacv1.PolicyRule{APIGroups: []string{"kubevirt.io"}, Resources: []string{"virtualmachines"}, Verbs: []string{"create", "update"}})
	g.Eventually(func() error { return carol.Create(ctx, vm("plain", plain)) }, 10*time.Second).Should(Succeed())
	refused(vm("hostdisk", `{"domain":{"devices":{}},"volumes":[{"name":"node","hostDisk":{"path":"/var/lib/kubelet","type":"Disk"}}]}`),
		`volume "node" of spec.hardware is a hostDisk (/var/lib/kubelet on the node): VirtualMachines may not reach the node's files unless the chart's virtualMachines.allowHostDisk is true`)
	withSecret := vm("secret", `{"domain":{"devices":{}},"volumes":[{"name":"creds","secret":{"secretName":"db-password"}}]}`)
	refused(withSecret.DeepCopy(), `carol may not get secrets db-password in `+team+`, which volume "creds" of spec.hardware needs`)
	refused(vm("cloudinit", `{"domain":{"devices":{}},"volumes":[{"name":"ci","cloudInitNoCloud":{"secretRef":{"name":"admin-userdata"}}}]}`),
		`carol may not get secrets admin-userdata`)
	refused(vm("token", `{"domain":{"devices":{}},"volumes":[{"name":"sa","serviceAccount":{"serviceAccountName":"deployer"}}]}`),
		`carol may not create serviceaccounts/token deployer`)
	refused(vm("stolen", plain, virtualmachine.DiskVolumeTemplate{Metadata: virtualmachine.TemplateMeta{Name: "root"},
		Spec: newDiskVolume(team, "root", fromImage(images, "private"), classCSI, "1Gi").Spec}),
		"carol may not copy the VirtualMachineImage "+images+"/private into namespace "+team)

	// However many volumes a VM names, one request asks a bounded number of checks.
	var many []string
	for i := range 300 {
		many = append(many, fmt.Sprintf(`{"name":"s%d","secret":{"secretName":"s%d"}}`, i, i))
	}
	refused(vm("many", `{"domain":{"devices":{}},"volumes":[`+strings.Join(many, ",")+`]}`),
		"the VirtualMachine names 301 volumes and disk templates that each need a check of its author's rights; at most 256 are checked in one request")

	grant(team, "db-password", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{"db-password"}, Verbs: []string{"get"}})
	g.Eventually(func() error { return carol.Create(ctx, withSecret) }, 10*time.Second).Should(Succeed())

	// An update is checked as a creation is: adding a volume carol may not use is refused.
	p := vm("plain", `{"domain":{"devices":{}},"volumes":[{"name":"other","configMap":{"name":"cluster-config"}}]}`)
	g.Expect(carol.Get(ctx, client.ObjectKeyFromObject(p), &virtualmachine.VirtualMachine{})).To(Succeed())
	cur := &virtualmachine.VirtualMachine{}
	g.Expect(carol.Get(ctx, client.ObjectKeyFromObject(p), cur)).To(Succeed())
	cur.Spec.Hardware = p.Spec.Hardware
	g.Expect(carol.Update(ctx, cur)).To(MatchError(ContainSubstring("carol may not get configmaps cluster-config")))
}

// TestPolicyRefresh: the pods' NetworkPolicies follow the installation's settings: one still as
// diskpipe wrote it is brought to what the settings ask now (an allowed destination added to
// the chart reaches namespaces prepared before), with nothing but the manager's rights; one an
// administrator tightened, or one an older diskpipe wrote without its mark, is left alone.
func TestPolicyRefresh(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	cfg, err := env.UserConfig(managerUser)
	g.Expect(err).NotTo(HaveOccurred())
	asManager, err := client.New(cfg, client.Options{Scheme: env.Client.Scheme()})
	g.Expect(err).NotTo(HaveOccurred())
	settings := func(allowed ...string) importpod.Config {
		c := importpod.Config{ClusterCIDRs: []string{"10.96.0.0/12"}, AllowedDestinations: allowed,
			NetworkPolicy: &importpod.NetworkPolicyConfig{ManagerNamespace: "diskpipe-system", ManagerLabels: map[string]string{"app.kubernetes.io/component": "manager"}}}
		c.Defaults() // each its own manager: nothing remembered of an earlier one
		return c
	}
	egress := func(ns string) *networkingv1.NetworkPolicy {
		p := &networkingv1.NetworkPolicy{}
		g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: importpod.EgressPolicyName}, p)).To(Succeed())
		return p
	}
	allows := func(p *networkingv1.NetworkPolicy, cidr string) bool {
		for _, r := range p.Spec.Egress {
			for _, peer := range r.To {
				if peer.IPBlock != nil && peer.IPBlock.CIDR == cidr {
					return true
				}
			}
		}
		return false
	}

	ns := namespace(t)
	g.Expect(importpod.PrepareNamespace(ctx, asManager, settings(), ns)).To(Succeed())
	g.Expect(allows(egress(ns), "10.100.0.7/32")).To(BeFalse())
	g.Expect(importpod.PrepareNamespace(ctx, asManager, settings("10.100.0.7"), ns)).To(Succeed())
	g.Expect(allows(egress(ns), "10.100.0.7/32")).To(BeTrue(), "the mirror added to the chart reaches a namespace prepared before")

	// An administrator's tightening stays.
	tightened := egress(ns)
	tightened.Spec.Egress = tightened.Spec.Egress[:1] // DNS only
	g.Expect(env.Client.Update(ctx, tightened)).To(Succeed())
	g.Expect(importpod.PrepareNamespace(ctx, asManager, settings("10.100.0.7", "10.100.0.8"), ns)).To(Succeed())
	g.Expect(egress(ns).Spec.Egress).To(HaveLen(1), "the administrator's policy is left as they made it")

	// A policy without the mark (an older diskpipe's, perhaps tightened since) stays too.
	old := namespace(t)
	g.Expect(env.Client.Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: importpod.EgressPolicyName, Namespace: old,
		Labels: map[string]string{importpod.LabelManagedBy: importpod.ManagedBy}},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}})).To(Succeed())
	g.Expect(importpod.PrepareNamespace(ctx, asManager, settings("10.100.0.7"), old)).To(Succeed())
	g.Expect(egress(old).Spec.Egress).To(BeEmpty())
	g.Expect(egress(old).Annotations).NotTo(HaveKey(importpod.AnnotationWrittenSpec))
}

// TestDiskpipePodsAreTheManagers: the label NetworkPolicies admit diskpipe's pods by is the
// manager's to give. Nobody else, an administrator included, may make a pod that carries it,
// give it to a pod, or change what a pod of diskpipe's runs (its component, its images, an
// ephemeral container, exec, attach); a pod made again under the name of one of diskpipe's,
// with its mark copied but not its label, is not taken for diskpipe's.
func TestDiskpipePodsAreTheManagers(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	images, ns := namespace(t), namespace(t)
	readyImage(t, images, "centos", classCSI)
	d := newDiskVolume(ns, "copy", fromImage(images, "centos"), classCSI, "")
	g.Expect(env.Client.Create(ctx, d)).To(Succeed())
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(func(st *common.DiskStatus) string { return string(st.CloneStrategy) }, Equal("HostAssisted")))
	ctrltest.Bind(t, env, ns, disk.PrimeName(d.UID))
	source := ctrltest.Pod(t, env, images, "clone-source-"+string(d.UID))

	cfg, err := env.UserConfig("alice", "system:masters")
	g.Expect(err).NotTo(HaveOccurred())
	admin, err := client.New(cfg, client.Options{Scheme: env.Client.Scheme()})
	g.Expect(err).NotTo(HaveOccurred())
	forged := podMounting(images, "forged", "no-such-pvc")
	forged.Labels = map[string]string{importpod.LabelManagedBy: importpod.ManagedBy, importpod.LabelComponent: "importer"}
	g.Expect(admin.Create(ctx, forged)).To(MatchError(ContainSubstring(
		"the label app.kubernetes.io/managed-by: diskpipe is for pods diskpipe makes (NetworkPolicies admit them to the object store and to clone sources), " +
			"and only diskpipe's manager may create a pod that carries it: remove the label")))
	plain := podMounting(images, "plain", "no-such-pvc")
	g.Expect(admin.Create(ctx, plain)).To(Succeed())
	g.Expect(ctrltest.Update(ctx, admin, plain, func() { plain.Labels = map[string]string{importpod.LabelManagedBy: importpod.ManagedBy} })).To(MatchError(ContainSubstring(
		"the label app.kubernetes.io/managed-by: diskpipe is for pods diskpipe makes, and only diskpipe's manager may give it to a pod")))

	// diskpipe's own clone source: what it is and runs is the manager's.
	g.Expect(ctrltest.Update(ctx, admin, source, func() { source.Labels[importpod.LabelComponent] = "importer" })).To(MatchError(ContainSubstring(
		"the pod " + source.Name + " is diskpipe's clone-source, and only diskpipe's manager may change its label app.kubernetes.io/component")))
	g.Expect(ctrltest.Update(ctx, admin, source, func() { source.Spec.Containers[0].Image = "busybox" })).To(MatchError(ContainSubstring(
		"the pod " + source.Name + " is diskpipe's clone-source, which runs diskpipe's code only: its images may not be changed")))
	// Nor is taking the label off a way out of this hook, alone or with the images changed.
	g.Expect(ctrltest.Update(ctx, admin, source, func() { delete(source.Labels, importpod.LabelManagedBy) })).To(MatchError(ContainSubstring(
		"the pod " + source.Name + " is diskpipe's clone-source, and only diskpipe's manager may take its label app.kubernetes.io/managed-by off: delete the pod instead")))
	g.Expect(ctrltest.Update(ctx, admin, source, func() {
		delete(source.Labels, importpod.LabelManagedBy)
		source.Spec.Containers[0].Image = "busybox"
	})).To(MatchError(ContainSubstring("may take its label app.kubernetes.io/managed-by off")))
	g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(source), source)).To(Succeed())
	source.Spec.EphemeralContainers = append(source.Spec.EphemeralContainers, corev1.EphemeralContainer{
		EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: "busybox", TerminationMessagePolicy: corev1.TerminationMessageReadFile, ImagePullPolicy: corev1.PullIfNotPresent}})
	g.Expect(admin.SubResource("ephemeralcontainers").Update(ctx, source)).To(MatchError(ContainSubstring(
		"the pod " + source.Name + " is diskpipe's clone-source, which runs diskpipe's code only: no ephemeral container may be added to it")))
	cs, err := kubernetes.NewForConfig(cfg)
	g.Expect(err).NotTo(HaveOccurred())
	execInto := func(pod string) error {
		return cs.CoreV1().RESTClient().Post().Namespace(images).Resource("pods").Name(pod).SubResource("exec").
			Param("command", "sh").Param("stdout", "true").Do(ctx).Error()
	}
	g.Expect(execInto(source.Name)).To(MatchError(ContainSubstring(
		"the pod " + source.Name + " is diskpipe's clone-source, which runs diskpipe's code only: nobody may exec it; read its logs (kubectl logs) instead")))
	// The refusal is this hook's: a pod of anyone else's goes on to the kubelet (none here).
	g.Expect(execInto(plain.Name)).To(MatchError(Not(ContainSubstring("diskpipe"))))

	// Made again with the mark of diskpipe's pod but without its label (which nobody else may
	// give it): not the clone source the copy's token goes to.
	g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(source), source)).To(Succeed())
	again := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: source.Name, Namespace: images, Annotations: source.Annotations},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "serve", Image: "busybox"}}}}
	g.Expect(admin.Delete(ctx, source, client.GracePeriodSeconds(0))).To(Succeed())
	g.Eventually(func() error { return admin.Create(ctx, again) }, 10*time.Second).Should(Succeed())
	ctrltest.Kubelet(t, env, images, again.Name, corev1.PodRunning, nil, 0)
	g.Eventually(diskStatus(t, d, &d.Status), 20*time.Second).Should(WithTransform(condition(common.ConditionReady),
		ContainSubstring("was not made by diskpipe for this object")))
	g.Consistently(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "copy-clone-0"}, &corev1.Pod{})
	}, 2*time.Second).ShouldNot(Succeed(), "no importer is sent to it")
}
