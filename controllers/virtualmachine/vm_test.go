package virtualmachine_test

import (
	"encoding/json"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	vmv1 "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/disk"
	"github.com/diskpipe/diskpipe/controllers/internal/ctrltest"
	"github.com/diskpipe/diskpipe/controllers/manager"
	"github.com/diskpipe/diskpipe/controllers/virtualmachine"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.RunTests(m, &env) }

var once sync.Once

func setup(t *testing.T) string {
	t.Helper()
	once.Do(func() {
		if _, err := ctrltest.StartManager(env, manager.Options{}); err != nil {
			t.Fatal(err)
		}
	})
	ns, err := env.CreateNamespace(t.Context(), "vm")
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// seedVM reads seed 000's VirtualMachine into namespace ns.
func seedVM(t *testing.T, ns string) *vmv1.VirtualMachine {
	t.Helper()
	b, err := os.ReadFile(testenv.Path("test", "fixtures", "seeds", "000-virtualmachine.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	vm := &vmv1.VirtualMachine{}
	if err := yaml.UnmarshalStrict(b, vm); err != nil {
		t.Fatal(err)
	}
	vm.Namespace = ns
	return vm
}

func vmStatus(t *testing.T, vm *vmv1.VirtualMachine) func() *vmv1.VirtualMachineStatus {
	return func() *vmv1.VirtualMachineStatus {
		_ = env.Client.Get(t.Context(), client.ObjectKeyFromObject(vm), vm)
		return &vm.Status
	}
}

func ready(st *vmv1.VirtualMachineStatus) string {
	if c := meta.FindStatusCondition(st.Conditions, common.ConditionReady); c != nil {
		return string(st.Phase) + " " + c.Reason + ": " + c.Message
	}
	return string(st.Phase)
}

// kubeVirtVM reads the KubeVirt VM the apiserver stored for the seed's VM (vm1) and decodes
// it with KubeVirt's own types, strictly: a field KubeVirt does not know fails the test.
func kubeVirtVM(t *testing.T, ns string) *kubevirtv1.VirtualMachine {
	t.Helper()
	const name = "vm1"
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("kubevirt.io/v1")
	u.SetKind("VirtualMachine")
	NewWithT(t).Eventually(func() error { return env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, u) },
		20*time.Second).Should(Succeed())
	b, err := json.Marshal(u.Object)
	if err != nil {
		t.Fatal(err)
	}
	kv := &kubevirtv1.VirtualMachine{}
	if err := virtualmachine.StrictDecode(b, kv); err != nil {
		t.Fatalf("the KubeVirt VirtualMachine does not decode strictly: %v\n%s", err, b)
	}
	return kv
}

// TestSeedVirtualMachine is seed 000's VM: its blank diskVolumeTemplate becomes a DiskVolume it
// owns; once that is Ready, a KubeVirt VirtualMachine with the seed's hardware, the template's
// disk bound to its PVC, the user's own volumes untouched, memory 1024 read as MiB and the IP
// pool as Calico's annotation. KubeVirt's printable status comes back.
func TestSeedVirtualMachine(t *testing.T) {
	ns := setup(t)
	g := NewWithT(t)
	vm := seedVM(t, ns)
	g.Expect(env.Client.Create(t.Context(), vm)).To(Succeed())

	dv := &diskvolume.DiskVolume{}
	g.Eventually(func() error {
		return env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "disk0-vm-blank"}, dv)
	}, 20*time.Second).Should(Succeed())
	g.Expect(metav1.IsControlledBy(dv, vm)).To(BeTrue())
	g.Expect(dv.Spec.Source.Blank).NotTo(BeNil())
	g.Expect(dv.Spec.Resources.Requests.Storage.String()).To(Equal("4Gi"))
	g.Eventually(vmStatus(t, vm), 20*time.Second).Should(WithTransform(ready, HavePrefix("Pending WaitingForDisks: waiting for DiskVolumes: disk0-vm-blank (")))
	g.Expect(vm.Status.DiskVolumes).To(Equal([]string{"disk0-vm-blank"}))

	ctrltest.Fill(t, env, ns, disk.PrimeName(dv.UID), "disk0-vm-blank-blank-0", "disk0-vm-blank", transfer.Result{Format: "raw", VirtualSize: 4037017600})
	kv := kubeVirtVM(t, ns)
	g.Expect(metav1.IsControlledBy(kv, vm)).To(BeTrue())
	g.Expect(*kv.Spec.RunStrategy).To(Equal(kubevirtv1.RunStrategyAlways))
	g.Expect(kv.Spec.Template.ObjectMeta.Annotations).To(HaveKeyWithValue(virtualmachine.AnnotationIPPool, `["p1"]`))
	spec := kv.Spec.Template.Spec
	g.Expect(spec.Hostname).To(Equal("vm-test"))
	g.Expect(spec.Domain.CPU.Cores).To(Equal(uint32(2)))
	mem := spec.Domain.Resources.Requests[corev1.ResourceMemory]
	g.Expect(mem.Cmp(resource.MustParse("1Gi"))).To(Equal(0), "memory: 1024 is 1024 MiB, got %s", mem.String())
	volumes := map[string]string{}
	for _, v := range spec.Volumes {
		switch {
		case v.PersistentVolumeClaim != nil:
			volumes[v.Name] = "pvc/" + v.PersistentVolumeClaim.ClaimName
		case v.CloudInitNoCloud != nil:
			volumes[v.Name] = "cloudinit:" + strings.SplitN(v.CloudInitNoCloud.UserData, "\n", 2)[0]
		}
	}
	g.Expect(volumes).To(Equal(map[string]string{
		"disk0-vm-blank": "pvc/disk0-vm-blank",   // the template's disk, bound to its DiskVolume's PVC
		"disk1":          "pvc/disk1-from-image", // the user's volume, as written
		"cloudinitdisk":  "cloudinit:#cloud-config",
	}))
	g.Eventually(vmStatus(t, vm), 20*time.Second).Should(WithTransform(ready, Equal("Ready VirtualMachineCreated: the KubeVirt VirtualMachine vm1 exists")))

	// KubeVirt reports; the VM mirrors it.
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("kubevirt.io/v1")
	u.SetKind("VirtualMachine")
	g.Expect(env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "vm1"}, u)).To(Succeed())
	g.Expect(unstructured.SetNestedField(u.Object, "Running", "status", "printableStatus")).To(Succeed())
	g.Expect(env.Client.Update(t.Context(), u)).To(Succeed())
	g.Eventually(func() string { return vmStatus(t, vm)().PrintableStatus }, 20*time.Second).Should(Equal("Running"))

	// KubeVirt completes the spec (its controller writes the firmware's UUID back): diskpipe
	// leaves what KubeVirt wrote, rather than fight over it, until the VM's own spec changes.
	g.Expect(env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "vm1"}, u)).To(Succeed())
	g.Expect(unstructured.SetNestedField(u.Object, "6a1a2b3c-0000-4000-8000-000000000001", "spec", "template", "spec", "domain", "firmware", "uuid")).To(Succeed())
	g.Expect(env.Client.Update(t.Context(), u)).To(Succeed())
	written := u.GetResourceVersion()
	g.Expect(env.Client.Get(t.Context(), client.ObjectKeyFromObject(vm), vm)).To(Succeed())
	base := vm.DeepCopy()
	vm.Labels = map[string]string{"touched": "yes"} // a reconcile
	g.Expect(env.Client.Patch(t.Context(), vm, client.MergeFrom(base))).To(Succeed())
	g.Consistently(func() string {
		g.Expect(env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "vm1"}, u)).To(Succeed())
		return u.GetResourceVersion()
	}, 3*time.Second).Should(Equal(written), "KubeVirt's fields are left as KubeVirt wrote them")
	g.Expect(env.Client.Get(t.Context(), client.ObjectKeyFromObject(vm), vm)).To(Succeed())
	base = vm.DeepCopy()
	halted := vmv1.RunStrategy("Halted")
	vm.Spec.RunStrategy = &halted
	g.Expect(env.Client.Patch(t.Context(), vm, client.MergeFrom(base))).To(Succeed())
	g.Eventually(func() kubevirtv1.VirtualMachineRunStrategy { return *kubeVirtVM(t, ns).Spec.RunStrategy }, 20*time.Second).
		Should(Equal(kubevirtv1.RunStrategyHalted), "a change of the VM's own spec is written")
}

