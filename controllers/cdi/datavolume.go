// Package cdi serves CDI's API (cdi.kubevirt.io) with diskpipe's engine, so that what KubeVirt
// and its users write for CDI works unchanged.
//
// A DataVolume is made by a DiskVolume of its name, which it controls: the DiskVolume's PVC,
// of the same name, is the DataVolume's claim, filled and bound the way every diskpipe disk is
// (never Bound before its bytes are all there). The DataVolume's status is the DiskVolume's,
// in CDI's words: the phases, progress, restart count and Bound/Ready/Running conditions that
// KubeVirt's virt-controller reads (a Running condition False with reason "Error" is what makes
// it show a VM's DataVolumeError).
//
// An http, s3, registry or pvc source, or a snapshot of another namespace, is imported by a
// VirtualMachineImage the DataVolume controls, and the DiskVolume is cloned from it
// (importsource.go). A pvc or snapshot that is a golden image's (an image's PVC, a
// DataImportCron's snapshot) is cloned from that image itself, with nothing staged.
//
// An upload source is served as an upload into a PVC is (uploadpvc.go): the claim is made at
// once, Pending, and filled by the populator once the upload is in.
//
// A DataVolume annotated cdi.kubevirt.io/storage.prePopulated names a claim that is already
// whole (KubeVirt's VirtualMachineRestore, a volume kept from CDI): it succeeds at once and
// nothing is written.
package cdi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/disk"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/status"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
	"github.com/diskpipe/diskpipe/internal/cdiclaims"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// Reasons of the DataVolume's conditions and events: CDI's where KubeVirt reads them.
const (
	ReasonError           = "Error" // Running False: KubeVirt shows the VM's DataVolumeError
	ReasonCompleted       = "Completed"
	ReasonBound           = "Bound"
	ReasonPending         = "Pending"
	ReasonResourceExists  = "ErrResourceExists"
	ReasonSourceNotServed = "SourceNotServed"
	ReasonInvalidSpec     = "InvalidSpec"
	ReasonPrePopulated    = "PrePopulated"
	// ReasonWaitForFirstConsumer: the claim is bound when the VM's pod is scheduled.
	ReasonWaitForFirstConsumer = "WaitForFirstConsumer"
	ReasonClaimNotFound        = "ClaimNotFound"
	annPrePopulated            = cdiv1.AnnPrePopulated
)

// refusal is why a DataVolume gets no DiskVolume: a spec that cannot be served (reason
// ReasonInvalidSpec, final), a source not served yet, a name taken. running is the reason of
// its Running condition, when it is not reason.
type refusal struct{ reason, message, running string }

func (r *refusal) Error() string { return r.message }

func invalid(message string) error { return &refusal{reason: ReasonInvalidSpec, message: message} }

func notServed(source string) error {
	return &refusal{reason: ReasonSourceNotServed, message: "diskpipe's CDI API serves the sources http, s3, registry, upload, pvc, snapshot and blank, not " + source + " (docs/cdi.md)"}
}

// Options configure the DataVolume controller.
type Options struct {
	// FilesystemOverhead is kept free in a Filesystem-mode claim asked for by spec.storage,
	// as CDI does: the disk gets the size asked for, the claim more.
	FilesystemOverhead importpod.FilesystemOverhead
	// UploadProxyURL is the upload proxy's URL outside the cluster, told in the CDIConfig.
	UploadProxyURL string
	// Strategies are the installation's clone strategy defaults, told in StorageProfiles.
	Strategies disk.StrategyDefaults
}

// Reconciler serves DataVolumes.
type Reconciler struct {
	client.Client
	// API reads uncached what must be as the administrator just set it: the CDIConfig's
	// insecure registries and preallocation, while a DataVolume's children are to be made.
	API    client.Reader
	Events events.EventRecorder
	Options
}

