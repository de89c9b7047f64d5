package cdi_test

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	sdkapi "kubevirt.io/controller-lifecycle-operator-sdk/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/admission"
	"github.com/diskpipe/diskpipe/controllers/cdi"
	cdipolicy "github.com/diskpipe/diskpipe/controllers/cdi/policy"
	"github.com/diskpipe/diskpipe/controllers/disk"
	"github.com/diskpipe/diskpipe/controllers/image"
	"github.com/diskpipe/diskpipe/controllers/internal/ctrltest"
	"github.com/diskpipe/diskpipe/controllers/internal/hostcopy"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
	"github.com/diskpipe/diskpipe/controllers/manager"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore/objectstoretest"
	"github.com/diskpipe/diskpipe/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	hostcopy.ServingPoll = time.Hour // a copy from another namespace is woken by its clone source's pod
	testenv.RunTests(m, &env)
}

const managerUser = "system:serviceaccount:diskpipe-system:diskpipe-manager"

// classWFFC is a StorageClass that binds a claim at its first consumer.
const classWFFC = "csi-wffc"

// setup installs CDI's CRDs as the chart does and starts the manager serving them, with
// nothing but the chart's RBAC.
func setup(t *testing.T) {
	t.Helper()
	setupOnce.Do(func() { start(t) })
}

var setupOnce sync.Once

// store is the bundled store the manager uses.
var store *objectstoretest.Server

func start(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	g.Expect(env.InstallCDICRDs()).To(Succeed())
	g.Expect(env.Client.Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "csi",
		Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}}, Provisioner: "csi.diskpipe.test"})).To(Succeed())
	g.Expect(env.Client.Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: classWFFC}, Provisioner: "csi.diskpipe.test",
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)})).To(Succeed())
	host, port, certDir, err := env.InstallWebhooks(ctx, admission.Configuration("diskpipe-system", "diskpipe-webhook", nil, cdipolicy.SourceKinds()...),
		cdi.ProfileHookConfiguration("diskpipe-system", "diskpipe-webhook", nil))
	g.Expect(err).NotTo(HaveOccurred())
	user, err := env.ApplyChartRBAC(ctx, "diskpipe-system", "cdi.compatibility.enabled=true")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(user).To(Equal(managerUser))
	cfg, err := env.UserConfig(managerUser)
	g.Expect(err).NotTo(HaveOccurred())
	// The bundled store, where the upload proxy keeps uploads and the image controller looks for them.
	var stop func()
	store, stop = objectstoretest.StartShared(env.TempDir())
	env.OnStop(stop)
	storeConfig := store.ClientConfig()
	storeConfig.Region = "us-east-1"
	_, err = ctrltest.StartManagerAs(env, cfg, manager.Options{CDICompatibility: true, ObjectStore: &storeConfig, Namespace: "diskpipe-system",
		Webhook:  &manager.WebhookOptions{Host: host, Port: port, CertDir: certDir},
		Importer: importpod.Config{FilesystemOverhead: importpod.FilesystemOverhead{Default: ptr.To(0.2), StorageClasses: map[string]float64{"thick": 0.3}}}})
	g.Expect(err).NotTo(HaveOccurred())
}

func dataVolume(ns, name string, src *cdiv1.DataVolumeSource, size string) *cdiv1.DataVolume {
	return &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: cdiv1.DataVolumeSpec{Source: src, Storage: &cdiv1.StorageSpec{
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *ctrltest.Quantity(size)}}}}}
}

// dvState is what KubeVirt reads of a DataVolume: "phase progress Bound/Ready/Running" with each
// condition's status and reason.
func dvState(t *testing.T, dv *cdiv1.DataVolume) func() string {
	return func() string {
		if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(dv), dv); err != nil {
			return err.Error()
		}
		s := string(dv.Status.Phase) + " " + string(dv.Status.Progress)
		for _, c := range dv.Status.Conditions {
			s += " " + string(c.Type) + "=" + string(c.Status) + ":" + c.Reason
		}
		return s
	}
}

// TestDataVolume: a blank DataVolume is made by a DiskVolume of its name, which it controls;
// its status follows the disk's in CDI's words, and it succeeds only once its claim is bound
// to the filled volume. spec.storage asks for the disk's size (the claim is larger by the
// filesystem's share); spec.pvc for the claim's.
func TestDataVolume(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "dv")
	g.Expect(err).NotTo(HaveOccurred())

	dv := dataVolume(ns, "data", &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, "1Gi")
	g.Expect(env.Client.Create(ctx, dv)).To(Succeed())
	d := &diskvolume.DiskVolume{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "data"}, d) }, 20*time.Second).Should(Succeed())
	g.Expect(metav1.IsControlledBy(d, dv)).To(BeTrue(), "the DataVolume controls its DiskVolume: %v", d.OwnerReferences)
	g.Expect(d.Spec.Source.Blank).NotTo(BeNil())
	g.Expect(d.Spec.Resources.Requests.Storage.Value()).To(Equal(transfer.VolumeSizeFor(1<<30, 0.2)), "1Gi of disk in a claim keeping 20 %% free")

	pod := "data-blank-0"
	ctrltest.Pod(t, env, ns, pod)
	ctrltest.Bind(t, env, ns, disk.PrimeName(d.UID))
	ctrltest.Kubelet(t, env, ns, pod, corev1.PodRunning, nil, 0)
	g.Eventually(dvState(t, dv), 20*time.Second).Should(Equal("ImportInProgress N/A Bound=False:Pending Ready=False: Running=True:"))
	g.Expect(dv.Status.ClaimName).To(Equal("data"))
	pvc := &corev1.PersistentVolumeClaim{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "data"}, pvc)).To(Succeed())
	g.Expect(pvc.Status.Phase).NotTo(Equal(corev1.ClaimBound), "the claim waits, unbound, for the whole disk")
	// As under CDI, the DataVolume controls its claim (KubeVirt finds the DataVolume of a VM's
	// claim so); its DiskVolume owns it beside, and goes first. The prime is the DiskVolume's.
	g.Expect(metav1.IsControlledBy(pvc, dv)).To(BeTrue(), "the DataVolume controls its claim: %v", pvc.OwnerReferences)
	g.Expect(pvc.OwnerReferences).To(ContainElement(metav1.OwnerReference{APIVersion: diskvolume.GroupVersion.String(), Kind: "DiskVolume",
		Name: "data", UID: d.UID, BlockOwnerDeletion: ptr.To(true)}))
	prime := &corev1.PersistentVolumeClaim{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: disk.PrimeName(d.UID)}, prime)).To(Succeed())
	g.Expect(metav1.IsControlledBy(prime, d)).To(BeTrue(), "the DiskVolume controls the prime it fills: %v", prime.OwnerReferences)
	// A DataSource of the DataVolume's claim is ready once the DataVolume has succeeded.
	ds := &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: ns},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: ns, Name: "data"}}}}
	g.Expect(env.Client.Create(ctx, ds)).To(Succeed())
	dsReady := func() string {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(ds), ds); err != nil || len(ds.Status.Conditions) == 0 {
			return fmt.Sprint(err)
		}
		return string(ds.Status.Conditions[0].Status) + " " + ds.Status.Conditions[0].Reason
	}
	g.Eventually(dsReady, 20*time.Second).Should(Equal("False NotReady"))
	ctrltest.Fill(t, env, ns, disk.PrimeName(d.UID), pod, "data", transfer.Result{Format: "raw", VirtualSize: 1 << 30})
	g.Eventually(dvState(t, dv), 20*time.Second).Should(Equal("Succeeded 100.0% Bound=True:Bound Ready=True: Running=False:Completed"))
	g.Eventually(dsReady, 20*time.Second).Should(Equal("True Ready"))
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "data"}, pvc)).To(Succeed())
	g.Expect(pvc.Status.Phase).To(Equal(corev1.ClaimBound))

	// The DiskVolume deleted on its own (envtest runs no garbage collector, which would leave
	// the claim only its DataVolume; the claim's mark and label say which disk made it): the
	// whole claim stays the DataVolume's, with its data, and no DiskVolume is made again.
	g.Expect(env.Client.Delete(ctx, d)).To(Succeed())
	kept := &corev1.PersistentVolumeClaim{}
	g.Eventually(func() map[string]string {
		g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "data"}, kept)).To(Succeed())
		return kept.Labels
	}, 20*time.Second).ShouldNot(HaveKey(disk.LabelDisk), "the kept claim is the DataVolume's own, no disk's")
	g.Expect(kept.UID).To(Equal(pvc.UID))
	g.Expect(kept.Spec.VolumeName).To(Equal(pvc.Spec.VolumeName))
	g.Expect(metav1.IsControlledBy(kept, dv)).To(BeTrue())
	g.Consistently(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "data"}, &diskvolume.DiskVolume{})
	}, 3*time.Second).Should(Satisfy(apierrors.IsNotFound), "no DiskVolume is made again over the kept claim")
	g.Expect(dvState(t, dv)()).To(HavePrefix("Succeeded 100.0%"))
	g.Eventually(eventNote(t, dv, "ClaimKept"), 20*time.Second).Should(HavePrefix("PVC data outlived the DiskVolume that made it"))

	// A DiskVolume deleted on its own before its claim was whole: the claim held nothing, and
	// goes; the disk is made again, into a claim of its own.
	unfinished := dataVolume(ns, "unfinished", &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, "1Gi")
	g.Expect(env.Client.Create(ctx, unfinished)).To(Succeed())
	first := &diskvolume.DiskVolume{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "unfinished"}, first) }, 20*time.Second).Should(Succeed())
	ctrltest.Pod(t, env, ns, "unfinished-blank-0")
	ctrltest.Bind(t, env, ns, disk.PrimeName(first.UID))
	left := &corev1.PersistentVolumeClaim{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "unfinished"}, left) }, 20*time.Second).Should(Succeed())
	g.Expect(env.Client.Delete(ctx, first)).To(Succeed())
	g.Eventually(func() bool {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(left), left)
		return apierrors.IsNotFound(err) || err == nil && !left.DeletionTimestamp.IsZero()
	}, 20*time.Second).Should(BeTrue(), "the unfinished claim is deleted")
	g.Eventually(eventNote(t, unfinished, "ClaimRemade"), 20*time.Second).Should(HavePrefix("PVC unfinished outlived the DiskVolume that was making it"))
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(left), left); err == nil {
		left.Finalizers = nil // as kube-controller-manager's pvc-protection does, once no pod uses it
		g.Expect(env.Client.Update(ctx, left)).To(Succeed())
	}
	again := &diskvolume.DiskVolume{}
	g.Eventually(func() bool {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "unfinished"}, again) == nil && again.UID != first.UID
	}, 20*time.Second).Should(BeTrue(), "the disk is made again")

	exact := dataVolume(ns, "exact", &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, "2Gi")
	exact.Spec.PVC, exact.Spec.Storage = &corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
		VolumeMode: ptr.To(corev1.PersistentVolumeBlock), Resources: exact.Spec.Storage.Resources}, nil
	exact.Spec.Preallocation = ptr.To(true)
	g.Expect(env.Client.Create(ctx, exact)).To(Succeed())
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "exact"}, d) }, 20*time.Second).Should(Succeed())
	g.Expect(d.Spec.Resources.Requests.Storage.String()).To(Equal("2Gi"), "spec.pvc is the claim's own size")
	g.Expect(d.Spec.AccessModes).To(Equal([]corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}))
	g.Expect(*d.Spec.VolumeMode).To(Equal(corev1.PersistentVolumeBlock))
	g.Expect(*d.Spec.Preallocation).To(BeTrue())
}