// TestInvalidHardware: a field KubeVirt does not know fails the VM with the field's name,
// before any disk is made.
func TestInvalidHardware(t *testing.T) {
	ns := setup(t)
	g := NewWithT(t)
	vm := seedVM(t, ns)
	vm.Name = "typo"
	vm.Spec.Hardware.Raw = []byte(`{"domain":{"devices":{},"cpuu":{"cores":2}}}`)
	g.Expect(env.Client.Create(t.Context(), vm)).To(Succeed())
	g.Eventually(vmStatus(t, vm), 20*time.Second).Should(WithTransform(ready, And(
		Equal(`Failed InvalidHardware: spec.hardware is not a KubeVirt VirtualMachineInstance spec: unknown field "domain.cpuu"`))))
	g.Expect(env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "disk0-vm-blank"}, &diskvolume.DiskVolume{})).NotTo(Succeed())
}

// TestHostDiskRefused: a hostDisk volume (files on the node) fails the VM unless the
// installation allows it, even where no admission webhook refused it first.
func TestHostDiskRefused(t *testing.T) {
	ns := setup(t)
	g := NewWithT(t)
	vm := seedVM(t, ns)
	vm.Name = "hostdisk"
	vm.Spec.Hardware.Raw = []byte(`{"domain":{"devices":{}},"volumes":[{"name":"node","hostDisk":{"path":"/etc/kubernetes/admin.conf","type":"Disk"}}]}`)
	g.Expect(env.Client.Create(t.Context(), vm)).To(Succeed())
	g.Eventually(vmStatus(t, vm), 20*time.Second).Should(WithTransform(ready, ContainSubstring(
		`Failed InvalidHardware: volume "node" of spec.hardware is a hostDisk (/etc/kubernetes/admin.conf on the node)`)))
}