// Setup registers the DataVolume, DataSource, DataImportCron, StorageProfile and upload PVC
// controllers and the keeper of the CDI and CDIConfig objects.
func Setup(mgr ctrl.Manager, o Options) error {
	config := &Config{Client: mgr.GetClient(), FilesystemOverhead: o.FilesystemOverhead, UploadProxyURL: o.UploadProxyURL,
		Interval: time.Minute}
	if err := mgr.Add(config); err != nil {
		return err
	}
	// An administrator's change to the CDIConfig (its spec.uploadProxyURLOverride) is in its status at once.
	if err := ctrl.NewControllerManagedBy(mgr).Named("cdiconfig").For(&cdiv1.CDIConfig{}).
		Complete(reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
			if req.Name != CDIConfigName {
				return reconcile.Result{}, nil
			}
			return reconcile.Result{}, config.syncConfig(ctx)
		})); err != nil {
		return err
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("storageprofile").For(&storagev1.StorageClass{}).Owns(&cdiv1.StorageProfile{}).
		Complete(&ProfileReconciler{Client: mgr.GetClient(), Strategies: o.Strategies}); err != nil {
		return err
	}
	if err := setupDataSources(mgr); err != nil {
		return err
	}
	if err := setupUploadPVCs(mgr); err != nil {
		return err
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("dataimportcron").For(&cdiv1.DataImportCron{}).
		Owns(&hypercloud.VirtualMachineImage{}).Owns(&cdiv1.DataSource{}).Complete(&CronReconciler{Client: mgr.GetClient(), API: mgr.GetAPIReader()}); err != nil {
		return err
	}
	// A DataVolume made from a DataSource waits for it.
	byRef := func(o client.Object) []string {
		dv := o.(*cdiv1.DataVolume)
		if ref := dv.Spec.SourceRef; ref != nil {
			return []string{cmp.Or(ptr.Deref(ref.Namespace, ""), dv.Namespace) + "/" + ref.Name}
		}
		return nil
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &cdiv1.DataVolume{}, indexSourceRef, byRef); err != nil {
		return err
	}
	r := &Reconciler{Client: mgr.GetClient(), API: mgr.GetAPIReader(), Events: mgr.GetEventRecorder("diskpipe-cdi"), Options: o}
	return ctrl.NewControllerManagedBy(mgr).Named("datavolume").
		For(&cdiv1.DataVolume{}).Owns(&diskvolume.DiskVolume{}).Owns(&hypercloud.VirtualMachineImage{}).
		Watches(&cdiv1.DataSource{}, enqueue(r, &cdiv1.DataVolumeList{}, indexSourceRef, "")).
		// The claim is of the DataVolume's name, whoever made it: its binding is the DataVolume's.
		Watches(&corev1.PersistentVolumeClaim{}, &handler.EnqueueRequestForObject{}).
		// An upload's claim controls its staging image and the populator's disk.
		Watches(&hypercloud.VirtualMachineImage{}, byClaim).Watches(&diskvolume.DiskVolume{}, byClaim).Complete(r)
}

// Reconcile makes the DataVolume's DiskVolume and writes the DataVolume's status from it.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	dv := &cdiv1.DataVolume{}
	if err := r.Get(ctx, req.NamespacedName, dv); err != nil || !dv.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, client.IgnoreNotFound(err) // its DiskVolume goes with it
	}
	base := dv.DeepCopy()
	o, err := r.observe(ctx, dv)
	if err != nil {
		return ctrl.Result{}, err
	}
	if o.refused == nil && o.prePopulated == "" {
		if err := r.labelClaim(ctx, dv); err != nil {
			return ctrl.Result{}, err
		}
	}
	st := statusFrom(dv, o)
	now := metav1.Now()
	for i := range st.Conditions { // CDI's DataVolumeCondition has its state inline, not a ConditionState
		c := &st.Conditions[i]
		if old := findCondition(dv.Status.Conditions, c.Type); old != nil && old.Status == c.Status && old.Reason == c.Reason && old.Message == c.Message {
			c.LastTransitionTime, c.LastHeartbeatTime = old.LastTransitionTime, old.LastHeartbeatTime
		} else {
			c.LastTransitionTime, c.LastHeartbeatTime = now, now
		}
	}
	dv.Status = st
	if err := status.Write(ctx, r.Client, base, dv, base.Status, dv.Status); err != nil {
		return ctrl.Result{}, err
	}
	if st.Phase != base.Status.Phase {
		if typ, reason, note := phaseEvent(dv, st.Phase); reason != "" {
			r.Events.Eventf(dv, nil, typ, reason, string(st.Phase), "%s", note)
		}
	}
	if o.refused != nil && o.refused.reason == owned.ReasonNameTerminating {
		return ctrl.Result{RequeueAfter: 5 * time.Second}, nil // whoever's the object was, it goes
	}
	return ctrl.Result{}, nil
}

// observe looks at what makes the DataVolume, making its children (the staging image, the
// DiskVolume, an upload's claim) if they are missing, and says what it saw.
func (r *Reconciler) observe(ctx context.Context, dv *cdiv1.DataVolume) (observed, error) {
	if _, ok := dv.Annotations[annPrePopulated]; ok {
		// Its presence is what counts, as CDI reads it: KubeVirt's restore writes "true", or
		// the DataVolume's name; the claim is the DataVolume's own, of its name.
		return r.prePopulated(ctx, dv)
	}
	if adopt, err := r.adopt(ctx, dv); err != nil {
		if ref := (*refusal)(nil); errors.As(err, &ref) {
			return observed{refused: ref}, nil
		}
		return observed{}, err
	} else if adopt {
		return r.prePopulated(ctx, dv)
	}
	spec, imported, err := r.diskSpec(ctx, dv)
	if ref := (*refusal)(nil); errors.As(err, &ref) {
		return observed{refused: ref}, nil
	} else if err != nil {
		return observed{}, err
	}
	if dv.Spec.SourceRef == nil && dv.Spec.Source.Upload != nil {
		return r.observeUpload(ctx, dv, spec)
	}
	disk := &diskvolume.DiskVolume{ObjectMeta: metav1.ObjectMeta{Name: dv.Name, Namespace: dv.Namespace,
		Labels: map[string]string{LabelDataVolume: string(dv.UID)}, Annotations: transferAnnotations(dv)}, Spec: spec}
	var img *hypercloud.VirtualMachineImage
	if imported != nil {
		if err := r.Get(ctx, client.ObjectKeyFromObject(disk), disk); client.IgnoreNotFound(err) != nil {
			return observed{}, err
		} else if err == nil && metav1.IsControlledBy(disk, dv) && disk.Status.Phase == common.PhaseReady {
			return r.done(ctx, dv, disk, true)
		}
		img = &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: SourceImage(dv.Name), Namespace: dv.Namespace,
			Labels: map[string]string{LabelDataVolume: string(dv.UID), goldenimage.LabelStaging: "true"}, Annotations: transferAnnotations(dv)},
			Spec: hypercloud.VirtualMachineImageSpec{Source: *imported, VolumeOptions: common.VolumeOptions{
				StorageClassName: spec.StorageClassName, VolumeMode: spec.VolumeMode}}}
		if ref, err := r.ensureChild(ctx, dv, img, "VirtualMachineImage"); ref != nil || err != nil {
			return observed{refused: ref}, err
		}
	}
	if ref, err := r.ensureChild(ctx, dv, disk, "DiskVolume"); ref != nil || err != nil {
		return observed{refused: ref}, err
	}
	if img != nil && img.Status.Phase != common.PhaseReady {
		// A source whose size only an import tells (a compressed raw image: KubeVirt's export
		// links are gzip) is staged at the disk's size, as CDI imports it into the DataVolume's
		// claim of that size.
		if c := meta.FindStatusCondition(img.Status.Conditions, common.ConditionReady); c != nil && c.Reason == goldenimage.ReasonSizeRequired &&
			img.Spec.Resources.Requests.Storage == nil && spec.Resources.Requests.Storage != nil {
			patch := client.MergeFrom(img.DeepCopy())
			img.Spec.Resources.Requests.Storage = ptr.To(spec.Resources.Requests.Storage.DeepCopy())
			if err := r.Patch(ctx, img, patch); err != nil {
				return observed{}, err
			}
		}
		return observed{img: img}, nil
	}
	if disk.Status.Phase == common.PhaseReady {
		return r.done(ctx, dv, disk, img != nil)
	}
	return observed{disk: disk}, nil
}