// TestDataVolumeRefusals: what cannot be made says why, in the DataVolume's conditions, and
// nothing is written: a DiskVolume of the name that is not the DataVolume's, a source not
// served yet, a spec that cannot be served. A DataVolume marked pre-populated adopts its claim.
func TestDataVolumeRefusals(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "dv-refusals")
	g.Expect(err).NotTo(HaveOccurred())

	mine := &diskvolume.DiskVolume{ObjectMeta: metav1.ObjectMeta{Name: "taken", Namespace: ns},
		Spec: diskvolume.DiskVolumeSpec{Source: diskvolume.DiskVolumeSource{Blank: &common.BlankSource{}}}}
	mine.Spec.Resources.Requests.Storage = ctrltest.Quantity("1Gi")
	g.Expect(env.Client.Create(ctx, mine)).To(Succeed())
	taken := dataVolume(ns, "taken", &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, "1Gi")
	g.Expect(env.Client.Create(ctx, taken)).To(Succeed())
	g.Eventually(dvState(t, taken), 20*time.Second).Should(Equal("Pending N/A Bound=False:ErrResourceExists Ready=False: Running=False:ErrResourceExists"))
	g.Expect(taken.Status.Conditions[0].Message).To(Equal("DiskVolume taken already exists and is not managed by DataVolume taken"))

	// A DataVolume made again before its earlier self's DiskVolume is gone waits for the name.
	old := &diskvolume.DiskVolume{ObjectMeta: metav1.ObjectMeta{Name: "again", Namespace: ns, Finalizers: []string{"diskpipe.test/in-use"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: cdiv1.SchemeGroupVersion.String(), Kind: "DataVolume", Name: "again",
			UID: "0e4a3c1e-7d62-4b44-9c4e-1d9a50b1e0aa", Controller: ptr.To(true)}}},
		Spec: diskvolume.DiskVolumeSpec{Source: diskvolume.DiskVolumeSource{Blank: &common.BlankSource{}}}}
	old.Spec.Resources.Requests.Storage = ctrltest.Quantity("1Gi")
	g.Expect(env.Client.Create(ctx, old)).To(Succeed())
	g.Expect(env.Client.Delete(ctx, old)).To(Succeed())
	again := dataVolume(ns, "again", &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, "1Gi")
	g.Expect(env.Client.Create(ctx, again)).To(Succeed())
	g.Eventually(dvState(t, again), 20*time.Second).Should(Equal("Pending N/A Bound=False:NameTerminating Ready=False: Running=False:NameTerminating"))
	g.Expect(again.Status.Conditions[0].Message).To(HavePrefix("a DiskVolume named again, not made for this object"))
	g.Expect(ctrltest.Update(ctx, env.Client, old, func() { old.Finalizers = nil })).To(Succeed())
	g.Eventually(func() bool {
		d := &diskvolume.DiskVolume{}
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "again"}, d) == nil && metav1.IsControlledBy(d, again)
	}, 20*time.Second).Should(BeTrue(), "made once the name is free")
	// Nor is a claim being deleted adopted, though the DataVolume allows it.
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "adoptee", Namespace: ns, Finalizers: []string{"diskpipe.test/in-use"}},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	g.Expect(env.Client.Create(ctx, claim)).To(Succeed())
	g.Expect(env.Client.Delete(ctx, claim)).To(Succeed())
	adoptee := dataVolume(ns, "adoptee", &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, "1Gi")
	adoptee.Annotations = map[string]string{cdi.AnnAllowClaimAdoption: "true"}
	g.Expect(env.Client.Create(ctx, adoptee)).To(Succeed())
	g.Eventually(dvState(t, adoptee), 20*time.Second).Should(Equal("Pending N/A Bound=False:NameTerminating Ready=False: Running=False:NameTerminating"))
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(claim), claim)).To(Succeed())
	g.Expect(metav1.GetControllerOf(claim)).To(BeNil(), "not taken")

	gcs := dataVolume(ns, "gcs", &cdiv1.DataVolumeSource{GCS: &cdiv1.DataVolumeSourceGCS{URL: "gs://bucket/fedora.qcow2"}}, "1Gi")
	g.Expect(env.Client.Create(ctx, gcs)).To(Succeed())
	g.Eventually(dvState(t, gcs), 20*time.Second).Should(Equal("Pending N/A Bound=False:SourceNotServed Ready=False: Running=False:SourceNotServed"))
	g.Expect(gcs.Status.Conditions[0].Message).To(ContainSubstring("not gcs (an https URL of the object as an http source"))

	sizeless := dataVolume(ns, "sizeless", &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, "1Gi")
	sizeless.Spec.Storage.Resources = corev1.VolumeResourceRequirements{}
	g.Expect(env.Client.Create(ctx, sizeless)).To(Succeed())
	g.Eventually(dvState(t, sizeless), 20*time.Second).Should(Equal("Failed N/A Bound=False:InvalidSpec Ready=False: Running=False:InvalidSpec"))
	g.Expect(sizeless.Status.Conditions[0].Message).To(Equal("a DataVolume of source blank needs a size: spec.storage.resources.requests.storage"))

	// KubeVirt's restore and a volume kept from CDI: the claim exists and is whole.
	kept := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "kept", Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *ctrltest.Quantity("1Gi")}}}}
	g.Expect(env.Client.Create(ctx, kept)).To(Succeed())
	ctrltest.Bind(t, env, ns, "kept")
	adopt := dataVolume(ns, "kept", &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://images.example.com/a.qcow2"}}, "1Gi")
	adopt.Annotations = map[string]string{cdiv1.AnnPrePopulated: "true"} // KubeVirt's restore writes "true": the claim is the DataVolume's own
	g.Expect(env.Client.Create(ctx, adopt)).To(Succeed())
	g.Eventually(dvState(t, adopt), 20*time.Second).Should(Equal("Succeeded 100.0% Bound=True:Bound Ready=True:PrePopulated Running=False:PrePopulated"))
	g.Consistently(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "kept"}, &diskvolume.DiskVolume{})
	},
		2*time.Second).ShouldNot(Succeed(), "nothing is made for a pre-populated claim")
	// The claim, which nothing controlled (KubeVirt's restore makes it so), is the DataVolume's
	// now, with its content type, as CDI takes it: the VM's deletion takes it along, and
	// KubeVirt's export reads it as a disk.
	g.Eventually(func() string {
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(kept), kept)
		return fmt.Sprint(metav1.IsControlledBy(kept, adopt), " ", kept.Annotations[cdi.AnnContentType])
	}, 20*time.Second).Should(Equal("true kubevirt"))
	// A pre-populated claim another object controls is left to it.
	theirs := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: ns}}
	g.Expect(env.Client.Create(ctx, theirs)).To(Succeed())
	held := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "held", Namespace: ns,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "owner", UID: theirs.UID, Controller: ptr.To(true)}}},
		Spec: kept.Spec}
	held.Spec.VolumeName = ""
	g.Expect(env.Client.Create(ctx, held)).To(Succeed())
	ctrltest.Bind(t, env, ns, "held")
	other := dataVolume(ns, "held", &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, "1Gi")
	other.Annotations = map[string]string{cdiv1.AnnPrePopulated: "held"}
	g.Expect(env.Client.Create(ctx, other)).To(Succeed())
	g.Eventually(dvState(t, other), 20*time.Second).Should(HavePrefix("Succeeded"))
	g.Consistently(func() string {
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(held), held)
		return fmt.Sprint(metav1.GetControllerOf(held).Kind, " ", held.Annotations[cdi.AnnContentType])
	}, 2*time.Second).Should(Equal("ConfigMap "))
}

// TestCDIObjects: with CDI's API served, the manager keeps the one CDI object (Deployed) and the
// CDIConfig "config" whose status says the filesystem overhead diskpipe keeps, per class, as
// KubeVirt reads it to size a VM's disk image, and the upload proxy's URL as its spec overrides
// it; a status overwritten is put back.
func TestCDIObjects(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	c := &cdiv1.CDI{}
	g.Eventually(func() sdkapi.Phase {
		_ = env.Client.Get(ctx, client.ObjectKey{Name: "cdi"}, c)
		return c.Status.Phase
	}, 20*time.Second).Should(Equal(sdkapi.PhaseDeployed))
	config := &cdiv1.CDIConfig{}
	overhead := func() *cdiv1.FilesystemOverhead {
		if env.Client.Get(ctx, client.ObjectKey{Name: "config"}, config) != nil {
			return nil
		}
		return config.Status.FilesystemOverhead
	}
	want := &cdiv1.FilesystemOverhead{Global: "0.2", StorageClass: map[string]cdiv1.Percent{"thick": "0.3"}}
	g.Eventually(overhead, 20*time.Second).Should(Equal(want))
	g.Expect(config.Labels).To(HaveKeyWithValue("app.kubernetes.io/managed-by", "diskpipe"))

	config.Status.FilesystemOverhead = &cdiv1.FilesystemOverhead{Global: "0.5"}
	g.Expect(env.Client.Update(ctx, config)).To(Succeed())
	keeper := &cdi.Config{Client: env.Client, FilesystemOverhead: importpod.FilesystemOverhead{Default: ptr.To(0.2), StorageClasses: map[string]float64{"thick": 0.3}}}
	g.Expect(keeper.Sync(ctx)).To(Succeed())
	g.Expect(overhead()).To(Equal(want))

	// The administrator's spec.uploadProxyURLOverride is the URL virtctl reads, at once (the
	// keeper's own pass is a minute apart); taken away, the chart's (none here) is back.
	uploadURL := func() string {
		g.Expect(env.Client.Get(ctx, client.ObjectKey{Name: "config"}, config)).To(Succeed())
		return ptr.Deref(config.Status.UploadProxyURL, "<none>")
	}
	g.Expect(uploadURL()).To(Equal("<none>"))
	g.Expect(ctrltest.Update(ctx, env.Client, config, func() { config.Spec.UploadProxyURLOverride = ptr.To("https://upload.example.com") })).To(Succeed())
	g.Eventually(uploadURL, 10*time.Second).Should(Equal("https://upload.example.com"))
	g.Expect(ctrltest.Update(ctx, env.Client, config, func() { config.Spec.UploadProxyURLOverride = nil })).To(Succeed())
	g.Eventually(uploadURL, 10*time.Second).Should(Equal("<none>"))

	// What HCO writes, the CDI object's spec.config, is read as CDI reads it: it becomes the
	// CDIConfig's spec.
	g.Expect(ctrltest.Update(ctx, env.Client, c, func() {
		c.Spec.Config = &cdiv1.CDIConfigSpec{UploadProxyURLOverride: ptr.To("https://hco.example.com")}
	})).To(Succeed())
	g.Expect(keeper.Sync(ctx)).To(Succeed())
	g.Expect(uploadURL()).To(Equal("https://hco.example.com"))
	g.Expect(config.Spec.UploadProxyURLOverride).To(Equal(ptr.To("https://hco.example.com")))
	g.Expect(ctrltest.Update(ctx, env.Client, c, func() { c.Spec.Config = nil })).To(Succeed())
	g.Expect(ctrltest.Update(ctx, env.Client, config, func() { config.Spec.UploadProxyURLOverride = nil })).To(Succeed())

	// The administrator's spec.filesystemOverhead sizes the volumes made from now on, before
	// the chart's values: its class's, else its global (which replaces the chart's "thick"
	// too); its status says so at once. Taken away, the chart's are back.
	g.Expect(ctrltest.Update(ctx, env.Client, config, func() {
		config.Spec.FilesystemOverhead = &cdiv1.FilesystemOverhead{Global: "0.1", StorageClass: map[string]cdiv1.Percent{"quick": "0.04"}}
	})).To(Succeed())
	t.Cleanup(func() {
		_ = ctrltest.Update(context.Background(), env.Client, config, func() { config.Spec.FilesystemOverhead = nil })
	})
	g.Eventually(overhead, 10*time.Second).Should(Equal(&cdiv1.FilesystemOverhead{Global: "0.1",
		StorageClass: map[string]cdiv1.Percent{"quick": "0.04", "thick": "0.1"}}))
	ns, err := env.CreateNamespace(ctx, "overhead")
	g.Expect(err).NotTo(HaveOccurred())
	d := &diskvolume.DiskVolume{}
	for _, tc := range []struct {
		class    string
		overhead float64
	}{{"", 0.1}, {"quick", 0.04}, {"thick", 0.1}} {
		dv := dataVolume(ns, "in-"+cmp.Or(tc.class, "default"), &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, "1Gi")
		if tc.class != "" {
			dv.Spec.Storage.StorageClassName = &tc.class
		}
		g.Expect(env.Client.Create(ctx, dv)).To(Succeed())
		g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKeyFromObject(dv), d) }, 20*time.Second).Should(Succeed())
		g.Expect(d.Spec.Resources.Requests.Storage.Value()).To(Equal(transfer.VolumeSizeFor(1<<30, tc.overhead)),
			"1Gi of disk in a claim of class %q keeping %g free", tc.class, tc.overhead)
	}
	g.Expect(ctrltest.Update(ctx, env.Client, config, func() { config.Spec.FilesystemOverhead = nil })).To(Succeed())
	g.Eventually(overhead, 10*time.Second).Should(Equal(want))
}

