package cdi

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/populator"
	"github.com/diskpipe/diskpipe/internal/cdiclaims"
)

// Event reasons on a PVC made for an upload.
const (
	ReasonUploadImageCreated = "UploadImageCreated"
	// ReasonUploadImageTaken is the reason virtctl image-upload stops on (CDI's provisioner uses it).
	ReasonUploadImageTaken = "ProvisioningFailed"
	ReasonUploadFailed     = "UploadFailed"
	// ReasonImportFailed is CDI's legacy import into a PVC that failed (CDI's own event reason).
	ReasonImportFailed = "ErrImportFailed"
)

// staged says whether pvc is staged by an image this controller makes: an upload into it, or
// CDI's legacy import into it.
func staged(pvc *corev1.PersistentVolumeClaim) bool {
	return cdiclaims.IsUploadPVC(pvc) || cdiclaims.IsImportPVC(pvc)
}

// legacySource is the image source of CDI's legacy import into pvc, from its annotations:
// the endpoint, its kind (http when it names none), the Secret and the CA's ConfigMap of the
// PVC's namespace; a registry among insecure (the CDIConfig's insecureRegistries) as a
// DataVolume's. Admission refused the kinds diskpipe does not serve.
func legacySource(pvc *corev1.PersistentVolumeClaim, insecure []string) (*hypercloud.VirtualMachineImageSource, error) {
	a := pvc.Annotations
	endpoint, secret, ca := a[cdiclaims.AnnImportEndpoint], a[cdiclaims.AnnImportSecret], a[cdiclaims.AnnImportCertConfigMap]
	var src cdiv1.DataVolumeSource
	switch kind := cmp.Or(a[cdiclaims.AnnImportSource], "http"); kind {
	case "http":
		src.HTTP = &cdiv1.DataVolumeSourceHTTP{URL: endpoint, SecretRef: secret, CertConfigMap: ca}
	case "registry":
		src.Registry = &cdiv1.DataVolumeSourceRegistry{URL: &endpoint, SecretRef: ptr.To(secret), CertConfigMap: ptr.To(ca)}
	case "s3":
		src.S3 = &cdiv1.DataVolumeSourceS3{URL: endpoint, SecretRef: secret, CertConfigMap: ca}
	default:
		return nil, fmt.Errorf("%s %q is not served by diskpipe: http, registry or s3", cdiclaims.AnnImportSource, kind)
	}
	img, err := imageSource(&src, pvc.Namespace, insecure)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", cdiclaims.AnnImportEndpoint, endpoint, err)
	}
	return img, nil
}

// UploadPVCReconciler serves `virtctl image-upload pvc`, the claim of a DataVolume of
// source upload (observeUpload makes it the same way), and CDI's legacy import into a PVC
// (cdiclaims.AnnImportEndpoint: its staging image imports the source the annotations name, and
// its annotations say Pending, Running, Succeeded or Failed as CDI's import controller's do): a PVC made for an upload
// (cdiclaims.IsUploadPVC: marked cdi.kubevirt.io/storage.upload.target, its dataSourceRef
// given by admission) gets its staging image, a VirtualMachineImage of source upload that the
// PVC controls, of the PVC's class and volume mode. The upload proxy takes CDI's upload into
// that image (its UploadTokenRequest names the PVC); diskpipe's populator fills the PVC from
// the image once it is Ready and binds it then, so no VM starts on a half-written disk. The
// PVC's annotations say what virtctl waits for, as CDI's upload server leaves them:
// cdi.kubevirt.io/storage.pod.ready "true" while the image waits for its bytes, pod.phase
// Running meanwhile and Succeeded once the PVC is bound (the staging image is deleted then),
// Failed when the import failed (the reason is the PVC's event).
type UploadPVCReconciler struct {
	client.Client
	// API reads the CDIConfig uncached, as the administrator just set it, for the source of a
	// legacy import's staging image (one read a pass of such a PVC).
	API    client.Reader
	Events events.EventRecorder
}