// done is the status of dv, whose disk is Ready. A claim not bound yet is on a class that binds
// at its first consumer (a DiskVolume is Ready before its claim is bound only then): the volume
// is provisioned where the VM's pod is scheduled, and dv is WaitForFirstConsumer, on which
// KubeVirt starts the VM. A staged source's image stays until then, since the clone is made
// from its PVC. Once the claim is bound, it is marked as CDI's (markDone) and the staging
// image, its work done, is deleted.
func (r *Reconciler) done(ctx context.Context, dv *cdiv1.DataVolume, made *diskvolume.DiskVolume, staged bool) (observed, error) {
	pvc := &corev1.PersistentVolumeClaim{}
	err := r.Get(ctx, client.ObjectKey{Namespace: dv.Namespace, Name: dv.Name}, pvc)
	if client.IgnoreNotFound(err) != nil {
		return observed{}, err
	}
	found := err == nil
	switch {
	case found && pvc.Status.Phase != corev1.ClaimBound && disk.Deferred(pvc) && pvc.Annotations[storage.AnnotationSelectedNode] != "":
		// A disk deferred to its VM's node is being made there (the claim's events say how).
		return observed{disk: made, populating: pvc.Annotations[storage.AnnotationSelectedNode]}, nil
	case found && pvc.Status.Phase != corev1.ClaimBound && disk.Deferred(pvc):
		// As CDI's populators wait: KubeVirt starts the VM's pod on PendingPopulation.
		return observed{waiting: cdiv1.PendingPopulation, waitingFor: "PVC " + dv.Name + " is filled on the VM's node"}, nil
	case found && pvc.Status.Phase != corev1.ClaimBound:
		return observed{waiting: cdiv1.WaitForFirstConsumer, waitingFor: "PVC " + dv.Name + " is bound"}, nil
	}
	if staged {
		if found {
			if err := r.markDone(ctx, pvc); err != nil {
				return observed{}, err
			}
		}
		return observed{disk: made}, r.deleteSourceImage(ctx, dv)
	}
	return observed{disk: made}, nil
}

// ensureChild makes obj, controlled by dv, unless it exists; a refusal says why dv cannot go
// on (its name is taken by another object, or one still being deleted; the API refused what
// dv asks).
func (r *Reconciler) ensureChild(ctx context.Context, dv *cdiv1.DataVolume, obj client.Object, kind string) (*refusal, error) {
	created, err := owned.Ensure(ctx, r.Client, dv, obj)
	if t := (*owned.ErrTerminating)(nil); errors.As(err, &t) {
		// A DataVolume made again (a VM's dataVolumeTemplates, a GitOps sync) before its earlier
		// self's children are gone: it waits, Pending; their deletion brings it back.
		return &refusal{reason: owned.ReasonNameTerminating, message: t.Error()}, nil
	} else if notOwned := (*owned.ErrNotOwned)(nil); errors.As(err, &notOwned) {
		return &refusal{reason: ReasonResourceExists, message: fmt.Sprintf("%s %s already exists and is not managed by DataVolume %s", kind, obj.GetName(), dv.Name)}, nil
	} else if apierrors.IsInvalid(err) {
		// The API refused what the DataVolume asks (a URL that is none, a bucket name that is
		// not one): the DataVolume fails, in the API's words.
		return &refusal{reason: ReasonInvalidSpec, running: ReasonError, message: fmt.Sprintf("the DataVolume's source cannot be served: %v", err)}, nil
	} else if err != nil {
		return nil, err
	}
	if created {
		r.Events.Eventf(dv, obj, corev1.EventTypeNormal, kind+"Created", "Create", "Made by %s %s", kind, obj.GetName())
	}
	return nil, nil
}

// AnnBindImmediate on a DataVolume asks that its claim be bound at once, on a class that binds at
// the first consumer too (CDI reads it present, whatever its value).
const AnnBindImmediate = "cdi.kubevirt.io/storage.bind.immediate.requested"