// TestDiskMadeOutside: a DiskVolume that exists before the VM, named like its template, is
// used but not taken over: the VM does not own it, so deleting the VM keeps it.
func TestDiskMadeOutside(t *testing.T) {
	ns := setup(t)
	g := NewWithT(t)
	q := resource.MustParse("1Gi")
	outside := &diskvolume.DiskVolume{ObjectMeta: metav1.ObjectMeta{Name: "disk0-vm-blank", Namespace: ns},
		Spec: diskvolume.DiskVolumeSpec{Source: diskvolume.DiskVolumeSource{Blank: &common.BlankSource{}}}}
	outside.Spec.Resources.Requests.Storage = &q
	g.Expect(env.Client.Create(t.Context(), outside)).To(Succeed())
	ctrltest.Fill(t, env, ns, disk.PrimeName(outside.UID), "disk0-vm-blank-blank-0", "disk0-vm-blank", transfer.Result{Format: "raw", VirtualSize: 1 << 30})

	vm := seedVM(t, ns)
	g.Expect(env.Client.Create(t.Context(), vm)).To(Succeed())
	kv := kubeVirtVM(t, ns)
	g.Expect(kv.Spec.Template.Spec.Volumes).To(ContainElement(HaveField("Name", "disk0-vm-blank")))
	g.Expect(env.Client.Get(t.Context(), client.ObjectKeyFromObject(outside), outside)).To(Succeed())
	g.Expect(metav1.GetControllerOf(outside)).To(BeNil())
}