func setupUploadPVCs(mgr ctrl.Manager) error {
	r := &UploadPVCReconciler{Client: mgr.GetClient(), API: mgr.GetAPIReader(), Events: mgr.GetEventRecorder("diskpipe-cdi")}
	uploads := predicate.NewPredicateFuncs(func(o client.Object) bool {
		pvc, ok := o.(*corev1.PersistentVolumeClaim)
		return ok && staged(pvc)
	})
	return ctrl.NewControllerManagedBy(mgr).Named("uploadpvc").
		For(&corev1.PersistentVolumeClaim{}, builder.WithPredicates(uploads)).
		Owns(&hypercloud.VirtualMachineImage{}).Complete(r)
}

// Reconcile makes or removes the staging image of a PVC made for an upload, and writes on the
// PVC the state of its upload.
func (r *UploadPVCReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.Get(ctx, req.NamespacedName, pvc); err != nil || !staged(pvc) || !pvc.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	img := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: cdiclaims.UploadPVCImage(pvc.Name), Namespace: pvc.Namespace,
		Labels: map[string]string{goldenimage.LabelStaging: "true"}}}
	if pvc.Status.Phase == corev1.ClaimBound {
		// The populator has written the upload into the claim: the staging image has done its work.
		err := r.Get(ctx, client.ObjectKeyFromObject(img), img)
		if err == nil && metav1.IsControlledBy(img, pvc) && img.DeletionTimestamp.IsZero() {
			err = r.Delete(ctx, img)
		}
		if client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, r.annotate(ctx, pvc, corev1.PodSucceeded, false)
	}
	src, what := &hypercloud.VirtualMachineImageSource{Upload: &common.UploadSource{}}, "upload"
	if cdiclaims.IsImportPVC(pvc) {
		config, err := settings(ctx, r.Client, r.API, false)
		if err != nil {
			return ctrl.Result{}, err
		}
		if src, err = legacySource(pvc, config.InsecureRegistries); err != nil {
			r.Events.Eventf(pvc, nil, corev1.EventTypeWarning, ReasonImportFailed, "Import", "%s", err.Error())
			return ctrl.Result{}, r.annotate(ctx, pvc, corev1.PodFailed, false)
		}
		what = "import"
	}
	img.Spec = hypercloud.VirtualMachineImageSpec{Source: *src,
		VolumeOptions: common.VolumeOptions{StorageClassName: pvc.Spec.StorageClassName, VolumeMode: pvc.Spec.VolumeMode}}
	created, err := owned.Ensure(ctx, r.Client, pvc, img)
	if notOwned := (*owned.ErrNotOwned)(nil); errors.As(err, &notOwned) {
		r.Events.Eventf(pvc, nil, corev1.EventTypeWarning, ReasonUploadImageTaken, "Upload",
			"VirtualMachineImage %s, which stages this PVC's %s, already exists and is not this PVC's: delete it, or %s into a PVC of another name", img.Name, what, what)
		return ctrl.Result{}, r.annotate(ctx, pvc, corev1.PodPending, false)
	} else if err != nil {
		return ctrl.Result{}, err
	}
	if created {
		r.Events.Eventf(pvc, img, corev1.EventTypeNormal, ReasonUploadImageCreated, "Upload",
			"VirtualMachineImage %s takes the %s; the PVC is bound once it is written into it", img.Name, what)
	}
	ready := meta.FindStatusCondition(img.Status.Conditions, common.ConditionReady)
	switch {
	case img.Status.Phase == common.PhaseFailed:
		msg := string(img.Status.Phase)
		if ready != nil {
			msg = ready.Reason + ": " + ready.Message
		}
		if what == "import" {
			r.Events.Eventf(pvc, img, corev1.EventTypeWarning, ReasonImportFailed, "Import", "The import failed: %s", msg)
		} else {
			r.Events.Eventf(pvc, img, corev1.EventTypeWarning, ReasonUploadFailed, "Upload", "The upload's import failed: %s", msg)
		}
		return ctrl.Result{}, r.annotate(ctx, pvc, corev1.PodFailed, false)
	case ready != nil && ready.Reason == goldenimage.ReasonWaitingForUpload:
		return ctrl.Result{}, r.annotate(ctx, pvc, corev1.PodRunning, true)
	case img.Status.Phase == common.PhaseImporting || img.Status.Phase == common.PhaseReady:
		return ctrl.Result{}, r.annotate(ctx, pvc, corev1.PodRunning, false)
	}
	return ctrl.Result{}, r.annotate(ctx, pvc, corev1.PodPending, false)
}