// transferAnnotations are what a DataVolume asks of the pods that make it, as CDI passes them to
// its own: spec.priorityClassName, and the secondary networks of k8s.v1.cni.cncf.io/networks
// (a dedicated import network), and whether it is bound at once, as the annotations of its image
// and disk that say so.
func transferAnnotations(dv *cdiv1.DataVolume) map[string]string {
	ann := map[string]string{}
	if _, ok := dv.Annotations[AnnBindImmediate]; ok {
		// CDI binds such a DataVolume's claim at once, with its own pod, whatever the class.
		ann[disk.AnnotationBindImmediately] = "true"
	}
	if dv.Spec.PriorityClassName != "" {
		ann[importpod.AnnTransferPriorityClass] = dv.Spec.PriorityClassName
	}
	if v := dv.Annotations[importpod.AnnMultusNetworks]; v != "" {
		ann[importpod.AnnTransferNetworks] = v
	}
	if dv.Spec.ServiceAccountName != "" {
		ann[importpod.AnnTransferServiceAccount] = dv.Spec.ServiceAccountName
	}
	return ann
}

// Labels and annotations CDI puts on a DataVolume's claim, which KubeVirt and tools read.
const (
	// AnnContentType is the claim's content: kubevirt, a disk image (diskpipe writes no other).
	AnnContentType = "cdi.kubevirt.io/storage.contentType"
	// AnnCreatedForDataVolume is the UID of the DataVolume the claim was made for.
	AnnCreatedForDataVolume = "cdi.kubevirt.io/createdForDataVolume"
	// LabelApp is CDI's label on what it makes.
	LabelApp = "app"
)

// claimMeta is what CDI puts on dv's claim: the DataVolume's labels and annotations (but the
// last-applied configuration of kubectl, which is the DataVolume's, and populatedFor, which
// says the claim is whole), its own app label, the content type and the DataVolume's UID.
func claimMeta(dv *cdiv1.DataVolume) (labels, annotations map[string]string) {
	labels = map[string]string{LabelApp: "containerized-data-importer", "app.kubernetes.io/component": "storage"}
	maps.Copy(labels, passable(dv.Labels))
	annotations = passable(dv.Annotations)
	delete(annotations, corev1.LastAppliedConfigAnnotation)
	delete(annotations, AnnPopulatedFor)
	annotations[AnnContentType] = string(cdiv1.DataVolumeKubeVirt)
	annotations[AnnCreatedForDataVolume] = string(dv.UID)
	return labels, annotations
}

// controlKeys are the prefixes of labels and annotations a DataVolume's do not pass to its
// claim: those diskpipe, CDI's controllers and Kubernetes' volume controllers read on a claim
// to decide what to do with it (diskpipe's prime and clone marks, CDI's pod phase, the
// scheduler's node, binding), which a tenant must not steer through a DataVolume.
var controlKeys = []string{"diskpipe.io/", "cdi.kubevirt.io/storage.", "pv.kubernetes.io/", "volume.kubernetes.io/", "volume.beta.kubernetes.io/"}

// passable is from without the keys of controlKeys, and of any *.diskpipe.io domain.
func passable(from map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range from {
		domain, _, _ := strings.Cut(k, "/")
		if !slices.ContainsFunc(controlKeys, func(p string) bool { return strings.HasPrefix(k, p) }) && !strings.HasSuffix(domain, ".diskpipe.io") {
			out[k] = v
		}
	}
	return out
}