// TestStorageProfiles: each StorageClass gets a StorageProfile of its name whose status says
// its provisioner, the clone strategy diskpipe prefers for it and the claim properties; what
// the administrator writes in its spec overrides them, and a DataVolume's spec.storage is
// completed from it (access modes, volume mode, clone strategy).
func TestStorageProfiles(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	g.Expect(env.Client.Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast",
		Annotations: map[string]string{disk.AnnotationCloneStrategy: "Snapshot"}}, Provisioner: "fast.diskpipe.test"})).To(Succeed())
	p := &cdiv1.StorageProfile{}
	status := func() string {
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "fast"}, p); err != nil || p.Status.StorageClass == nil {
			return fmt.Sprint(err)
		}
		s := fmt.Sprintf("%s %s %s", *p.Status.StorageClass, *p.Status.Provisioner, ptr.Deref(p.Status.CloneStrategy, ""))
		for _, set := range p.Status.ClaimPropertySets {
			s += fmt.Sprintf(" %v/%s", set.AccessModes, ptr.Deref(set.VolumeMode, ""))
		}
		return s
	}
	g.Eventually(status, 20*time.Second).Should(Equal("fast fast.diskpipe.test snapshot [ReadWriteOnce]/Filesystem"))
	g.Expect(p.OwnerReferences).To(HaveLen(1), "the class owns its profile")

	g.Expect(ctrltest.Update(ctx, env.Client, p, func() {
		p.Spec.CloneStrategy = ptr.To(cdiv1.CloneStrategyHostAssisted)
		p.Spec.ClaimPropertySets = []cdiv1.ClaimPropertySet{{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			VolumeMode: ptr.To(corev1.PersistentVolumeBlock)}}
	})).To(Succeed())
	g.Eventually(status, 20*time.Second).Should(Equal("fast fast.diskpipe.test copy [ReadWriteMany]/Block"))

	ns, err := env.CreateNamespace(ctx, "dv-profile")
	g.Expect(err).NotTo(HaveOccurred())
	dv := dataVolume(ns, "completed", &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, "1Gi")
	dv.Spec.Storage.StorageClassName = ptr.To("fast")
	g.Expect(env.Client.Create(ctx, dv)).To(Succeed())
	d := &diskvolume.DiskVolume{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKeyFromObject(dv), d) }, 20*time.Second).Should(Succeed())
	g.Expect(d.Spec.AccessModes).To(Equal([]corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}))
	g.Expect(*d.Spec.VolumeMode).To(Equal(corev1.PersistentVolumeBlock))
	g.Expect(d.Spec.Resources.Requests.Storage.String()).To(Equal("1Gi"), "a block volume keeps nothing for a filesystem")
	g.Expect(*d.Spec.CloneStrategy).To(Equal(common.CloneStrategyHostAssisted))

	// A class of storage CDI knows (Ceph RBD) gets CDI's claim properties, RWX Block first (live
	// migration), its driver's VolumeSnapshotClass (KubeVirt's VM snapshots read it) and CDI's
	// clone-strategy annotation; a DataVolume that asks for Filesystem gets that set's modes.
	g.Expect(env.Client.Create(ctx, &snapshotv1.VolumeSnapshotClass{ObjectMeta: metav1.ObjectMeta{Name: "rbd-snapshots"},
		Driver: "rbd.csi.ceph.com", DeletionPolicy: snapshotv1.VolumeSnapshotContentDelete})).To(Succeed())
	g.Expect(env.Client.Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "ceph-rbd",
		Annotations: map[string]string{cdi.AnnCDICloneStrategy: "csi-clone"}}, Provisioner: "rbd.csi.ceph.com"})).To(Succeed())
	rbd := &cdiv1.StorageProfile{}
	g.Eventually(func() string {
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "ceph-rbd"}, rbd); err != nil || rbd.Status.StorageClass == nil {
			return fmt.Sprint(err)
		}
		s := fmt.Sprintf("%s %s", ptr.Deref(rbd.Status.CloneStrategy, ""), ptr.Deref(rbd.Status.SnapshotClass, ""))
		for _, set := range rbd.Status.ClaimPropertySets {
			s += fmt.Sprintf(" %v/%s", set.AccessModes, ptr.Deref(set.VolumeMode, ""))
		}
		return s
	}, 20*time.Second).Should(Equal("csi-clone rbd-snapshots [ReadWriteMany]/Block [ReadWriteOnce]/Block [ReadWriteOnce]/Filesystem"))
	for name, mode := range map[string]*corev1.PersistentVolumeMode{"rbd-any": nil, "rbd-fs": ptr.To(corev1.PersistentVolumeFilesystem)} {
		dv := dataVolume(ns, name, &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, "1Gi")
		dv.Spec.Storage.StorageClassName, dv.Spec.Storage.VolumeMode = ptr.To("ceph-rbd"), mode
		g.Expect(env.Client.Create(ctx, dv)).To(Succeed())
	}
	for name, want := range map[string]string{"rbd-any": "[ReadWriteMany] Block", "rbd-fs": "[ReadWriteOnce] Filesystem"} {
		d := &diskvolume.DiskVolume{}
		g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d) }, 20*time.Second).Should(Succeed())
		g.Expect(fmt.Sprintf("%v %s", d.Spec.AccessModes, *d.Spec.VolumeMode)).To(Equal(want), name)
		g.Expect(*d.Spec.CloneStrategy).To(Equal(common.CloneStrategyCSIClone), "CDI's annotation of the class")
	}

	// Where CDI keeps golden images as snapshots (Rook's RBD, GKE's PD), a profile says so by
	// default, once its driver has a VolumeSnapshotClass.
	g.Expect(env.Client.Create(ctx, &snapshotv1.VolumeSnapshotClass{ObjectMeta: metav1.ObjectMeta{Name: "rook-snapshots"},
		Driver: "rook-ceph.rbd.csi.ceph.com", DeletionPolicy: snapshotv1.VolumeSnapshotContentDelete})).To(Succeed())
	for _, c := range []*storagev1.StorageClass{{ObjectMeta: metav1.ObjectMeta{Name: "rook-rbd"}, Provisioner: "rook-ceph.rbd.csi.ceph.com"},
		{ObjectMeta: metav1.ObjectMeta{Name: "gke-pd"}, Provisioner: "pd.csi.storage.gke.io"}} {
		g.Expect(env.Client.Create(ctx, c)).To(Succeed())
	}
	format := func(class string) func() string {
		return func() string {
			p := &cdiv1.StorageProfile{}
			if err := env.Client.Get(ctx, client.ObjectKey{Name: class}, p); err != nil || p.Status.StorageClass == nil {
				return fmt.Sprint(err)
			}
			return string(ptr.Deref(p.Status.DataImportCronSourceFormat, "unset"))
		}
	}
	g.Eventually(format("rook-rbd"), 20*time.Second).Should(Equal("snapshot"))
	g.Eventually(format("gke-pd"), 20*time.Second).Should(Equal("unset"), "no VolumeSnapshotClass of its driver")
	g.Eventually(format("ceph-rbd"), 20*time.Second).Should(Equal("unset"), "CDI keeps plain RBD's as PVCs")

	// Storage that makes no small volume (EBS io2: 4Gi) raises a DataVolume's size to it.
	g.Expect(env.Client.Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "io2"}, Provisioner: "ebs.csi.aws.com",
		Parameters: map[string]string{"type": "io2"}})).To(Succeed())
	g.Eventually(func() string {
		_ = env.Client.Get(ctx, client.ObjectKey{Name: "io2"}, rbd)
		return rbd.Annotations[cdi.AnnMinimumSize]
	}, 20*time.Second).Should(Equal("4Gi"))
	small := dataVolume(ns, "small", &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, "1Gi")
	small.Spec.Storage.StorageClassName, small.Spec.Storage.VolumeMode = ptr.To("io2"), ptr.To(corev1.PersistentVolumeBlock)
	g.Expect(env.Client.Create(ctx, small)).To(Succeed())
	g.Eventually(func() string {
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(small), d)
		if d.Spec.Resources.Requests.Storage == nil {
			return ""
		}
		return d.Spec.Resources.Requests.Storage.String()
	}, 20*time.Second).Should(Equal("4Gi"))

	// A DataVolume that names no class takes the class KubeVirt's disks default to.
	g.Expect(env.Client.Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "virt-default",
		Annotations: map[string]string{cdi.AnnDefaultVirtClass: "true"}}, Provisioner: "fast.diskpipe.test"})).To(Succeed())
	t.Cleanup(func() { // the other tests' DataVolumes take the cluster's default class
		_ = env.Client.Delete(context.Background(), &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "virt-default"}})
	})
	plain := dataVolume(ns, "plain", &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, "1Gi")
	g.Expect(env.Client.Create(ctx, plain)).To(Succeed())
	g.Eventually(func() string {
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(plain), d)
		return ptr.Deref(d.Spec.StorageClassName, "")
	}, 20*time.Second).Should(Equal("virt-default"))
}