// TestMadeAgain: a VM deleted and made again before its earlier self's DiskVolume and KubeVirt
// VM are gone (a guest's shutdown takes its grace period) waits for each name, says so, and
// uses neither of the old ones: its own are made once they are gone.
func TestMadeAgain(t *testing.T) {
	ns := setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	q := resource.MustParse("1Gi")
	// The old disk waits for an image, so that it made no children the garbage collector
	// (which envtest does not run) would delete.
	oldDisk := &diskvolume.DiskVolume{ObjectMeta: metav1.ObjectMeta{Name: "disk0-vm-blank", Namespace: ns, Finalizers: []string{"diskpipe.test/in-use"}},
		Spec: diskvolume.DiskVolumeSpec{Source: diskvolume.DiskVolumeSource{Image: &diskvolume.ImageSource{Name: "missing", Kind: diskvolume.ImageKindVirtualMachineImage}}}}
	oldDisk.Spec.Resources.Requests.Storage = &q
	oldVM := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
		"metadata": map[string]any{"name": "vm1", "namespace": ns, "finalizers": []any{"diskpipe.test/shutting-down"}},
		"spec":     map[string]any{"runStrategy": "Halted", "template": map[string]any{"spec": map[string]any{"domain": map[string]any{"devices": map[string]any{}}}}}}}
	for _, old := range []client.Object{oldDisk, oldVM} {
		g.Expect(env.Client.Create(ctx, old)).To(Succeed())
		g.Expect(env.Client.Delete(ctx, old)).To(Succeed())
	}

	vm := seedVM(t, ns)
	g.Expect(env.Client.Create(ctx, vm)).To(Succeed())
	g.Eventually(vmStatus(t, vm), 20*time.Second).Should(WithTransform(ready, Equal(
		"Pending WaitingForDisks: waiting for DiskVolumes: disk0-vm-blank (an earlier DiskVolume of this name is being deleted)")))
	g.Expect(ctrltest.Update(ctx, env.Client, oldDisk, func() { oldDisk.Finalizers = nil })).To(Succeed())
	d := &diskvolume.DiskVolume{}
	g.Eventually(func() bool {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "disk0-vm-blank"}, d) == nil && metav1.IsControlledBy(d, vm)
	}, 20*time.Second).Should(BeTrue(), "the VM's own disk, made once the name is free")
	ctrltest.Fill(t, env, ns, disk.PrimeName(d.UID), "disk0-vm-blank-blank-0", "disk0-vm-blank", transfer.Result{Format: "raw", VirtualSize: 1 << 30})

	g.Eventually(vmStatus(t, vm), 20*time.Second).Should(WithTransform(ready, Equal(
		"Pending NameTerminating: a VirtualMachine named vm1, not made for this object (most often an earlier object's of the same name), is still being deleted: this object's is made once it is gone")))
	g.Expect(ctrltest.Update(ctx, env.Client, oldVM, func() { oldVM.SetFinalizers(nil) })).To(Succeed())
	kv := kubeVirtVM(t, ns)
	g.Eventually(func() bool {
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(kv), kv)
		return metav1.IsControlledBy(kv, vm)
	}, 20*time.Second).Should(BeTrue())
}

// TestKubeVirtInstalledLater: diskpipe installed before KubeVirt. Its manager starts without
// KubeVirt's CRD, a VM made meanwhile says that it waits for KubeVirt, and its KubeVirt VM is
// made once the CRD is there.
func TestKubeVirtInstalledLater(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	e, err := testenv.StartWith(testenv.Options{WithoutKubeVirt: true})
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { g.Expect(e.Stop()).To(Succeed()) }()
	_, err = ctrltest.StartManager(e, manager.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	ns, err := e.CreateNamespace(ctx, "later")
	g.Expect(err).NotTo(HaveOccurred())
	q := resource.MustParse("1Gi")
	d := &diskvolume.DiskVolume{ObjectMeta: metav1.ObjectMeta{Name: "disk0-vm-blank", Namespace: ns},
		Spec: diskvolume.DiskVolumeSpec{Source: diskvolume.DiskVolumeSource{Blank: &common.BlankSource{}}}}
	d.Spec.Resources.Requests.Storage = &q
	g.Expect(e.Client.Create(ctx, d)).To(Succeed())
	ctrltest.Fill(t, e, ns, disk.PrimeName(d.UID), "disk0-vm-blank-blank-0", "disk0-vm-blank", transfer.Result{Format: "raw", VirtualSize: 1 << 30})

	vm := seedVM(t, ns)
	g.Expect(e.Client.Create(ctx, vm)).To(Succeed())
	status := func() string {
		_ = e.Client.Get(ctx, client.ObjectKeyFromObject(vm), vm)
		return ready(&vm.Status)
	}
	g.Eventually(status, 20*time.Second).Should(ContainSubstring(" WaitingForKubeVirt: KubeVirt is not installed"))

	g.Expect(e.InstallKubeVirtCRD()).To(Succeed())
	g.Eventually(status, 30*time.Second).Should(HavePrefix("Ready VirtualMachineCreated"))
	kv := &unstructured.Unstructured{}
	kv.SetAPIVersion("kubevirt.io/v1")
	kv.SetKind("VirtualMachine")
	g.Expect(e.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: vm.Name}, kv)).To(Succeed())
	g.Expect(metav1.IsControlledBy(kv, vm)).To(BeTrue())
}