// labelClaim puts claimMeta on dv's claim once its DiskVolume (or dv) has made it, and again
// when the DataVolume's labels change: backup, quota and chargeback tools select claims by the
// DataVolume's labels, and KubeVirt reads the content type (VirtualMachineExport serves
// kubevirt content, in-place restores take their prePopulated path).
func (r *Reconciler) labelClaim(ctx context.Context, dv *cdiv1.DataVolume) error {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: dv.Namespace, Name: dv.Name}, pvc); err != nil {
		return client.IgnoreNotFound(err)
	}
	owner := metav1.GetControllerOf(pvc)
	ours := owner != nil && (owner.UID == dv.UID || (owner.Kind == "DiskVolume" && owner.Name == dv.Name))
	if !ours || !pvc.DeletionTimestamp.IsZero() {
		return nil
	}
	labels, annotations := claimMeta(dv)
	patch := client.MergeFrom(pvc.DeepCopy())
	changed := false
	for k, v := range labels {
		if pvc.Labels[k] != v {
			metav1.SetMetaDataLabel(&pvc.ObjectMeta, k, v)
			changed = true
		}
	}
	for k, v := range annotations {
		if pvc.Annotations[k] != v {
			metav1.SetMetaDataAnnotation(&pvc.ObjectMeta, k, v)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return r.Patch(ctx, pvc, patch)
}

// markDone annotates pvc, a DataVolume's claim, as CDI's upload and import pods leave it once
// the disk is written: cdi.kubevirt.io/storage.pod.phase Succeeded.
func (r *Reconciler) markDone(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	if pvc.Annotations[cdiclaims.AnnPodPhase] == string(corev1.PodSucceeded) {
		return nil
	}
	patch := client.MergeFrom(pvc.DeepCopy())
	metav1.SetMetaDataAnnotation(&pvc.ObjectMeta, cdiclaims.AnnPodPhase, string(corev1.PodSucceeded))
	return r.Patch(ctx, pvc, patch)
}

// deleteSourceImage deletes the image that staged dv's source, if it is still there.
func (r *Reconciler) deleteSourceImage(ctx context.Context, dv *cdiv1.DataVolume) error {
	img := &hypercloud.VirtualMachineImage{}
	err := r.Get(ctx, client.ObjectKey{Namespace: dv.Namespace, Name: SourceImage(dv.Name)}, img)
	if err != nil || !metav1.IsControlledBy(img, dv) || !img.DeletionTimestamp.IsZero() {
		return client.IgnoreNotFound(err)
	}
	return client.IgnoreNotFound(r.Delete(ctx, img))
}

// indexSourceRef indexes DataVolumes by the DataSource they are made from ("ns/name").
const indexSourceRef = "cdi.diskpipe.io/sourceref"

// LabelDataVolume marks the DiskVolume that makes a DataVolume with the DataVolume's UID.
const LabelDataVolume = "cdi.diskpipe.io/datavolume"

// Annotations by which a DataVolume takes a claim of its name that exists already.
const (
	// AnnAllowClaimAdoption is KubeVirt's, on the DataVolumes of dataVolumeTemplates.
	AnnAllowClaimAdoption = "cdi.kubevirt.io/allowClaimAdoption"
	// AnnPopulatedFor is CDI's, on a claim it filled for the DataVolume it names.
	AnnPopulatedFor = "cdi.kubevirt.io/storage.populatedFor"
)

// adopt takes the claim of dv's name, when one exists that no DiskVolume makes, and dv allows
// adopting it (KubeVirt's allowClaimAdoption) or CDI filled it for a DataVolume of this name:
// a cluster moved from CDI keeps its disks when its DataVolumes are made again, by KubeVirt
// from its VMs' templates or by the user from their manifests. An adopted claim no other
// object controls becomes the DataVolume's, so that it goes with it, as under CDI.
func (r *Reconciler) adopt(ctx context.Context, dv *cdiv1.DataVolume) (bool, error) {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: dv.Namespace, Name: dv.Name}, pvc); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	owner, madeFor := metav1.GetControllerOf(pvc), disk.ClaimMadeFor(pvc)
	switch {
	case owner != nil && owner.Kind == "DiskVolume" && owner.Name == dv.Name:
		return false, nil // diskpipe makes it for this DataVolume (its DiskVolume waits for an earlier one's)
	case !pvc.DeletionTimestamp.IsZero() && (madeFor != "" || owner != nil && owner.UID == dv.UID && !cdiclaims.IsUploadPVC(pvc)):
		// The DataVolume's disk is going: it is no disk until it is made again.
		return false, &refusal{reason: owned.ReasonNameTerminating, message: fmt.Sprintf("PVC %s is being deleted: the DataVolume's disk is made "+
			"again once it is gone", pvc.Name)}
	case madeFor != "" && (owner == nil && len(pvc.OwnerReferences) > 0 || owner != nil && owner.UID == dv.UID):
		return r.diskClaim(ctx, dv, pvc, madeFor)
	case owner != nil && owner.UID == dv.UID:
		return !cdiclaims.IsUploadPVC(pvc), nil // an upload's claim is filled by its upload
	case !pvc.DeletionTimestamp.IsZero():
		// Never taken: an earlier DataVolume's of the name, most often, whose pod still uses it.
		return false, &refusal{reason: owned.ReasonNameTerminating, message: (&owned.ErrTerminating{Kind: "PersistentVolumeClaim", Name: pvc.Name}).Error()}
	case dv.Annotations[AnnAllowClaimAdoption] != "true" && pvc.Annotations[AnnPopulatedFor] != dv.Name:
		return false, &refusal{reason: ReasonResourceExists, message: fmt.Sprintf("PVC %s already exists and is not managed by DataVolume %s: to take it as the "+
			"DataVolume's disk, annotate the DataVolume %s: \"true\" (or %s: \"true\")", pvc.Name, dv.Name, AnnAllowClaimAdoption, annPrePopulated)}
	case owner != nil:
		return false, &refusal{reason: ReasonResourceExists, message: fmt.Sprintf("PVC %s already exists and is controlled by %s %s, not DataVolume %s",
			pvc.Name, owner.Kind, owner.Name, dv.Name)}
	}
	patch := client.MergeFrom(pvc.DeepCopy())
	if err := controllerutil.SetControllerReference(dv, pvc, r.Scheme()); err != nil {
		return false, err
	}
	if err := r.Patch(ctx, pvc, patch); err != nil {
		return false, err
	}
	r.Events.Eventf(dv, pvc, corev1.EventTypeNormal, "ClaimAdopted", "Adopt", "Took PVC %s, which exists already, as the DataVolume's disk", pvc.Name)
	return true, nil
}