// TestDataSources: a DataSource's status names the source it resolves to (one DataSource
// naming another is followed) and is Ready only once that source can be cloned; a DataVolume
// made from it (sourceRef) waits for it and then restores its snapshot.
func TestDataSources(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "datasource")
	g.Expect(err).NotTo(HaveOccurred())
	ready := func(ds *cdiv1.DataSource) func() string {
		return func() string {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(ds), ds); err != nil || len(ds.Status.Conditions) == 0 {
				return fmt.Sprint(err)
			}
			c := ds.Status.Conditions[0]
			return fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
		}
	}
	fedora := &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Name: "fedora", Namespace: ns},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{Snapshot: &cdiv1.DataVolumeSourceSnapshot{Name: "fedora-41"}}}}
	alias := &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Name: "latest", Namespace: ns},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{DataSource: &cdiv1.DataSourceRefSourceDataSource{Name: "fedora"}}}}
	root := dataVolume(ns, "root", nil, "1Gi")
	root.Spec.SourceRef = &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Name: "latest"}
	g.Expect(env.Client.Create(ctx, root)).To(Succeed())
	g.Eventually(dvState(t, root), 20*time.Second).Should(Equal("Pending N/A Bound=False:NotFound Ready=False: Running=False:NotFound"))
	g.Expect(env.Client.Create(ctx, fedora)).To(Succeed())
	g.Expect(env.Client.Create(ctx, alias)).To(Succeed())
	g.Eventually(ready(fedora), 20*time.Second).Should(Equal("False NotFound: VolumeSnapshot " + ns + "/fedora-41 does not exist"))
	g.Eventually(ready(alias), 20*time.Second).Should(Equal("False NotFound: VolumeSnapshot " + ns + "/fedora-41 does not exist"))
	g.Expect(alias.Status.Source.Snapshot).To(Equal(&cdiv1.DataVolumeSourceSnapshot{Namespace: ns, Name: "fedora-41"}), "the alias resolves to fedora's source")

	snap := &snapshotv1.VolumeSnapshot{ObjectMeta: metav1.ObjectMeta{Name: "fedora-41", Namespace: ns},
		Spec: snapshotv1.VolumeSnapshotSpec{Source: snapshotv1.VolumeSnapshotSource{PersistentVolumeClaimName: ptr.To("gone")}}}
	g.Expect(env.Client.Create(ctx, snap)).To(Succeed())
	snap.Status = &snapshotv1.VolumeSnapshotStatus{ReadyToUse: ptr.To(true), RestoreSize: ctrltest.Quantity("1Gi")}
	g.Expect(env.Client.Status().Update(ctx, snap)).To(Succeed())
	g.Eventually(ready(fedora), 20*time.Second).Should(Equal("True Ready: "), "the snapshot wakes the DataSource")

	// The DataVolume is made from the snapshot the alias resolves to.
	d := &diskvolume.DiskVolume{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKeyFromObject(root), d) }, 20*time.Second).Should(Succeed())
	g.Expect(d.Spec.Source.Snap).To(Equal(&diskvolume.SnapshotSource{Name: "fedora-41"}))
}

// TestDataVolumeCompressedRaw: a source whose size only an import tells (a gzip of a raw disk,
// as KubeVirt's export links are) is staged at the disk's size, as CDI imports it into the
// DataVolume's claim, and the import starts.
func TestDataVolumeCompressedRaw(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "dv-gzip")
	g.Expect(err).NotTo(HaveOccurred())
	dv := dataVolume(ns, "gz", &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://virt-export-vm.other.svc/volumes/vm-root/disk.img.gz"}}, "1Gi")
	g.Expect(env.Client.Create(ctx, dv)).To(Succeed())
	probe := ctrltest.Pod(t, env, ns, "vmim-dv-gz-probe-0")
	ctrltest.Complete(t, env, ns, probe.Name, transfer.Result{Format: "raw", VirtualSize: -1})
	d, img := &diskvolume.DiskVolume{}, &hypercloud.VirtualMachineImage{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKeyFromObject(dv), d) }, 20*time.Second).Should(Succeed())
	g.Eventually(func() string {
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "dv-gz"}, img); err != nil || img.Spec.Resources.Requests.Storage == nil {
			return fmt.Sprint(err)
		}
		return img.Spec.Resources.Requests.Storage.String()
	}, 20*time.Second).Should(Equal(d.Spec.Resources.Requests.Storage.String()), "the staging image takes the disk's size")
	ctrltest.Bind(t, env, ns, "vmim-dv-gz")
	ctrltest.Pod(t, env, ns, "vmim-dv-gz-import-0")
}

// TestDataVolumeImport: an http DataVolume is imported by a VirtualMachineImage it controls,
// with CDI's source options become the importer's, and its disk cloned from it; the status
// follows the import, then the clone; once the disk is whole the staging image is deleted.
func TestDataVolumeImport(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "dv-import")
	g.Expect(err).NotTo(HaveOccurred())

	dv := dataVolume(ns, "web", &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://images.example.com/fedora.qcow2",
		SecretRef: "basic", CertConfigMap: "ca", ExtraHeaders: []string{"X-Plain: yes"}, SecretExtraHeaders: []string{"token"}}}, "1Gi")
	dv.Labels = map[string]string{"team": "blue"}
	dv.Annotations = map[string]string{"backup.example.com/policy": "daily", corev1.LastAppliedConfigAnnotation: "{}",
		// what diskpipe, CDI and Kubernetes read on a claim is not the DataVolume's to pass
		"diskpipe.io/prime": "victim", "cdi.kubevirt.io/storage.pod.phase": "Running", "volume.kubernetes.io/selected-node": "n1", "cdi.diskpipe.io/x": "y"}
	g.Expect(env.Client.Create(ctx, dv)).To(Succeed())
	img := &hypercloud.VirtualMachineImage{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "dv-web"}, img) }, 20*time.Second).Should(Succeed())
	g.Expect(metav1.IsControlledBy(img, dv)).To(BeTrue(), "the DataVolume controls the image that stages its source")
	g.Expect(img.Spec.Source.HTTP).To(Equal(common.HTTPURL("https://images.example.com/fedora.qcow2")))

	// CDI 1.65's checksum and 1.66's insecureSkipVerify are the image's, not pruned.
	const sum = "sha256:0000000000000000000000000000000000000000000000000000000000000001"
	summed := dataVolume(ns, "summed", &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://images.example.com/fedora.qcow2",
		Checksum: sum, InsecureSkipVerify: ptr.To(true)}}, "1Gi")
	g.Expect(env.Client.Create(ctx, summed)).To(Succeed())
	staged := &hypercloud.VirtualMachineImage{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "dv-summed"}, staged) }, 20*time.Second).Should(Succeed())
	g.Expect(staged.Spec.Source.Checksum).To(Equal(common.Checksum(sum)))
	g.Expect(staged.Spec.Source.HTTPOptions.InsecureSkipTLSVerify).To(BeTrue())
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(summed), summed)).To(Succeed())
	g.Expect(summed.Spec.Source.HTTP.Checksum).To(Equal(sum), "the CRD keeps the field")
	d := &diskvolume.DiskVolume{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKeyFromObject(dv), d) }, 20*time.Second).Should(Succeed())
	g.Expect(d.Spec.Source.Image).To(Equal(&diskvolume.ImageSource{Name: "dv-web", Kind: diskvolume.ImageKindVirtualMachineImage}))

	probe := ctrltest.Pod(t, env, ns, "vmim-dv-web-probe-0")
	g.Expect(strings.Join(probe.Spec.Containers[0].Args, " ")).To(ContainSubstring("--source http --url https://images.example.com/fedora.qcow2" +
		" --auth-dir /var/run/diskpipe/auth --ca-file /var/run/diskpipe/ca --header X-Plain: yes --header-file /var/run/diskpipe/headers/0 --probe"))
	g.Eventually(dvState(t, dv), 20*time.Second).Should(HavePrefix("ImportScheduled N/A Bound=False:"))
	ctrltest.Complete(t, env, ns, probe.Name, transfer.Result{Format: "qcow2", VirtualSize: 1 << 30})
	ctrltest.Bind(t, env, ns, "vmim-dv-web")
	ctrltest.Kubelet(t, env, ns, "vmim-dv-web-import-0", corev1.PodRunning, nil, 0)
	g.Eventually(dvState(t, dv), 20*time.Second).Should(Equal("ImportInProgress N/A Bound=False:Pending Ready=False: Running=True:"))
	ctrltest.Complete(t, env, ns, "vmim-dv-web-import-0", transfer.Result{Format: "qcow2", VirtualSize: 1 << 30})

	// The disk is a CSI clone of the image's PVC, of the image's size: the storage binds the
	// claim once the volume is made.
	p := &corev1.PersistentVolumeClaim{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "web"}, p) }, 20*time.Second).Should(Succeed())
	g.Expect(p.Spec.DataSource).To(Equal(&corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "vmim-dv-web"}))
	g.Eventually(dvState(t, dv), 20*time.Second).Should(Equal("ImportInProgress N/A Bound=False:Pending Ready=False: Running=True:"))
	ctrltest.Bind(t, env, ns, "web")
	g.Eventually(dvState(t, dv), 20*time.Second).Should(Equal("Succeeded 100.0% Bound=True:Bound Ready=True: Running=False:Completed"))
	g.Eventually(func() map[string]string {
		_ = env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "web"}, p)
		return p.Annotations
	}, 20*time.Second).Should(HaveKeyWithValue("cdi.kubevirt.io/storage.pod.phase", "Succeeded"), "the claim says it is done, as CDI's does")
	// The claim carries the DataVolume's labels and annotations, and CDI's own, as CDI's does.
	g.Expect(p.Labels).To(And(HaveKeyWithValue("team", "blue"), HaveKeyWithValue("app", "containerized-data-importer")))
	g.Expect(p.Annotations).To(And(HaveKeyWithValue("backup.example.com/policy", "daily"), HaveKeyWithValue(cdi.AnnContentType, "kubevirt"),
		HaveKeyWithValue(cdi.AnnCreatedForDataVolume, string(dv.UID)), Not(HaveKey(corev1.LastAppliedConfigAnnotation)),
		Not(HaveKey("diskpipe.io/prime")), Not(HaveKey("volume.kubernetes.io/selected-node")), Not(HaveKey("cdi.diskpipe.io/x")),
		HaveKeyWithValue("cdi.kubevirt.io/storage.pod.phase", "Succeeded")))
	dv.Labels["team"] = "green" // a label changed later follows
	g.Expect(env.Client.Update(ctx, dv)).To(Succeed())
	g.Eventually(func() map[string]string {
		_ = env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "web"}, p)
		return p.Labels
	}, 20*time.Second).Should(HaveKeyWithValue("team", "green"))
	// Each phase was told as CDI tells it.
	g.Eventually(func() []string {
		list := &eventsv1.EventList{}
		g.Expect(env.Client.List(ctx, list, client.InNamespace(ns))).To(Succeed())
		var notes []string
		for _, e := range list.Items {
			if e.Regarding.UID == dv.UID && e.Type == corev1.EventTypeNormal && strings.HasPrefix(e.Reason, "Import") {
				notes = append(notes, e.Reason+": "+e.Note)
			}
		}
		return notes
	}, 20*time.Second).Should(ContainElements("ImportScheduled: Import into web scheduled", "ImportInProgress: Import into web in progress",
		"ImportSucceeded: Successfully imported into PVC web"))
	g.Eventually(func() bool {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(img), img)
		return apierrors.IsNotFound(err) || (err == nil && !img.DeletionTimestamp.IsZero())
	}, 20*time.Second).Should(BeTrue(), "the staging image is deleted once the disk is whole")
}

