package cdi_test

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/cdi"
	"github.com/diskpipe/diskpipe/controllers/internal/ctrltest"
	"github.com/diskpipe/diskpipe/internal/cdiclaims"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore/uploads"
)

// TestUploadPVC: a PVC made for an upload (as virtctl image-upload pvc makes it, with the
// dataSourceRef admission gives it) gets its staging image, of its class and mode, controlled
// by it; its annotations say ready once the image waits for its bytes, as virtctl waits for
// them; once the claim is bound (the populator wrote the upload into it) the image is deleted
// and the claim says Succeeded. A staging image's name taken by someone else's image is the
// claim's event, with the reason virtctl reports.
func TestUploadPVC(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t, "uploadpvc")
	claim := func(name string) *corev1.PersistentVolumeClaim {
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Annotations: map[string]string{cdiclaims.AnnUploadTarget: "", "cdi.kubevirt.io/storage.contentType": "kubevirt"}},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: ptr.To("csi"), VolumeMode: ptr.To(corev1.PersistentVolumeBlock),
				Resources:     corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *ctrltest.Quantity("1Gi")}},
				DataSourceRef: &corev1.TypedObjectReference{APIGroup: ptr.To(hypercloud.GroupVersion.Group), Kind: "VirtualMachineImage", Name: cdiclaims.UploadPVCImage(name)}}}
		g.Expect(env.Client.Create(ctx, pvc)).To(Succeed())
		return pvc
	}
	state := func(pvc *corev1.PersistentVolumeClaim) func() string {
		return func() string {
			_ = env.Client.Get(ctx, client.ObjectKeyFromObject(pvc), pvc)
			return pvc.Annotations[cdiclaims.AnnPodPhase] + " ready=" + pvc.Annotations[cdiclaims.AnnPodReady]
		}
	}

	disk := claim("disk")
	img := &hypercloud.VirtualMachineImage{}
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: cdiclaims.UploadPVCImage("disk")}, img)
	}, 20*time.Second).Should(Succeed())
	g.Expect(metav1.IsControlledBy(img, disk)).To(BeTrue(), "deleting the PVC deletes its staging image")
	g.Expect(img.Spec.Source.Upload).To(Equal(&common.UploadSource{}))
	g.Expect(img.Spec.StorageClassName).To(Equal(ptr.To("csi")))
	g.Expect(img.Spec.VolumeMode).To(Equal(ptr.To(corev1.PersistentVolumeBlock)))
	g.Eventually(state(disk), 30*time.Second).Should(Equal("Running ready=true"), "the image waits for its bytes")

	// The populator binds the claim once the upload is written into it.
	ctrltest.Bind(t, env, ns, "disk")
	g.Eventually(state(disk), 20*time.Second).Should(Equal("Succeeded ready=false"))
	g.Eventually(func() bool {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(img), img)
		return apierrors.IsNotFound(err) || err == nil && !img.DeletionTimestamp.IsZero()
	}, 20*time.Second).Should(BeTrue(), "the staging image is deleted once the claim holds the upload")

	// Someone else's image of the staging image's name is left alone, and the claim says why.
	g.Expect(env.Client.Create(ctx, &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: cdiclaims.UploadPVCImage("taken"), Namespace: ns},
		Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{Upload: &common.UploadSource{}}}})).To(Succeed())
	taken := claim("taken")
	g.Eventually(eventNote(t, taken, cdi.ReasonUploadImageTaken), 20*time.Second).Should(Equal("VirtualMachineImage pvc-taken, which stages this PVC's upload, already exists and is not this PVC's: " +
		"delete it, or upload into a PVC of another name"))
	g.Eventually(state(taken), 20*time.Second).Should(Equal("Pending ready=false"), "the claim's annotations follow the event")
}