// diskClaim settles pvc, of dv's name, which diskpipe made for the disk of UID madeFor, as
// adopt: false while that disk is dv's DiskVolume (it makes the claim), or a DiskVolume left
// by an earlier DataVolume (ensureChild refuses it); a refusal while the claim goes with an
// earlier DataVolume's disk (Kubernetes' garbage collector deletes it once its last owner is
// gone). A claim of dv that outlived the DiskVolume that made it (deleted on its own) is kept
// as dv's disk if it is whole, bound, with what a VM wrote on it; one never bound holds
// nothing and is deleted, and the DiskVolume is made again. Both are read uncached first: a
// DiskVolume just made may not be in the cache yet.
func (r *Reconciler) diskClaim(ctx context.Context, dv *cdiv1.DataVolume, pvc *corev1.PersistentVolumeClaim, madeFor types.UID) (bool, error) {
	current := &diskvolume.DiskVolume{}
	key := client.ObjectKey{Namespace: dv.Namespace, Name: dv.Name}
	if err := r.Get(ctx, key, current); err == nil && current.UID == madeFor {
		return false, nil // the common case, from the cache
	}
	err := r.API.Get(ctx, key, current)
	if client.IgnoreNotFound(err) != nil {
		return false, err
	}
	found := err == nil
	switch owner := metav1.GetControllerOf(pvc); {
	case found && current.UID == madeFor:
		return false, nil // its DiskVolume's, which makes it (or an orphaned DiskVolume's, which ensureChild refuses)
	case owner == nil:
		return false, &refusal{reason: owned.ReasonNameTerminating, message: fmt.Sprintf("PVC %s, made for an earlier DataVolume %s, "+
			"is being deleted with its DiskVolume: this DataVolume is made once it is gone", pvc.Name, dv.Name)}
	}
	fresh := &corev1.PersistentVolumeClaim{}
	if err := r.API.Get(ctx, client.ObjectKeyFromObject(pvc), fresh); err != nil {
		return false, client.IgnoreNotFound(err) // gone: the disk is made
	}
	switch {
	case metav1.IsControlledBy(fresh, dv) && fresh.DeletionTimestamp.IsZero() && disk.ClaimMadeFor(fresh) == "":
		return true, nil // kept already (the cache has not seen it yet)
	case fresh.UID != pvc.UID || disk.ClaimMadeFor(fresh) != madeFor || !metav1.IsControlledBy(fresh, dv) || !fresh.DeletionTimestamp.IsZero():
		// Changed meanwhile: the next pass, woken by the change, looks again; nothing is made
		// over it before.
		return false, &refusal{reason: owned.ReasonNameTerminating, message: fmt.Sprintf("PVC %s changed while the DataVolume looked at it: "+
			"it looks again", pvc.Name)}
	}
	if fresh.Status.Phase != corev1.ClaimBound {
		// With its version: a claim bound meanwhile (its volume handed over) is not deleted.
		if err := r.Delete(ctx, fresh, client.Preconditions{UID: &fresh.UID, ResourceVersion: &fresh.ResourceVersion}); client.IgnoreNotFound(err) != nil {
			return false, err
		}
		r.Events.Eventf(dv, fresh, corev1.EventTypeWarning, "ClaimRemade", "Delete", "PVC %s outlived the DiskVolume that was making it, "+
			"deleted on its own, and held nothing yet: it is deleted and the disk is made again", fresh.Name)
		return false, &refusal{reason: owned.ReasonNameTerminating, message: fmt.Sprintf("PVC %s, left unfinished by a DiskVolume deleted on "+
			"its own, is being deleted: the disk is made again once it is gone", fresh.Name)}
	}
	// The claim becomes the DataVolume's own, no disk's: the next pass adopts it as such.
	patch := client.MergeFromWithOptions(fresh.DeepCopy(), client.MergeFromWithOptimisticLock{})
	delete(fresh.Labels, disk.LabelDisk)
	if err := r.Patch(ctx, fresh, patch); err != nil {
		return false, err
	}
	r.Events.Eventf(dv, fresh, corev1.EventTypeNormal, "ClaimKept", "Adopt", "PVC %s outlived the DiskVolume that made it, deleted on "+
		"its own: the DataVolume keeps it, whole, as its disk", fresh.Name)
	if found && metav1.IsControlledBy(current, dv) {
		// The DiskVolume made again meanwhile waits for this claim (disk.notOwnedClaim).
		if err := r.Delete(ctx, current, client.Preconditions{UID: &current.UID}); client.IgnoreNotFound(err) != nil {
			return false, err
		}
	}
	return true, nil
}

// prePopulated looks at the claim of a DataVolume whose claim is already whole, and takes it
// as CDI's DataVolume takes it: a claim nothing controls (KubeVirt's VirtualMachineRestore and
// VirtualMachineClone make the restored claim with no owner) becomes the DataVolume's, so that
// it goes with the DataVolume and its VM, and says its content type (the DataVolume's,
// kubevirt when it names none), which KubeVirt's export of the VM reads. A claim another object
// controls is left as it is.
func (r *Reconciler) prePopulated(ctx context.Context, dv *cdiv1.DataVolume) (observed, error) {
	o := observed{prePopulated: dv.Name}
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: dv.Namespace, Name: o.prePopulated}, pvc); err != nil {
		return o, client.IgnoreNotFound(err)
	}
	o.claim = pvc
	content := string(cmp.Or(dv.Spec.ContentType, cdiv1.DataVolumeKubeVirt))
	owner := metav1.GetControllerOf(pvc)
	switch {
	case !pvc.DeletionTimestamp.IsZero(), owner != nil && owner.UID != dv.UID, cdiclaims.IsUploadPVC(pvc), cdiclaims.IsImportPVC(pvc):
		return o, nil // not the DataVolume's to take: another's, or one an upload or import fills
	case owner != nil && pvc.Annotations[AnnContentType] == content:
		return o, nil // taken
	}
	// With a lock: an owner written meanwhile is not overwritten.
	patch := client.MergeFromWithOptions(pvc.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if owner == nil {
		if err := controllerutil.SetControllerReference(dv, pvc, r.Scheme()); err != nil {
			return o, err
		}
	}
	metav1.SetMetaDataAnnotation(&pvc.ObjectMeta, AnnContentType, content)
	if err := r.Patch(ctx, pvc, patch); err != nil {
		return o, err
	}
	if owner == nil {
		r.Events.Eventf(dv, pvc, corev1.EventTypeNormal, "ClaimAdopted", "Adopt", "Took PVC %s, pre-populated, as the DataVolume's disk", pvc.Name)
	}
	return o, nil
}