// TestDataVolumeWaitForFirstConsumer: on a class that binds at the first consumer, the
// DataVolume's disk is made (a CSI clone of the staging image's PVC, provisioned when the VM's
// pod is scheduled) but its claim is not bound: the DataVolume is WaitForFirstConsumer, on
// which KubeVirt starts the VM, and the staging image stays, since the clone is made from it
// then; once the claim is bound the DataVolume succeeds and the image goes.
func TestDataVolumeWaitForFirstConsumer(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t, "dv-wffc")

	dv := dataVolume(ns, "lazy", &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://images.example.com/fedora.qcow2"}}, "1Gi")
	dv.Spec.Storage.StorageClassName = ptr.To(classWFFC)
	g.Expect(env.Client.Create(ctx, dv)).To(Succeed())
	ctrltest.Complete(t, env, ns, "vmim-dv-lazy-probe-0", transfer.Result{Format: "qcow2", VirtualSize: 1 << 30})
	ctrltest.Bind(t, env, ns, "vmim-dv-lazy") // its importer is its first consumer
	ctrltest.Complete(t, env, ns, "vmim-dv-lazy-import-0", transfer.Result{Format: "qcow2", VirtualSize: 1 << 30})

	g.Eventually(dvState(t, dv), 20*time.Second).Should(Equal("WaitForFirstConsumer N/A Bound=False:Pending Ready=False: Running=False:WaitForFirstConsumer"))
	g.Expect(dv.Status.Conditions[0].Message).To(Equal("PVC lazy is bound when its first consumer, the VM's pod, is scheduled (StorageClass volumeBindingMode WaitForFirstConsumer)"))
	img := &hypercloud.VirtualMachineImage{}
	g.Consistently(func() error { return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "dv-lazy"}, img) }, 2*time.Second).
		Should(Succeed(), "the clone is made from the staging image's PVC when the VM's pod is scheduled")
	g.Expect(img.DeletionTimestamp.IsZero()).To(BeTrue())

	ctrltest.Bind(t, env, ns, "lazy") // the VM's pod was scheduled
	g.Eventually(dvState(t, dv), 20*time.Second).Should(Equal("Succeeded 100.0% Bound=True:Bound Ready=True: Running=False:Completed"))
	g.Eventually(func() bool {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(img), img)
		return apierrors.IsNotFound(err) || (err == nil && !img.DeletionTimestamp.IsZero())
	}, 20*time.Second).Should(BeTrue(), "the staging image is deleted once the claim is bound")
}

// TestDataVolumeNodeLocal: on node-local storage that binds at the first consumer, a
// DataVolume's disk is not cloned where its staging image happens to be: its claim waits,
// PendingPopulation, on which KubeVirt starts the VM's pod, and is filled on the node that pod
// is scheduled to (ImportInProgress meanwhile), never Succeeded before it is bound.
func TestDataVolumeNodeLocal(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t, "dv-local")
	for _, n := range []string{"dv-node-a", "dv-node-b"} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{corev1.LabelHostname: n}}}
		g.Expect(client.IgnoreAlreadyExists(env.Client.Create(ctx, node))).To(Succeed())
	}
	dv := dataVolume(ns, "roaming", &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://images.example.com/fedora.qcow2"}}, "1Gi")
	dv.Spec.Storage.StorageClassName = ptr.To(classWFFC)
	g.Expect(env.Client.Create(ctx, dv)).To(Succeed())
	ctrltest.Complete(t, env, ns, "vmim-dv-roaming-probe-0", transfer.Result{Format: "qcow2", VirtualSize: 1 << 30})
	ctrltest.BindWith(t, env, ns, "vmim-dv-roaming", ctrltest.OnNode("dv-node-a")) // its importer ran on node a
	ctrltest.Complete(t, env, ns, "vmim-dv-roaming-import-0", transfer.Result{Format: "qcow2", VirtualSize: 1 << 30})

	g.Eventually(dvState(t, dv), 20*time.Second).Should(Equal("PendingPopulation N/A Bound=False:Pending Ready=False: Running=False:WaitForFirstConsumer"))
	claim := &corev1.PersistentVolumeClaim{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "roaming"}, claim)).To(Succeed())
	g.Expect(claim.Spec.DataSourceRef.Kind).To(Equal("DiskVolume"), "filled on the VM's node, not cloned on the image's")

	metav1.SetMetaDataAnnotation(&claim.ObjectMeta, storage.AnnotationSelectedNode, "dv-node-b") // the VM's pod was scheduled
	g.Expect(env.Client.Update(ctx, claim)).To(Succeed())
	g.Eventually(dvState(t, dv), 20*time.Second).Should(Equal("ImportInProgress N/A Bound=False:Pending Ready=False: Running=True:"))
	g.Expect(dv.Status.Conditions[0].Message).To(Equal("PVC roaming is being filled on node dv-node-b, where the VM's pod was scheduled (the claim's events say how)"))

	// Asked to be bound at once (CDI's bind.immediate.requested), a DataVolume of the same
	// image is cloned now, where the image is, and succeeds without a consumer.
	now := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Name: "now", Namespace: ns, Annotations: map[string]string{cdi.AnnBindImmediate: ""}},
		Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: ns, Name: "vmim-dv-roaming"}},
			Storage: &cdiv1.StorageSpec{StorageClassName: ptr.To(classWFFC)}}}
	g.Expect(env.Client.Create(ctx, now)).To(Succeed())
	nowClaim := &corev1.PersistentVolumeClaim{}
	g.Eventually(func() string {
		_ = env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "now"}, nowClaim)
		return nowClaim.Annotations[storage.AnnotationSelectedNode]
	}, 20*time.Second).Should(Equal("dv-node-a"), "provisioned now on the image's node")
	g.Expect(nowClaim.Spec.DataSource.Kind).To(Equal("PersistentVolumeClaim"), "a CSI clone, not deferred")
	ctrltest.Bind(t, env, ns, "now")
	g.Eventually(dvState(t, now), 20*time.Second).Should(HavePrefix("Succeeded 100.0%"))
}

// TestDataVolumeImportFailures: a source that fails for good fails the DataVolume with the
// importer's reason and Running False "Error" (what KubeVirt shows as the VM's
// DataVolumeError); a source the API refuses and an S3 URL that names no object say why, and
// nothing is imported.
func TestDataVolumeImportFailures(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "dv-import-fail")
	g.Expect(err).NotTo(HaveOccurred())

	missing := dataVolume(ns, "missing", &cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{URL: ptr.To("docker://registry.example.com/nope:1"),
		Platform: &cdiv1.PlatformOptions{Architecture: "arm64"}}}, "1Gi")
	g.Expect(env.Client.Create(ctx, missing)).To(Succeed())
	probe := ctrltest.Pod(t, env, ns, "vmim-dv-missing-probe-0")
	g.Expect(strings.Join(probe.Spec.Containers[0].Args, " ")).To(ContainSubstring("--source registry --url docker://registry.example.com/nope:1 --architecture arm64 --probe"))
	ctrltest.Kubelet(t, env, ns, probe.Name, corev1.PodFailed, &transfer.Result{Reason: transfer.ReasonSourceNotFound,
		Message: "manifest unknown: nope:1"}, transfer.ExitFailed)
	g.Eventually(dvState(t, missing), 20*time.Second).Should(Equal("Failed N/A Bound=False:SourceNotFound Ready=False: Running=False:Error"))
	g.Expect(missing.Status.Conditions[2].Message).To(ContainSubstring("manifest unknown: nope:1"))

	for _, c := range []struct {
		name, state, msg string
		src              *cdiv1.DataVolumeSource
	}{
		{"ftp", "Failed N/A Bound=False:InvalidSpec Ready=False: Running=False:Error", "must be an http:// or https:// URL with a host",
			&cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "ftp://images.example.com/a.qcow2"}}},
		{"bucket-only", "Failed N/A Bound=False:InvalidSpec Ready=False: Running=False:InvalidSpec", "names no bucket and key",
			&cdiv1.DataVolumeSource{S3: &cdiv1.DataVolumeSourceS3{URL: "https://s3.example.com/images"}}},
	} {
		dv := dataVolume(ns, c.name, c.src, "1Gi")
		g.Expect(env.Client.Create(ctx, dv)).To(Succeed())
		g.Eventually(dvState(t, dv), 20*time.Second).Should(Equal(c.state), c.name)
		g.Expect(dv.Status.Conditions[0].Message).To(ContainSubstring(c.msg), c.name)
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(dv), &diskvolume.DiskVolume{})).NotTo(Succeed(), "%s: no disk", c.name)
	}
}

// TestDataVolumeCrossNamespace: a DataVolume cloned from another namespace's PVC is admitted
// by CDI's rule only, create on datavolumes/source in the source's namespace, asked for the
// user who creates it, and checked again when an update changes the source; a DataSource is
// followed only to a source in its own namespace.
func TestDataVolumeCrossNamespace(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	golden, team := namespace(t, "golden"), namespace(t, "team")
	grant := func(ns, name string, rule rbacv1.PolicyRule) {
		g.Expect(env.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Rules: []rbacv1.PolicyRule{rule}})).To(Succeed())
		g.Expect(env.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: name},
			Subjects: []rbacv1.Subject{{Kind: "User", Name: "bob"}}})).To(Succeed())
	}
	grant(team, "datavolumes", rbacv1.PolicyRule{APIGroups: []string{"cdi.kubevirt.io"}, Resources: []string{"datavolumes", "datasources"}, Verbs: []string{"*"}})
	bob, err := env.User("bob")
	g.Expect(err).NotTo(HaveOccurred())
	clone := func(name, from string) *cdiv1.DataVolume {
		return dataVolume(team, name, &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: from, Name: "fedora"}}, "1Gi")
	}

	var refused error
	g.Eventually(func() string { // until RBAC knows bob's Role
		refused = bob.Create(ctx, clone("stolen", golden))
		return fmt.Sprint(refused)
	}, 10*time.Second).ShouldNot(ContainSubstring("cannot create resource"))
	g.Expect(refused).To(MatchError(ContainSubstring("bob may not copy the PersistentVolumeClaim " + golden + "/fedora into namespace " + team +
		": copying another namespace's data needs its owner's consent, create on datavolumes/source (cdi.kubevirt.io) in " + golden)))

	snap := dataVolume(team, "snap", &cdiv1.DataVolumeSource{Snapshot: &cdiv1.DataVolumeSourceSnapshot{Namespace: golden, Name: "fedora"}}, "1Gi")
	g.Expect(bob.Create(ctx, snap)).To(MatchError(ContainSubstring("bob may not copy the VolumeSnapshot " + golden + "/fedora into namespace " + team)))

	// Nor may bob name it in a DataSource, whose status would tell whether it exists.
	probe := &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: team},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: golden, Name: "fedora"}}}}
	g.Expect(bob.Create(ctx, probe)).To(MatchError(ContainSubstring("bob may not copy the PersistentVolumeClaim " + golden + "/fedora into namespace " + team)))
	ownSource := &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Name: "own-source", Namespace: team},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: team, Name: "fedora"}}}}
	g.Expect(bob.Create(ctx, ownSource)).To(Succeed())
	g.Expect(ctrltest.Update(ctx, bob, ownSource, func() { ownSource.Spec.Source.PVC.Namespace = golden })).
		To(MatchError(ContainSubstring("bob may not copy the PersistentVolumeClaim " + golden + "/fedora")))

	// Within the namespace nothing is asked; an update to another namespace's PVC is.
	own := clone("own", team)
	g.Expect(bob.Create(ctx, own)).To(Succeed())
	g.Expect(ctrltest.Update(ctx, bob, own, func() { own.Spec.Source.PVC.Namespace = golden })).
		To(MatchError(ContainSubstring("bob may not copy the PersistentVolumeClaim " + golden + "/fedora")))

	grant(golden, "clone-source", rbacv1.PolicyRule{APIGroups: []string{"cdi.kubevirt.io"}, Resources: []string{"datavolumes/source"}, Verbs: []string{"create"}})
	allowed := clone("allowed", golden)
	g.Eventually(func() error { return bob.Create(ctx, allowed) }, 10*time.Second).Should(Succeed())
	img := &hypercloud.VirtualMachineImage{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKey{Namespace: team, Name: "dv-allowed"}, img) }, 20*time.Second).Should(Succeed())
	g.Expect(img.Spec.Source.PVC).To(Equal(&common.PVCSource{Namespace: golden, Name: "fedora"}))

	// A snapshot of another namespace is staged as an image copying it.
	g.Expect(bob.Create(ctx, snap)).To(Succeed())
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKey{Namespace: team, Name: "dv-snap"}, img) }, 20*time.Second).Should(Succeed())
	g.Expect(img.Spec.Source.Snapshot).To(Equal(&common.VolumeSnapshotSource{Namespace: golden, Name: "fedora"}))

	// bob's own DataSource naming golden's PVC is not a way round the rule.
	ds := &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Name: "sneaky", Namespace: team},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: golden, Name: "fedora"}}}}
	g.Expect(bob.Create(ctx, ds)).To(Succeed())
	viaRef := dataVolume(team, "via-ref", nil, "1Gi")
	viaRef.Spec.SourceRef = &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Name: "sneaky"}
	g.Expect(bob.Create(ctx, viaRef)).To(Succeed())
	g.Eventually(dvState(t, viaRef), 20*time.Second).Should(Equal("Pending N/A Bound=False:SourceNotServed Ready=False: Running=False:SourceNotServed"))
	g.Expect(viaRef.Status.Conditions[0].Message).To(Equal("DataSource " + team + "/sneaky resolves to a source in namespace " + golden +
		": diskpipe clones from a DataSource's own namespace only"))
}