// annotate writes the upload's state on pvc as CDI's upload controller does.
func (r *UploadPVCReconciler) annotate(ctx context.Context, pvc *corev1.PersistentVolumeClaim, phase corev1.PodPhase, ready bool) error {
	readiness := "false"
	if ready {
		readiness = "true"
	}
	if pvc.Annotations[cdiclaims.AnnPodPhase] == string(phase) && pvc.Annotations[cdiclaims.AnnPodReady] == readiness {
		return nil
	}
	patch := client.MergeFrom(pvc.DeepCopy())
	metav1.SetMetaDataAnnotation(&pvc.ObjectMeta, cdiclaims.AnnPodPhase, string(phase))
	metav1.SetMetaDataAnnotation(&pvc.ObjectMeta, cdiclaims.AnnPodReady, readiness)
	return r.Patch(ctx, pvc, patch)
}

// observeUpload serves a DataVolume of source upload as an upload into a PVC is served: its
// claim, of its name, is made at once as a PVC made for an upload (marked, its dataSourceRef
// its staging image), which the DataVolume controls; UploadPVCReconciler stages the upload
// and the populator fills the claim, which is bound only then. As with CDI's populated
// claims, the claim exists, Pending, from the start: `virtctl image-upload dv NAME
// --no-create` looks for it, to fill a DataVolume KubeVirt made from a VM's
// dataVolumeTemplates. The status is the staging image's while it imports, then the
// populator's disk's, and Succeeded once the claim is bound.
func (r *Reconciler) observeUpload(ctx context.Context, dv *cdiv1.DataVolume, spec diskvolume.DiskVolumeSpec) (observed, error) {
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: dv.Name, Namespace: dv.Namespace,
		Labels: map[string]string{LabelDataVolume: string(dv.UID)}, Annotations: map[string]string{cdiclaims.AnnUploadTarget: ""}},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: spec.AccessModes, StorageClassName: spec.StorageClassName, VolumeMode: spec.VolumeMode,
			Resources:     corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *spec.Resources.Requests.Storage}},
			DataSourceRef: cdiclaims.UploadPVCSource(dv.Name)}}
	if len(pvc.Spec.AccessModes) == 0 {
		pvc.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
	}
	if ref, err := r.ensureChild(ctx, dv, pvc, "PersistentVolumeClaim"); ref != nil || err != nil {
		return observed{refused: ref}, err
	}
	o := observed{upload: true, claim: pvc}
	if pvc.Status.Phase == corev1.ClaimBound {
		return o, nil
	}
	img := &hypercloud.VirtualMachineImage{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: dv.Namespace, Name: cdiclaims.UploadPVCImage(dv.Name)}, img); client.IgnoreNotFound(err) != nil {
		return observed{}, err
	} else if err != nil || img.Status.Phase != common.PhaseReady {
		o.img = img // not made yet: a zero image
		return o, nil
	}
	// The upload is in: the populator fills the claim from it.
	fill := &diskvolume.DiskVolume{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: dv.Namespace, Name: populator.DiskName(pvc)}, fill); client.IgnoreNotFound(err) != nil {
		return observed{}, err
	}
	if _, waiting, err := populator.WaitingForConsumer(ctx, r.Client, pvc); err != nil {
		return observed{}, err
	} else if waiting && fill.UID == "" {
		// The populator fills the claim on the node of its first consumer, the VM's pod:
		// KubeVirt starts the VM on a DataVolume in this phase.
		return observed{waiting: cdiv1.PendingPopulation, waitingFor: "the upload is in; PVC " + dv.Name + " is filled"}, nil
	}
	o.disk = fill
	return o, nil
}

// byClaim enqueues the DataVolume of the name of the PVC that controls an object: the staging
// image of an upload's claim, and the populator's disk that fills it.
var byClaim = handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
	if owner := metav1.GetControllerOf(o); owner != nil && owner.Kind == "PersistentVolumeClaim" {
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: owner.Name}}}
	}
	return nil
})