// diskSpec is the DiskVolume that makes dv and the source of the image that stages its bytes
// (nil for a source that is not imported), or why there can be none.
func (r *Reconciler) diskSpec(ctx context.Context, dv *cdiv1.DataVolume) (spec diskvolume.DiskVolumeSpec, imported *hypercloud.VirtualMachineImageSource, err error) {
	src := dv.Spec.Source
	if ref := dv.Spec.SourceRef; ref != nil {
		if ref.Kind != cdiv1.DataVolumeDataSource {
			return spec, nil, invalid("spec.sourceRef.kind must be DataSource, not " + ref.Kind)
		}
		ds := &cdiv1.DataSource{}
		err := r.Get(ctx, client.ObjectKey{Namespace: cmp.Or(ptr.Deref(ref.Namespace, ""), dv.Namespace), Name: ref.Name}, ds)
		if apierrors.IsNotFound(err) {
			return spec, nil, &refusal{reason: ReasonNotFound, message: fmt.Sprintf("DataSource %s/%s does not exist", cmp.Or(ptr.Deref(ref.Namespace, ""), dv.Namespace), ref.Name)}
		} else if err != nil {
			return spec, nil, err
		}
		resolved, err := resolve(ctx, r.Client, ds)
		if err != nil {
			return spec, nil, err
		}
		if resolved.PVC == nil && resolved.Snapshot == nil {
			return spec, nil, &refusal{reason: ReasonNoSource, message: fmt.Sprintf("DataSource %s/%s names no PVC or VolumeSnapshot yet", ds.Namespace, ds.Name)}
		}
		// Admission checked that the DataVolume's user may clone from the DataSource's
		// namespace, and no other: its source must be there.
		if ns := sourceNamespace(resolved); ns != ds.Namespace {
			return spec, nil, &refusal{reason: ReasonSourceNotServed, message: fmt.Sprintf(
				"DataSource %s/%s resolves to a source in namespace %s: diskpipe clones from a DataSource's own namespace only", ds.Namespace, ds.Name, ns)}
		}
		src = &cdiv1.DataVolumeSource{PVC: resolved.PVC, Snapshot: resolved.Snapshot}
	}
	if src == nil {
		return spec, nil, invalid("spec.source or spec.sourceRef is required")
	}
	golden, err := r.goldenImage(ctx, src, dv.Namespace)
	if err != nil {
		return spec, nil, err
	}
	config, err := r.settings(ctx, dv)
	if err != nil {
		return spec, nil, err
	}
	if golden == nil {
		if imported, err = imageSource(src, dv.Namespace, config.InsecureRegistries); err != nil {
			return spec, nil, err
		}
	}
	switch {
	case golden != nil:
		spec.Source.Image = golden
	case imported != nil:
		spec.Source.Image = &diskvolume.ImageSource{Name: common.LocalName(SourceImage(dv.Name)), Kind: diskvolume.ImageKindVirtualMachineImage}
	case src.Blank != nil:
		spec.Source.Blank = &common.BlankSource{}
	case src.Snapshot != nil:
		spec.Source.Snap = &diskvolume.SnapshotSource{Name: common.LocalName(src.Snapshot.Name)}
	default:
		return spec, nil, notServed(sourceKind(src))
	}
	var requested *corev1.VolumeResourceRequirements
	switch {
	case dv.Spec.PVC != nil && dv.Spec.Storage != nil:
		return spec, nil, invalid("spec.pvc and spec.storage are exclusive")
	case dv.Spec.PVC != nil:
		p := dv.Spec.PVC
		spec.AccessModes, spec.StorageClassName, spec.VolumeMode, requested = p.AccessModes, p.StorageClassName, p.VolumeMode, &p.Resources
	case dv.Spec.Storage != nil:
		s := dv.Spec.Storage
		spec.AccessModes, spec.StorageClassName, spec.VolumeMode, requested = s.AccessModes, s.StorageClassName, s.VolumeMode, &s.Resources
	default:
		return spec, nil, invalid("spec.pvc or spec.storage is required")
	}
	if spec.StorageClassName == nil {
		// KubeVirt's default class for VM disks comes first, as CDI takes it.
		if spec.StorageClassName, err = virtDefaultClass(ctx, r.Client); err != nil {
			return spec, nil, err
		}
	}
	class, err := storage.ClassName(ctx, r.Client, spec.StorageClassName)
	if err != nil {
		return spec, nil, err
	}
	if dv.Spec.Storage != nil {
		// spec.storage is completed from the class's StorageProfile, as CDI does: once the
		// profile of a class that exists says what the class offers (a disk's modes cannot
		// change after), which a class made a moment ago may not yet.
		sc, err := storage.Class(ctx, r.Client, class)
		if err != nil {
			return spec, nil, err
		}
		p := &cdiv1.StorageProfile{}
		if err := r.Get(ctx, client.ObjectKey{Name: class}, p); client.IgnoreNotFound(err) != nil {
			return spec, nil, err
		} else if sc != nil && (err != nil || p.Status.StorageClass == nil) {
			return spec, nil, fmt.Errorf("waiting for the StorageProfile of class %s", class)
		} else if err == nil {
			if set := claimPropertySet(p.Status.ClaimPropertySets, spec.VolumeMode); set != nil && len(spec.AccessModes) == 0 {
				spec.AccessModes = set.AccessModes
				if spec.VolumeMode == nil {
					spec.VolumeMode = set.VolumeMode
				}
			}
			if sc != nil {
				spec.CloneStrategy = diskStrategy(p, sc)
			}
			if min, err := resource.ParseQuantity(p.Annotations[AnnMinimumSize]); err == nil {
				if size, ok := requested.Requests[corev1.ResourceStorage]; ok && size.Cmp(min) < 0 {
					// The storage makes no smaller volume: the disk asks for what it makes.
					requested = requested.DeepCopy()
					requested.Requests[corev1.ResourceStorage] = min
				}
			}
		}
	}
	if size, ok := requested.Requests[corev1.ResourceStorage]; ok {
		if dv.Spec.Storage != nil && (spec.VolumeMode == nil || *spec.VolumeMode == corev1.PersistentVolumeFilesystem) {
			// spec.storage asks for the disk's size; the claim keeps the filesystem's share besides.
			size.Set(transfer.VolumeSizeFor(size.Value(), r.FilesystemOverhead.For(class)))
		}
		spec.Resources.Requests.Storage = &size
	} else if src.Blank != nil || src.Upload != nil {
		return spec, nil, invalid("a DataVolume of source " + sourceKind(src) + " needs a size: spec.storage.resources.requests.storage")
	}
	if src.Upload != nil && len(dv.Name) > cdiclaims.MaxUploadPVCName {
		return spec, nil, invalid(fmt.Sprintf("a DataVolume of source upload has a name of at most %d characters (its staging image is named %s<name>)",
			cdiclaims.MaxUploadPVCName, cdiclaims.UploadPVCImagePrefix))
	}
	// CDI's default for a DataVolume that does not say: the CDIConfig's.
	spec.Preallocation = cmp.Or(dv.Spec.Preallocation, config.Preallocation)
	return spec, imported, nil
}