func namespace(t *testing.T, prefix string) string {
	t.Helper()
	ns, err := env.CreateNamespace(t.Context(), prefix)
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// TestClaimAdoption: a DataVolume made again for a claim that exists (a cluster moved from
// CDI: KubeVirt remakes its VMs' DataVolumes with allowClaimAdoption; a user re-applies a
// DataVolume whose claim CDI marked populatedFor it) takes the claim, which becomes its own,
// and writes nothing; a claim without either mark is not taken.
func TestClaimAdoption(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t, "adopt")
	claim := func(name string, ann map[string]string) {
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: ann},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *ctrltest.Quantity("1Gi")}}}}
		g.Expect(env.Client.Create(ctx, pvc)).To(Succeed())
		ctrltest.Bind(t, env, ns, name)
	}
	claim("vm-root", nil)
	claim("data", map[string]string{cdi.AnnPopulatedFor: "data"})
	claim("other", nil)
	http := &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://images.example.com/a.qcow2"}}
	fromTemplate := dataVolume(ns, "vm-root", http, "1Gi")
	fromTemplate.Annotations = map[string]string{cdi.AnnAllowClaimAdoption: "true"}
	reapplied := dataVolume(ns, "data", http, "1Gi")
	for _, dv := range []*cdiv1.DataVolume{fromTemplate, reapplied} {
		g.Expect(env.Client.Create(ctx, dv)).To(Succeed())
		g.Eventually(dvState(t, dv), 20*time.Second).Should(Equal("Succeeded 100.0% Bound=True:Bound Ready=True:PrePopulated Running=False:PrePopulated"), dv.Name)
		pvc := &corev1.PersistentVolumeClaim{}
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(dv), pvc)).To(Succeed())
		g.Expect(metav1.IsControlledBy(pvc, dv)).To(BeTrue(), "%s: the adopted claim is the DataVolume's", dv.Name)
		g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: cdi.SourceImage(dv.Name)}, &hypercloud.VirtualMachineImage{})).
			NotTo(Succeed(), "%s: nothing is imported", dv.Name)
	}

	// Without a mark, the claim is someone else's: nothing is made, and the DataVolume says how
	// to take it.
	other := dataVolume(ns, "other", &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, "1Gi")
	g.Expect(env.Client.Create(ctx, other)).To(Succeed())
	g.Eventually(dvState(t, other), 20*time.Second).Should(Equal("Pending N/A Bound=False:ErrResourceExists Ready=False: Running=False:ErrResourceExists"))
	g.Expect(other.Status.Conditions[0].Message).To(Equal(`PVC other already exists and is not managed by DataVolume other: to take it as the DataVolume's disk, ` +
		`annotate the DataVolume cdi.kubevirt.io/allowClaimAdoption: "true" (or cdi.kubevirt.io/storage.prePopulated: "true")`))
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(other), &diskvolume.DiskVolume{})).NotTo(Succeed(), "no disk is made")
	pvc := &corev1.PersistentVolumeClaim{}
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(other), pvc)).To(Succeed())
	g.Expect(metav1.GetControllerOf(pvc)).To(BeNil(), "the claim is left as it was")
}

// newRevision is the revision image the scheduled image img makes once its check finds rev.
func newRevision(t *testing.T, ns string, img *hypercloud.VirtualMachineImage, rev string) *hypercloud.VirtualMachineImage {
	t.Helper()
	found := &hypercloud.VirtualMachineImage{}
	NewWithT(t).Eventually(func() string {
		list := &hypercloud.VirtualMachineImageList{}
		_ = env.Client.List(t.Context(), list, client.InNamespace(ns), client.MatchingLabels{image.LabelScheduledBy: string(img.UID)})
		for i := range list.Items {
			if list.Items[i].Annotations[image.AnnotationRevision] == rev {
				*found = list.Items[i]
			}
		}
		return found.Name
	}, 20*time.Second).ShouldNot(BeEmpty(), "the revision %s of %s", rev, img.Name)
	return found
}

// importRevision completes the import of rev's image, which the test has probed and bound.
func importRevision(t *testing.T, ns string, img *hypercloud.VirtualMachineImage, rev string) {
	t.Helper()
	ctrltest.Complete(t, env, ns, "vmim-"+img.Name+"-import-0", transfer.Result{Format: "qcow2", VirtualSize: 1 << 30, Revision: rev})
}

// clonedFromRevision checks that a DataVolume made from DataSource ds of namespace ns is
// cloned from rev, the revision's image itself, with nothing staged.
func clonedFromRevision(t *testing.T, ns, ds string, rev *hypercloud.VirtualMachineImage) {
	t.Helper()
	g := NewWithT(t)
	ctx := t.Context()
	root := dataVolume(ns, "root", nil, "2Gi")
	root.Spec.SourceRef = &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Name: ds}
	g.Expect(env.Client.Create(ctx, root)).To(Succeed())
	d := &diskvolume.DiskVolume{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKeyFromObject(root), d) }, 20*time.Second).Should(Succeed())
	g.Expect(d.Spec.Source.Image).To(Equal(&diskvolume.ImageSource{Name: common.LocalName(rev.Name), Kind: diskvolume.ImageKindVirtualMachineImage}),
		"cloned from the revision's image itself")
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: cdi.SourceImage("root")}, &hypercloud.VirtualMachineImage{})).
		NotTo(Succeed(), "nothing is staged")
}