// TestDataVolumeUpload: a DataVolume of source upload has its claim at once, Pending, made for
// the upload as virtctl image-upload pvc makes one, and controlled by the DataVolume: virtctl
// image-upload dv NAME --no-create looks for that claim, to fill a DataVolume KubeVirt made
// from a VM's dataVolumeTemplates. The DataVolume is UploadReady once the staging image waits
// for its bytes and Succeeded once the populator has bound the claim. Without a size, or with a
// name too long for its staging image, it fails and says why.
func TestDataVolumeUpload(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t, "dv-upload")

	dv := dataVolume(ns, "root", &cdiv1.DataVolumeSource{Upload: &cdiv1.DataVolumeSourceUpload{}}, "1Gi")
	g.Expect(env.Client.Create(ctx, dv)).To(Succeed())
	pvc := &corev1.PersistentVolumeClaim{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "root"}, pvc) }, 20*time.Second).Should(Succeed())
	g.Expect(metav1.IsControlledBy(pvc, dv)).To(BeTrue(), "deleting the DataVolume deletes its claim: %v", pvc.OwnerReferences)
	g.Expect(cdiclaims.IsUploadPVC(pvc)).To(BeTrue(), "made for the upload: %v %+v", pvc.Annotations, pvc.Spec.DataSourceRef)
	g.Expect(pvc.Spec.AccessModes).To(Equal([]corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}))
	g.Expect(pvc.Spec.Resources.Requests.Storage().Value()).To(Equal(transfer.VolumeSizeFor(1<<30, 0.2)), "1Gi of disk in a claim keeping 20 %% free")
	g.Expect(pvc.Status.Phase).NotTo(Equal(corev1.ClaimBound))
	img := &hypercloud.VirtualMachineImage{}
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: cdiclaims.UploadPVCImage("root")}, img)
	}, 20*time.Second).Should(Succeed())
	g.Expect(metav1.IsControlledBy(img, pvc)).To(BeTrue())
	g.Eventually(dvState(t, dv), 30*time.Second).Should(Equal("UploadReady N/A Bound=False:WaitingForUpload Ready=False: Running=False:WaitingForUpload"))
	g.Expect(dv.Status.ClaimName).To(Equal("root"))
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "root"}, &diskvolume.DiskVolume{})).NotTo(Succeed(),
		"the claim is filled by the populator, not by a DiskVolume of the DataVolume's name")

	ctrltest.Bind(t, env, ns, "root")
	g.Eventually(dvState(t, dv), 20*time.Second).Should(Equal("Succeeded 100.0% Bound=True:Bound Ready=True: Running=False:Completed"))
	g.Eventually(func() string {
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(pvc), pvc)
		return pvc.Annotations[cdiclaims.AnnPodPhase]
	}, 20*time.Second).Should(Equal("Succeeded"), "what virtctl waits on")

	// On a class that binds at the first consumer the populator fills the claim once the VM's
	// pod is scheduled: the DataVolume is PendingPopulation meanwhile, on which KubeVirt starts
	// the VM.
	lazy := dataVolume(ns, "lazy", &cdiv1.DataVolumeSource{Upload: &cdiv1.DataVolumeSourceUpload{}}, "1Gi")
	lazy.Spec.Storage.StorageClassName = ptr.To(classWFFC)
	g.Expect(env.Client.Create(ctx, lazy)).To(Succeed())
	g.Eventually(dvState(t, lazy), 30*time.Second).Should(HavePrefix("UploadReady "))
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: cdiclaims.UploadPVCImage("lazy")}, img)).To(Succeed())
	uploaded(t, img) // as the upload proxy leaves it
	ctrltest.Complete(t, env, ns, "vmim-pvc-lazy-probe-0", transfer.Result{Format: "qcow2", VirtualSize: 1 << 30})
	ctrltest.Bind(t, env, ns, "vmim-pvc-lazy")
	ctrltest.Complete(t, env, ns, "vmim-pvc-lazy-import-0", transfer.Result{Format: "qcow2", VirtualSize: 1 << 30})
	g.Eventually(dvState(t, lazy), 20*time.Second).Should(Equal("PendingPopulation N/A Bound=False:Pending Ready=False: Running=False:WaitForFirstConsumer"))
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "lazy", Namespace: ns}}
	g.Expect(ctrltest.Update(ctx, env.Client, claim, func() {
		metav1.SetMetaDataAnnotation(&claim.ObjectMeta, "volume.kubernetes.io/selected-node", "node-a") // the VM's pod is scheduled
	})).To(Succeed())
	g.Eventually(dvState(t, lazy), 20*time.Second).Should(Equal("ImportInProgress N/A Bound=False:Pending Ready=False: Running=True:"),
		"the populator fills the claim from the upload")

	sizeless := dataVolume(ns, "sizeless", &cdiv1.DataVolumeSource{Upload: &cdiv1.DataVolumeSourceUpload{}}, "1Gi")
	sizeless.Spec.Storage.Resources = corev1.VolumeResourceRequirements{}
	long := dataVolume(ns, strings.Repeat("a", cdiclaims.MaxUploadPVCName+1), &cdiv1.DataVolumeSource{Upload: &cdiv1.DataVolumeSourceUpload{}}, "1Gi")
	for dv, want := range map[*cdiv1.DataVolume]string{
		sizeless: "a DataVolume of source upload needs a size: spec.storage.resources.requests.storage",
		long:     "a DataVolume of source upload has a name of at most 196 characters (its staging image is named pvc-<name>)",
	} {
		g.Expect(env.Client.Create(ctx, dv)).To(Succeed())
		g.Eventually(dvState(t, dv), 20*time.Second).Should(Equal("Failed N/A Bound=False:InvalidSpec Ready=False: Running=False:InvalidSpec"))
		g.Expect(dv.Status.Conditions[0].Message).To(Equal(want))
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(dv), &corev1.PersistentVolumeClaim{})).NotTo(Succeed(), "no claim is made")
	}
}