// settings is the CDIConfig's spec for dv's children: read from the apiserver until they are
// made (its DiskVolume exists, or it succeeded), from the cache after, when nothing is made
// from it again.
func (r *Reconciler) settings(ctx context.Context, dv *cdiv1.DataVolume) (cdiv1.CDIConfigSpec, error) {
	made := dv.Status.Phase == cdiv1.Succeeded
	if !made {
		err := r.Get(ctx, client.ObjectKeyFromObject(dv), &diskvolume.DiskVolume{})
		if client.IgnoreNotFound(err) != nil {
			return cdiv1.CDIConfigSpec{}, err
		}
		made = err == nil
	}
	return settings(ctx, r.Client, r.API, made)
}

func sourceNamespace(src cdiv1.DataSourceSource) string {
	if src.PVC != nil {
		return src.PVC.Namespace
	}
	return src.Snapshot.Namespace
}

// goldenImage is the image whose golden PVC a pvc source names (a DataImportCron's DataSource
// names one), which the disk is then cloned from directly; nil for any other source.
func (r *Reconciler) goldenImage(ctx context.Context, src *cdiv1.DataVolumeSource, ns string) (*diskvolume.ImageSource, error) {
	var obj client.Object
	var key client.ObjectKey
	switch {
	case src.PVC != nil:
		obj, key = &corev1.PersistentVolumeClaim{}, client.ObjectKey{Namespace: cmp.Or(src.PVC.Namespace, ns), Name: src.PVC.Name}
	case src.Snapshot != nil:
		// A golden snapshot: a DataImportCron's source in the snapshot format.
		obj, key = &snapshotv1.VolumeSnapshot{}, client.ObjectKey{Namespace: cmp.Or(src.Snapshot.Namespace, ns), Name: src.Snapshot.Name}
	default:
		return nil, nil
	}
	if err := r.Get(ctx, key, obj); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	owner := metav1.GetControllerOf(obj)
	if obj.GetLabels()[goldenimage.LabelGolden] != "true" || owner == nil ||
		(owner.Kind != string(diskvolume.ImageKindVirtualMachineImage) && owner.Kind != string(diskvolume.ImageKindImageTemplate)) {
		return nil, nil
	}
	img := &diskvolume.ImageSource{Name: common.LocalName(owner.Name), Kind: diskvolume.ImageKind(owner.Kind)}
	if key.Namespace != ns {
		img.Namespace = key.Namespace
	}
	return img, nil
}

// sourceKind names a DataVolume source for a message.
func sourceKind(src *cdiv1.DataVolumeSource) string {
	switch {
	case src.HTTP != nil:
		return "http"
	case src.S3 != nil:
		return "s3"
	case src.Registry != nil:
		return "registry"
	case src.PVC != nil:
		return "pvc"
	case src.Upload != nil:
		return "upload"
	case src.Blank != nil:
		return "blank"
	case src.Snapshot != nil:
		return "snapshot"
	case src.GCS != nil:
		return "gcs (an https URL of the object as an http source, or its S3-compatible endpoint as an s3 source, serves it)"
	case src.Imageio != nil:
		return "imageio (export the disk from oVirt and import it by http)"
	case src.VDDK != nil:
		return "vddk (export the disk from vSphere and import it by http)"
	default:
		return "this source"
	}
}