// TestDataImportCron: a DataImportCron is served by a scheduled image it controls; once a
// revision is imported its DataSource names that revision's golden PVC, its status says it is
// up to date, and a DataVolume made from the DataSource is cloned from the revision's image,
// with nothing staged. A template moved to another source is served by a new image, which
// replaces the old one once it has a Ready revision.
func TestDataImportCron(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t, "cron")
	cron := &cdiv1.DataImportCron{ObjectMeta: metav1.ObjectMeta{Name: "fedora-cron", Namespace: ns, Labels: map[string]string{
		"instancetype.kubevirt.io/default-preference": "fedora", "instancetype.kubevirt.io/default-instancetype": "u1.medium",
		"kubevirt.io/dynamic-credentials-support": "true", "team": "a"}}, Spec: cdiv1.DataImportCronSpec{
		Schedule: "@every 1h", ManagedDataSource: "fedora", ImportsToKeep: ptr.To[int32](2),
		Template: cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{
			URL: ptr.To("docker://quay.io/containerdisks/fedora:latest")}}, Storage: &cdiv1.StorageSpec{}}}}}
	g.Expect(env.Client.Create(ctx, cron)).To(Succeed())
	name, err := cdi.CronImageName(cron)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(name).To(MatchRegexp(`^dic-fedora-cron-[0-9a-f]{8}$`))
	img := &hypercloud.VirtualMachineImage{}
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, img)
	}, 20*time.Second).Should(Succeed())
	g.Expect(metav1.IsControlledBy(img, cron)).To(BeTrue())
	g.Expect(img.Spec.Schedule).To(Equal(&common.ImageSchedule{Cron: "@every 1h", Keep: ptr.To[int32](2)}))
	g.Expect(img.Spec.Source.Registry.URL).To(Equal("docker://quay.io/containerdisks/fedora:latest"))

	// The schedule's first check finds a revision, which is imported into an image of its own.
	const digest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	ctrltest.Complete(t, env, ns, "vmim-"+name+"-check-0", transfer.Result{Revision: digest})
	rev := newRevision(t, ns, img, digest)
	cronState := func() string {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(cron), cron); err != nil {
			return err.Error()
		}
		s := ""
		for _, c := range cron.Status.Conditions {
			s += fmt.Sprintf("%s=%s:%s ", c.Type, c.Status, c.Reason)
		}
		return strings.TrimSpace(s)
	}
	ctrltest.Complete(t, env, ns, "vmim-"+rev.Name+"-probe-0", transfer.Result{Format: "qcow2", VirtualSize: 1 << 30, Revision: digest})
	ctrltest.Bind(t, env, ns, "vmim-"+rev.Name)
	g.Eventually(cronState, 20*time.Second).Should(Equal("Progressing=True:ImportProgressing UpToDate=False:NoImport"))
	g.Expect(cron.Status.CurrentImports).To(Equal([]cdiv1.ImportStatus{{DataVolumeName: rev.Name, Digest: digest}}))
	importRevision(t, ns, rev, digest)
	g.Eventually(cronState, 20*time.Second).Should(Equal("Progressing=False:NoImport UpToDate=True:UpToDate"))
	g.Expect(cron.Status.LastImportedPVC).To(Equal(&cdiv1.DataVolumeSourcePVC{Namespace: ns, Name: "vmim-" + rev.Name}))

	ds := &cdiv1.DataSource{}
	g.Eventually(func() string {
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fedora"}, ds); err != nil || len(ds.Status.Conditions) == 0 {
			return fmt.Sprint(err)
		}
		return string(ds.Status.Conditions[0].Status)
	}, 20*time.Second).Should(Equal("True"), "the DataSource is Ready on the revision's golden PVC")
	g.Expect(ds.Spec.Source.PVC).To(Equal(&cdiv1.DataVolumeSourcePVC{Namespace: ns, Name: "vmim-" + rev.Name}))
	g.Expect(metav1.IsControlledBy(ds, cron)).To(BeTrue())
	g.Expect(ds.Labels).To(Equal(map[string]string{cdi.LabelDataImportCron: "fedora-cron",
		"instancetype.kubevirt.io/default-preference": "fedora", "instancetype.kubevirt.io/default-instancetype": "u1.medium",
		"kubevirt.io/dynamic-credentials-support": "true"}), "the VM defaults pass to the DataSource, other labels do not")

	clonedFromRevision(t, ns, "fedora", rev)

	// The template moves to another registry: an image's source is immutable, so the new
	// source gets a scheduled image of its own. Until it has a Ready revision the DataSource
	// keeps the old one's PVC; then it names the new one's, and the old image is deleted.
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(cron), cron)).To(Succeed())
	cron.Spec.Template.Spec.Source.Registry.URL = ptr.To("docker://mirror.example.com/containerdisks/fedora:latest")
	g.Expect(env.Client.Update(ctx, cron)).To(Succeed())
	moved, err := cdi.CronImageName(cron)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(moved).NotTo(Equal(name))
	next := &hypercloud.VirtualMachineImage{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: moved}, next) }, 20*time.Second).Should(Succeed())
	g.Expect(metav1.IsControlledBy(next, cron)).To(BeTrue())
	g.Expect(next.Spec.Source.Registry.URL).To(Equal("docker://mirror.example.com/containerdisks/fedora:latest"))
	const digest2 = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	ctrltest.Complete(t, env, ns, "vmim-"+moved+"-check-0", transfer.Result{Revision: digest2})
	rev2 := newRevision(t, ns, next, digest2)
	g.Consistently(func() string {
		_ = env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fedora"}, ds)
		return ds.Spec.Source.PVC.Name
	}, 2*time.Second).Should(Equal("vmim-"+rev.Name), "the DataSource keeps the old revision while the new source imports")
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(img), &hypercloud.VirtualMachineImage{})).To(Succeed(), "the old image is kept meanwhile")
	ctrltest.Complete(t, env, ns, "vmim-"+rev2.Name+"-probe-0", transfer.Result{Format: "qcow2", VirtualSize: 1 << 30, Revision: digest2})
	ctrltest.Bind(t, env, ns, "vmim-"+rev2.Name)
	importRevision(t, ns, rev2, digest2)
	g.Eventually(func() string {
		_ = env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fedora"}, ds)
		return ds.Spec.Source.PVC.Name
	}, 20*time.Second).Should(Equal("vmim-"+rev2.Name), "the DataSource names the new source's revision")
	g.Eventually(func() bool {
		old := &hypercloud.VirtualMachineImage{}
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(img), old)
		return apierrors.IsNotFound(err) || err == nil && !old.DeletionTimestamp.IsZero()
	}, 20*time.Second).Should(BeTrue(), "the old source's image is deleted")
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(next), next)).To(Succeed())
	g.Expect(next.DeletionTimestamp.IsZero()).To(BeTrue(), "the new source's image stays")

	// Deleted with CDI's default retentionPolicy (All), the DataImportCron leaves its
	// DataSource and its image, whose checks stop; made again (an operator's upgrade), it takes
	// them back and the checks resume.
	g.Expect(env.Client.Delete(ctx, cron)).To(Succeed())
	g.Eventually(func() bool { return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(cron), cron)) }, 20*time.Second).Should(BeTrue())
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(next), next)).To(Succeed())
	g.Expect(metav1.GetControllerOf(next)).To(BeNil(), "the image is the DataImportCron's no longer")
	g.Expect(next.Spec.Schedule.Suspend).To(Equal(ptr.To(true)))
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fedora"}, ds)).To(Succeed())
	g.Expect(metav1.GetControllerOf(ds)).To(BeNil())
	g.Expect(ds.Spec.Source.PVC.Name).To(Equal("vmim-"+rev2.Name), "the DataSource still names the revision disks are made from")
	again := &cdiv1.DataImportCron{ObjectMeta: metav1.ObjectMeta{Name: "fedora-cron", Namespace: ns}, Spec: *cron.Spec.DeepCopy()}
	g.Expect(env.Client.Create(ctx, again)).To(Succeed())
	g.Eventually(func() bool {
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(next), next)
		return metav1.IsControlledBy(next, again) && next.Spec.Schedule.Suspend == nil
	}, 20*time.Second).Should(BeTrue(), "the image is taken back, its checks resumed")
	g.Eventually(func() bool {
		_ = env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fedora"}, ds)
		return metav1.IsControlledBy(ds, again)
	}, 20*time.Second).Should(BeTrue(), "the DataSource is taken back")

	// An image a user made under the name a DataImportCron's would have, as if retained, is
	// not taken as the DataImportCron's: it would serve the user's bytes to every clone.
	planted := &cdiv1.DataImportCron{ObjectMeta: metav1.ObjectMeta{Name: "planted", Namespace: ns}, Spec: *cron.Spec.DeepCopy()}
	planted.Spec.ManagedDataSource = "planted"
	plantedName, err := cdi.CronImageName(planted)
	g.Expect(err).NotTo(HaveOccurred())
	fake := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: plantedName, Namespace: ns,
		Labels: map[string]string{cdi.LabelDataImportCron: "planted"}, Annotations: map[string]string{"cdi.diskpipe.io/retained-from": "0000"}},
		Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{HTTP: common.HTTPURL("https://evil.example.com/x.qcow2")}}}
	g.Expect(env.Client.Create(ctx, fake)).To(Succeed())
	g.Expect(env.Client.Create(ctx, planted)).To(Succeed())
	g.Eventually(func() string {
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(planted), planted)
		if len(planted.Status.Conditions) < 2 {
			return ""
		}
		return planted.Status.Conditions[1].Reason + ": " + planted.Status.Conditions[1].Message
	}, 20*time.Second).Should(Equal("ErrResourceExists: VirtualMachineImage " + plantedName + " already exists and is not managed by DataImportCron planted"))
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(fake), fake)).To(Succeed())
	g.Expect(metav1.GetControllerOf(fake)).To(BeNil())

	// A template diskpipe cannot check for revisions says so.
	blank := &cdiv1.DataImportCron{ObjectMeta: metav1.ObjectMeta{Name: "blank", Namespace: ns}, Spec: cdiv1.DataImportCronSpec{
		Schedule: "@daily", ManagedDataSource: "blank", Template: cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{
			Source: &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}}}}}
	g.Expect(env.Client.Create(ctx, blank)).To(Succeed())
	g.Eventually(func() string {
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(blank), blank)
		if len(blank.Status.Conditions) == 0 {
			return ""
		}
		return blank.Status.Conditions[1].Reason + ": " + blank.Status.Conditions[1].Message
	}, 20*time.Second).Should(Equal("InvalidSpec: spec.template.spec.source must be http, s3 or registry: diskpipe checks those for new revisions"))
}

// TestGlobalPreallocation: a DataVolume that does not say whether to preallocate takes the
// CDIConfig's spec.preallocation, as in CDI; one that says keeps its own.
func TestGlobalPreallocation(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t, "prealloc")
	withConfig(t, func(spec *cdiv1.CDIConfigSpec) { spec.Preallocation = ptr.To(true) })
	// The CDIConfig's status says it, as CDI's does (tools read the status, not the spec).
	g.Eventually(func() bool {
		c := &cdiv1.CDIConfig{}
		return env.Client.Get(ctx, client.ObjectKey{Name: cdi.CDIConfigName}, c) == nil && c.Status.Preallocation
	}, 20*time.Second).Should(BeTrue(), "status.preallocation")
	unsaid := dataVolume(ns, "unsaid", &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, "1Gi")
	said := dataVolume(ns, "said", &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}, "1Gi")
	said.Spec.Preallocation = ptr.To(false)
	for _, dv := range []*cdiv1.DataVolume{unsaid, said} {
		g.Expect(env.Client.Create(ctx, dv)).To(Succeed())
	}
	for name, want := range map[string]bool{"unsaid": true, "said": false} {
		d := &diskvolume.DiskVolume{}
		g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, d) }, 20*time.Second).Should(Succeed())
		g.Expect(d.Spec.Preallocation).To(Equal(ptr.To(want)), name)
	}
}

// TestTransferPods: a DataVolume's priorityClassName, its serviceAccountName (CDI v1.65) and its
// dedicated import network (the annotation k8s.v1.cni.cncf.io/networks) reach the pods that
// make it, as CDI passes them; the account's token is not mounted.
func TestTransferPods(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t, "dv-pods")
	g.Expect(client.IgnoreAlreadyExists(env.Client.Create(ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "imports-low"},
		Value: 10}))).To(Succeed())
	dv := dataVolume(ns, "prio", &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://images.example.com/fedora.qcow2"}}, "1Gi")
	dv.Spec.PriorityClassName, dv.Spec.ServiceAccountName = "imports-low", "importer-sa"
	dv.Annotations = map[string]string{"k8s.v1.cni.cncf.io/networks": "storage-net"}
	g.Expect(env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "importer-sa", Namespace: ns}})).To(Succeed())
	g.Expect(env.Client.Create(ctx, dv)).To(Succeed())
	probe := ctrltest.Pod(t, env, ns, "vmim-dv-prio-probe-0")
	g.Expect(probe.Spec.PriorityClassName).To(Equal("imports-low"))
	g.Expect(probe.Spec.ServiceAccountName).To(Equal("importer-sa"))
	g.Expect(probe.Spec.AutomountServiceAccountToken).To(Equal(ptr.To(false)))
	g.Expect(probe.Annotations).To(HaveKeyWithValue("k8s.v1.cni.cncf.io/networks", "storage-net"))
	d := &diskvolume.DiskVolume{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKeyFromObject(dv), d) }, 20*time.Second).Should(Succeed())
	g.Expect(d.Annotations).To(HaveKeyWithValue("transfer.diskpipe.io/priority-class", "imports-low"), "the disk's copy pods too")
}

// TestInsecureRegistries: a registry the CDIConfig's insecureRegistries names (CDI's
// registry:5000 of KubeVirt's examples) is read over plain HTTP; any other is verified.
func TestInsecureRegistries(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t, "insecure")
	withConfig(t, func(spec *cdiv1.CDIConfigSpec) { spec.InsecureRegistries = []string{"registry:5000"} })
	for name, url := range map[string]string{"plain": "docker://registry:5000/disks/cirros:latest", "verified": "docker://quay.io/containerdisks/fedora:latest"} {
		dv := dataVolume(ns, name, &cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{URL: ptr.To(url)}}, "1Gi")
		g.Expect(env.Client.Create(ctx, dv)).To(Succeed())
	}
	for name, want := range map[string]bool{"plain": true, "verified": false} {
		img := &hypercloud.VirtualMachineImage{}
		g.Eventually(func() error {
			return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: cdi.SourceImage(name)}, img)
		}, 20*time.Second).Should(Succeed())
		g.Expect(img.Spec.Source.Registry.InsecureSkipTLSVerify).To(Equal(want), name)
	}
}