// uploaded puts an upload of img into the bundled store as the upload proxy leaves it: the
// object and its marker.
func uploaded(t *testing.T, img *hypercloud.VirtualMachineImage) {
	t.Helper()
	g := NewWithT(t)
	key := uploads.ObjectKey(img.Namespace, "virtualmachineimages", img.Name, string(img.UID))
	c := store.Client()
	g.Expect(c.EnsureBucket(t.Context(), uploads.Bucket)).To(Succeed())
	for k, b := range map[string][]byte{key: []byte("the uploaded image"), uploads.MarkerKey(key): []byte("sha256:x")} {
		_, err := c.PutObject(t.Context(), uploads.Bucket, k, bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{})
		g.Expect(err).NotTo(HaveOccurred())
	}
}

// TestImportEndpointPVC: CDI's legacy import into a plain PVC (the endpoint annotation, with
// the dataSourceRef admission gives it) gets its staging image, of the source the annotations
// name, with their Secret and CA, controlled by the PVC; its annotations say Running while the
// image imports, Succeeded once the claim is bound, Failed with CDI's event when the import
// fails; a source kind diskpipe does not serve fails with the reason.
func TestImportEndpointPVC(t *testing.T) {
	setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns := namespace(t, "importpvc")
	claim := func(name string, ann map[string]string) *corev1.PersistentVolumeClaim {
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: ann},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: ptr.To("csi"),
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *ctrltest.Quantity("1Gi")}},
				DataSourceRef:    cdiclaims.UploadPVCSource(name)}}
		g.Expect(env.Client.Create(ctx, pvc)).To(Succeed())
		return pvc
	}
	phase := func(pvc *corev1.PersistentVolumeClaim) func() string {
		return func() string {
			_ = env.Client.Get(ctx, client.ObjectKeyFromObject(pvc), pvc)
			return pvc.Annotations[cdiclaims.AnnPodPhase]
		}
	}
	staging := func(name string) *hypercloud.VirtualMachineImage {
		img := &hypercloud.VirtualMachineImage{}
		g.Eventually(func() error {
			return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: cdiclaims.UploadPVCImage(name)}, img)
		}, 20*time.Second).Should(Succeed())
		return img
	}

	disk := claim("fedora", map[string]string{cdiclaims.AnnImportEndpoint: "https://images.example.com/fedora.qcow2",
		cdiclaims.AnnImportSecret: "creds", cdiclaims.AnnImportCertConfigMap: "ca"})
	img := staging("fedora")
	g.Expect(metav1.IsControlledBy(img, disk)).To(BeTrue(), "deleting the PVC deletes its staging image")
	g.Expect(img.Spec.Source.HTTP).To(Equal(common.HTTPURL("https://images.example.com/fedora.qcow2")))
	g.Expect(img.Spec.Source.HTTPOptions.SecretRef).To(Equal(common.LocalName("creds")))
	g.Expect(img.Spec.Source.HTTPOptions.CertConfigMap).To(Equal(common.LocalName("ca")))
	g.Expect(img.Spec.StorageClassName).To(Equal(ptr.To("csi")))
	g.Eventually(phase(disk), 20*time.Second).Should(Or(Equal("Pending"), Equal("Running")))
	ctrltest.Bind(t, env, ns, "fedora")
	g.Eventually(phase(disk), 20*time.Second).Should(Equal("Succeeded"))

	claim("cirros", map[string]string{cdiclaims.AnnImportEndpoint: "docker://quay.io/kubevirt/cirros-container-disk-demo", cdiclaims.AnnImportSource: "registry"})
	g.Expect(staging("cirros").Spec.Source.Registry.URL).To(Equal("docker://quay.io/kubevirt/cirros-container-disk-demo"))
	g.Expect(staging("cirros").Spec.Source.Registry.InsecureSkipTLSVerify).To(BeFalse())
	// A registry the CDIConfig calls insecure is read as a DataVolume's would be.
	withConfig(t, func(spec *cdiv1.CDIConfigSpec) { spec.InsecureRegistries = []string{"registry.lab:5000"} })
	g.Eventually(func() error {
		c := &cdiv1.CDIConfig{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: cdi.CDIConfigName}, c); err != nil || len(c.Spec.InsecureRegistries) == 0 {
			return fmt.Errorf("not yet: %w", err)
		}
		return nil
	}, 20*time.Second).Should(Succeed())
	claim("lab", map[string]string{cdiclaims.AnnImportEndpoint: "docker://registry.lab:5000/disks/fedora:41", cdiclaims.AnnImportSource: "registry"})
	g.Expect(staging("lab").Spec.Source.Registry.InsecureSkipTLSVerify).To(BeTrue())

	// An import that fails: the claim says Failed, with CDI's event.
	broken := claim("broken", map[string]string{cdiclaims.AnnImportEndpoint: "https://images.example.com/broken.qcow2"})
	bimg := staging("broken")
	g.Eventually(func() error { // its controller writes its status meanwhile
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(bimg), bimg); err != nil {
			return err
		}
		bimg.Status.Phase = common.PhaseFailed
		bimg.Status.Conditions = []metav1.Condition{{Type: common.ConditionReady, Status: metav1.ConditionFalse, Reason: "SourceNotFound", Message: "404", LastTransitionTime: metav1.Now()}}
		return env.Client.Status().Update(ctx, bimg)
	}, 20*time.Second).Should(Succeed())
	g.Eventually(phase(broken), 20*time.Second).Should(Equal("Failed"))
	g.Eventually(eventNote(t, broken, cdi.ReasonImportFailed), 20*time.Second).Should(Equal("The import failed: SourceNotFound: 404"))

	// A kind admission would have refused (a cluster without the policy): the reason, no image.
	vddk := claim("vddk", map[string]string{cdiclaims.AnnImportEndpoint: "https://vcenter.example.com", cdiclaims.AnnImportSource: "vddk"})
	g.Eventually(phase(vddk), 20*time.Second).Should(Equal("Failed"))
	g.Eventually(eventNote(t, vddk, cdi.ReasonImportFailed), 20*time.Second).Should(Equal(`cdi.kubevirt.io/storage.import.source "vddk" is not served by diskpipe: http, registry or s3`))
}

// eventNote reads the note of the newest Event of reason about obj ("" while there is none).
func eventNote(t *testing.T, obj client.Object, reason string) func() string {
	return func() string {
		list := &eventsv1.EventList{}
		if err := env.Client.List(t.Context(), list, client.InNamespace(obj.GetNamespace())); err != nil {
			return ""
		}
		note := ""
		for _, e := range list.Items {
			if e.Regarding.UID == obj.GetUID() && e.Reason == reason {
				note = e.Note
			}
		}
		return note
	}
}