// TestProfileHook: a PVC KubeVirt labels for it (a VM's persistent state, a memory dump) gets
// the access and volume modes of its class's StorageProfile, as CDI's webhook gives them: RWX
// Block on Ceph RBD, which the VM's live migration needs; an unlabelled PVC is left alone.
func TestProfileHook(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t, "pvc-hook")
	g.Expect(client.IgnoreAlreadyExists(env.Client.Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "hook-rbd"},
		Provisioner: "rbd.csi.ceph.com"}))).To(Succeed())
	g.Eventually(func() int {
		p := &cdiv1.StorageProfile{}
		_ = env.Client.Get(ctx, client.ObjectKey{Name: "hook-rbd"}, p)
		return len(p.Status.ClaimPropertySets)
	}, 20*time.Second).Should(Equal(3))
	claim := func(name string, labels map[string]string, mode *corev1.PersistentVolumeMode) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
			Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: ptr.To("hook-rbd"), VolumeMode: mode,
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *ctrltest.Quantity("10Mi")}}}}
	}
	label := map[string]string{cdi.LabelApplyStorageProfile: "true"}
	block := claim("persistent-state-for-vm", label, ptr.To(corev1.PersistentVolumeBlock))
	g.Expect(env.Client.Create(ctx, block)).To(Succeed())
	g.Expect(fmt.Sprintf("%v %s", block.Spec.AccessModes, ptr.Deref(block.Spec.VolumeMode, ""))).To(Equal("[ReadWriteMany] Block"))
	// The API defaults a claim's volume mode to Filesystem before any webhook sees it.
	fs := claim("dump", label, nil)
	g.Expect(env.Client.Create(ctx, fs)).To(Succeed())
	g.Expect(fmt.Sprintf("%v %s", fs.Spec.AccessModes, ptr.Deref(fs.Spec.VolumeMode, ""))).To(Equal("[ReadWriteOnce] Filesystem"))
	plain := claim("plain", nil, nil)
	plain.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	g.Expect(env.Client.Create(ctx, plain)).To(Succeed())
	g.Expect(ptr.Deref(plain.Spec.VolumeMode, "")).To(Equal(corev1.PersistentVolumeFilesystem), "the API's default, not the profile's")
	// Sizes, as CDI renders them: a Filesystem claim keeps the filesystem's share besides what
	// it asks for; a Block one is the disk; an unlabelled one is left as asked.
	size := func(pvc *corev1.PersistentVolumeClaim) int64 { return pvc.Spec.Resources.Requests.Storage().Value() }
	g.Expect(size(block)).To(Equal(int64(10 << 20)))
	config := &cdiv1.CDIConfig{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Name: "config"}, config)).To(Succeed())
	overhead, err := strconv.ParseFloat(string(config.Status.FilesystemOverhead.Global), 64)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(size(fs)).To(Equal(transfer.VolumeSizeFor(10<<20, overhead)), "the overhead the CDIConfig tells, %g", overhead)
	g.Expect(size(plain)).To(Equal(int64(10 << 20)))
	// volumeMode FromStorageProfile, which the API refuses, is the profile's.
	from := claim("from-profile", label, ptr.To(cdiv1.PersistentVolumeFromStorageProfile))
	g.Expect(env.Client.Create(ctx, from)).To(Succeed())
	g.Expect(fmt.Sprintf("%v %s %d", from.Spec.AccessModes, ptr.Deref(from.Spec.VolumeMode, ""), size(from))).To(Equal("[ReadWriteMany] Block 10485760"))
	// Storage that makes no smaller volume than its profile says: the claim asks for that.
	p := &cdiv1.StorageProfile{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Name: "hook-rbd"}, p)).To(Succeed())
	g.Expect(ctrltest.Update(ctx, env.Client, p, func() { metav1.SetMetaDataAnnotation(&p.ObjectMeta, cdi.AnnMinimumSize, "1Gi") })).To(Succeed())
	g.Eventually(func() int64 {
		small := claim("", label, ptr.To(corev1.PersistentVolumeBlock))
		small.GenerateName = "tpm-"
		g.Expect(env.Client.Create(ctx, small)).To(Succeed())
		return size(small)
	}, 20*time.Second).Should(Equal(int64(1 << 30)))
}

// withConfig changes the CDIConfig's spec for the test, and puts it back as it was after.
func withConfig(t *testing.T, change func(*cdiv1.CDIConfigSpec)) {
	t.Helper()
	g := NewWithT(t)
	config := &cdiv1.CDIConfig{}
	g.Eventually(func() error { return env.Client.Get(t.Context(), client.ObjectKey{Name: "config"}, config) }, 20*time.Second).Should(Succeed())
	was := config.Spec.DeepCopy()
	g.Expect(ctrltest.Update(t.Context(), env.Client, config, func() { change(&config.Spec) })).To(Succeed())
	t.Cleanup(func() {
		_ = ctrltest.Update(context.Background(), env.Client, config, func() { config.Spec = *was })
	})
}

// TestDataImportCronSnapshotFormat: where the StorageProfile of a DataImportCron's class says
// dataImportCronSourceFormat: snapshot, the DataSource names the newest revision's golden
// VolumeSnapshot once it is ready to use (until then it names nothing new), the status says the
// format, and a DataVolume made from the DataSource is cloned from the revision's image itself.
func TestDataImportCronSnapshotFormat(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t, "cron-snap")
	g.Expect(env.Client.Create(ctx, &snapshotv1.VolumeSnapshotClass{ObjectMeta: metav1.ObjectMeta{Name: "snapfmt-snapshots"},
		Driver: "snapfmt.diskpipe.test", DeletionPolicy: snapshotv1.VolumeSnapshotContentDelete})).To(Succeed())
	g.Expect(env.Client.Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "snapfmt"}, Provisioner: "snapfmt.diskpipe.test"})).To(Succeed())
	p := &cdiv1.StorageProfile{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKey{Name: "snapfmt"}, p) }, 20*time.Second).Should(Succeed())
	g.Expect(ctrltest.Update(ctx, env.Client, p, func() {
		p.Spec.DataImportCronSourceFormat = ptr.To(cdiv1.DataImportCronSourceFormatSnapshot)
	})).To(Succeed())
	g.Eventually(func() string {
		_ = env.Client.Get(ctx, client.ObjectKey{Name: "snapfmt"}, p)
		return fmt.Sprint(ptr.Deref(p.Status.DataImportCronSourceFormat, ""), " ", ptr.Deref(p.Status.SnapshotClass, ""))
	}, 20*time.Second).Should(Equal("snapshot snapfmt-snapshots"))

	cron := &cdiv1.DataImportCron{ObjectMeta: metav1.ObjectMeta{Name: "fedora-cron", Namespace: ns}, Spec: cdiv1.DataImportCronSpec{
		Schedule: "@every 1h", ManagedDataSource: "fedora",
		Template: cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{
			URL: ptr.To("docker://quay.io/containerdisks/fedora:latest")}}, Storage: &cdiv1.StorageSpec{StorageClassName: ptr.To("snapfmt")}}}}}
	g.Expect(env.Client.Create(ctx, cron)).To(Succeed())
	name, err := cdi.CronImageName(cron)
	g.Expect(err).NotTo(HaveOccurred())
	img := &hypercloud.VirtualMachineImage{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, img) }, 20*time.Second).Should(Succeed())
	const digest = "sha256:3333333333333333333333333333333333333333333333333333333333333333"
	ctrltest.Complete(t, env, ns, "vmim-"+name+"-check-0", transfer.Result{Revision: digest})
	rev := newRevision(t, ns, img, digest)
	ctrltest.Complete(t, env, ns, "vmim-"+rev.Name+"-probe-0", transfer.Result{Format: "qcow2", VirtualSize: 1 << 30, Revision: digest})
	ctrltest.Bind(t, env, ns, "vmim-"+rev.Name)
	importRevision(t, ns, rev, digest)

	// The revision's golden snapshot is taken with the profile's VolumeSnapshotClass; the
	// DataSource waits for it.
	snap := &snapshotv1.VolumeSnapshot{}
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vmim-" + rev.Name + "-golden"}, snap)
	}, 20*time.Second).Should(Succeed())
	g.Expect(snap.Spec.VolumeSnapshotClassName).To(Equal(ptr.To("snapfmt-snapshots")))
	g.Expect(*snap.Spec.Source.PersistentVolumeClaimName).To(Equal("vmim-" + rev.Name))
	upToDate := func() string {
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(cron), cron)
		for _, c := range cron.Status.Conditions {
			if c.Type == cdiv1.DataImportCronUpToDate {
				return fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
			}
		}
		return ""
	}
	g.Eventually(upToDate, 20*time.Second).Should(Equal("False SnapshotNotReady: waiting for the VolumeSnapshot vmim-" + rev.Name + "-golden of PVC vmim-" + rev.Name + " to be ready to use"))
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fedora"}, &cdiv1.DataSource{})).NotTo(Succeed(), "no DataSource before the snapshot is ready")
	snap.Status = &snapshotv1.VolumeSnapshotStatus{ReadyToUse: ptr.To(true), RestoreSize: ptr.To(resource.MustParse("1Gi"))}
	g.Expect(env.Client.Status().Update(ctx, snap)).To(Succeed())
	g.Eventually(upToDate, 20*time.Second).Should(HavePrefix("True UpToDate"))
	g.Expect(cron.Status.SourceFormat).To(Equal(ptr.To(cdiv1.DataImportCronSourceFormatSnapshot)))

	ds := &cdiv1.DataSource{}
	g.Eventually(func() string {
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fedora"}, ds); err != nil || len(ds.Status.Conditions) == 0 {
			return fmt.Sprint(err)
		}
		return string(ds.Status.Conditions[0].Status)
	}, 20*time.Second).Should(Equal("True"), "the DataSource is Ready on the revision's snapshot")
	g.Expect(ds.Spec.Source).To(Equal(cdiv1.DataSourceSource{Snapshot: &cdiv1.DataVolumeSourceSnapshot{Namespace: ns, Name: snap.Name}}))

	clonedFromRevision(t, ns, "fedora", rev)
}

// TestProfileSnapshotClass: with CDI's API served, a StorageProfile's spec.snapshotClass names
// the class of the golden snapshots diskpipe takes of its storage class's images (CDI's rule for
// its snapshot clones), over the driver's default; the profile's status says the same class.
func TestProfileSnapshotClass(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t, "profile-snap")
	const driver = "profsnap.diskpipe.test"
	for name, isDefault := range map[string]string{"profsnap-default": "true", "profsnap-chosen": "false"} {
		g.Expect(env.Client.Create(ctx, &snapshotv1.VolumeSnapshotClass{ObjectMeta: metav1.ObjectMeta{Name: name,
			Annotations: map[string]string{"snapshot.storage.kubernetes.io/is-default-class": isDefault}},
			Driver: driver, DeletionPolicy: snapshotv1.VolumeSnapshotContentDelete})).To(Succeed())
	}
	g.Expect(env.Client.Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "profsnap"}, Provisioner: driver})).To(Succeed())
	p := &cdiv1.StorageProfile{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKey{Name: "profsnap"}, p) }, 20*time.Second).Should(Succeed())
	g.Expect(ctrltest.Update(ctx, env.Client, p, func() { p.Spec.SnapshotClass = ptr.To("profsnap-chosen") })).To(Succeed())
	g.Eventually(func() string {
		_ = env.Client.Get(ctx, client.ObjectKey{Name: "profsnap"}, p)
		return ptr.Deref(p.Status.SnapshotClass, "")
	}, 20*time.Second).Should(Equal("profsnap-chosen"))

	img := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "golden", Namespace: ns},
		Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{HTTP: common.HTTPURL("https://images.example.com/golden.qcow2")}}}
	img.Spec.Resources.Requests.Storage = ctrltest.Quantity("2Gi")
	img.Spec.StorageClassName = ptr.To("profsnap")
	g.Expect(env.Client.Create(ctx, img)).To(Succeed())
	ctrltest.Bind(t, env, ns, "vmim-golden")
	ctrltest.Complete(t, env, ns, "vmim-golden-import-0", transfer.Result{Format: "qcow2", VirtualSize: 1 << 30})
	g.Eventually(func() common.Phase {
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(img), img)
		return img.Status.Phase
	}, 20*time.Second).Should(Equal(common.PhaseReady))
	d := &diskvolume.DiskVolume{ObjectMeta: metav1.ObjectMeta{Name: "disk", Namespace: ns}, Spec: diskvolume.DiskVolumeSpec{
		Source: diskvolume.DiskVolumeSource{Image: &diskvolume.ImageSource{Name: "golden", Kind: diskvolume.ImageKindVirtualMachineImage}}}}
	d.Spec.StorageClassName = ptr.To("profsnap")
	g.Expect(env.Client.Create(ctx, d)).To(Succeed())
	snap := &snapshotv1.VolumeSnapshot{}
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vmim-golden-golden"}, snap)
	}, 20*time.Second).Should(Succeed())
	g.Expect(snap.Spec.VolumeSnapshotClassName).To(Equal(ptr.To("profsnap-chosen")), "the profile's class, not the driver's default")
}
