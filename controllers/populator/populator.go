// Package populator fills plain PersistentVolumeClaims whose dataSourceRef names a
// VirtualMachineImage or an ImageTemplate: Kubernetes' volume populators. It fills the PVC of
// a disk deferred to its VM's node (disk.deferToConsumer) too, whose dataSourceRef names the
// DiskVolume or VirtualMachinePvc that made it: as that disk says (of an image, or blank),
// where its VM runs. The apiserver leaves such a claim Pending (the CSI provisioner handles
// only the kinds it knows), and the populator fills it the way lib-volume-populator's do:
//
//  1. it makes a DiskVolume of the image beside the claim, with the claim's class, mode, access
//     modes and size: its PVC (the "prime" one) is made as every disk is (CSI clone, snapshot
//     or host-assisted copy, grown to fill the volume), and boots like one;
//  2. once the disk is Ready, it points the prime PVC's PersistentVolume at the claim
//     (spec.claimRef), and Kubernetes' PV controller binds the claim to it;
//  3. once the claim is bound, it deletes the DiskVolume, whose PVC goes with it; the volume
//     stays with the claim.
//
// Progress, waits and failures are the claim's events. A claim deleted meanwhile takes the
// DiskVolume with it (it is the DiskVolume's owner).
package populator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/disk"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
)

// Event reasons on the claim.
const (
	ReasonPopulating     = "Populating"
	ReasonPopulated      = "Populated"
	ReasonPopulateFailed = "PopulateFailed"
	reasonUnsupported    = "PopulateUnsupported"
)

// LabelFor marks the DiskVolume that fills a claim with the claim's UID.
const LabelFor = "populator.diskpipe.io/for"

// Reconciler fills claims whose data source is an image.
type Reconciler struct {
	client.Client
	Events events.EventRecorder

	progress sync.Map // claim namespace/name → the last progress told in an event
}

// Setup registers the populator.
func Setup(mgr ctrl.Manager) error {
	r := &Reconciler{Client: mgr.GetClient(), Events: mgr.GetEventRecorder("diskpipe-populator")}
	ours := predicate.NewPredicateFuncs(func(o client.Object) bool {
		pvc, ok := o.(*corev1.PersistentVolumeClaim)
		return ok && sourceRef(pvc) != nil
	})
	return ctrl.NewControllerManagedBy(mgr).Named("populator").
		For(&corev1.PersistentVolumeClaim{}, builder.WithPredicates(ours)).
		Owns(&diskvolume.DiskVolume{}).Complete(r)
}

// sourceRef is the claim's data source when it is one of diskpipe's images, or the disk that
// made the claim.
func sourceRef(pvc *corev1.PersistentVolumeClaim) *corev1.TypedObjectReference {
	ref := pvc.Spec.DataSourceRef
	if ref == nil || ref.APIGroup == nil {
		return nil
	}
	switch {
	case *ref.APIGroup == hypercloud.GroupVersion.Group && ref.Kind == "VirtualMachineImage",
		*ref.APIGroup == virtualmachine.GroupVersion.Group && ref.Kind == "ImageTemplate",
		disk.Deferred(pvc):
		return ref
	}
	return nil
}

// isDisk says whether ref names a disk rather than an image.
func isDisk(ref *corev1.TypedObjectReference) bool {
	return ref.Kind == "DiskVolume" || ref.Kind == "VirtualMachinePvc"
}

// DiskName names the DiskVolume, and so the prime PVC, that fills the claim.
func DiskName(pvc *corev1.PersistentVolumeClaim) string { return disk.PopulateName(pvc.UID) }

// WaitingForConsumer says whether claim pvc waits for its first consumer, a pod, before it is
// filled: its StorageClass (named) binds on first consumer, and the scheduler has not chosen
// the claim's node yet.
func WaitingForConsumer(ctx context.Context, c client.Reader, pvc *corev1.PersistentVolumeClaim) (class string, waiting bool, err error) {
	if pvc.Annotations[storage.AnnotationSelectedNode] != "" {
		return "", false, nil
	}
	sc, err := storage.Class(ctx, c, ptr.Deref(pvc.Spec.StorageClassName, ""))
	if err != nil || !storage.WaitsForConsumer(sc) {
		return "", false, err
	}
	return sc.Name, true, nil
}

// Reconcile brings one claim forward.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.Get(ctx, req.NamespacedName, pvc); err != nil {
		if apierrors.IsNotFound(err) {
			r.progress.Delete(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	ref := sourceRef(pvc)
	if ref == nil || !pvc.DeletionTimestamp.IsZero() {
		r.progress.Delete(req.NamespacedName)
		return ctrl.Result{}, nil // the claim's owner reference takes its DiskVolume
	}
	if pvc.Spec.VolumeName != "" {
		r.progress.Delete(req.NamespacedName)
		return ctrl.Result{}, r.cleanup(ctx, pvc)
	}
	if ref.Namespace != nil && *ref.Namespace != pvc.Namespace {
		r.tell(pvc, corev1.EventTypeWarning, reasonUnsupported, fmt.Sprintf(
			"the image is in namespace %s: a claim is filled from an image of its own namespace (use a DiskVolume to copy across namespaces)", *ref.Namespace))
		return ctrl.Result{}, nil
	}

	// A class that binds on first consumer provisions where the claim's first pod is
	// scheduled: the DiskVolume's PVC is made there too, once the scheduler has chosen.
	if class, waiting, err := WaitingForConsumer(ctx, r.Client, pvc); err != nil {
		return ctrl.Result{}, err
	} else if waiting {
		r.tell(pvc, corev1.EventTypeNormal, ReasonPopulating, fmt.Sprintf(
			"waiting for a pod that uses the claim: StorageClass %s provisions on the node of the first consumer", class))
		return ctrl.Result{}, nil // the scheduler's annotation brings the claim back
	}
	node := pvc.Annotations[storage.AnnotationSelectedNode]

	d := &diskvolume.DiskVolume{ObjectMeta: metav1.ObjectMeta{Name: DiskName(pvc), Namespace: pvc.Namespace,
		Labels: map[string]string{LabelFor: string(pvc.UID)}}}
	if node != "" {
		d.Annotations = map[string]string{storage.AnnotationSelectedNode: node}
	}
	if isDisk(ref) {
		spec, transfer, why, err := r.deferredSpec(ctx, pvc, ref)
		if err != nil {
			return ctrl.Result{}, err
		} else if why != "" {
			r.tell(pvc, corev1.EventTypeWarning, reasonUnsupported, why)
			return ctrl.Result{}, nil
		}
		d.Spec = *spec
		for k, v := range transfer { // its transfer pods as the disk's would be
			metav1.SetMetaDataAnnotation(&d.ObjectMeta, k, v)
		}
	} else {
		d.Spec.Source.Image = &diskvolume.ImageSource{Name: common.LocalName(ref.Name), Kind: diskvolume.ImageKind(ref.Kind)}
	}
	d.Spec.AccessModes = pvc.Spec.AccessModes
	d.Spec.StorageClassName, d.Spec.VolumeMode = pvc.Spec.StorageClassName, pvc.Spec.VolumeMode
	if q, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
		d.Spec.Resources.Requests.Storage = &q
	}
	created, err := owned.Ensure(ctx, r.Client, pvc, d)
	if err != nil {
		return ctrl.Result{}, err
	}
	if created {
		r.event(pvc, corev1.EventTypeNormal, ReasonPopulating, "filling the claim from %s %s through DiskVolume %s", ref.Kind, ref.Name, d.Name)
	}
	if d.Status.Phase == common.PhaseReady {
		return r.rebind(ctx, pvc, d)
	}
	if img, err := r.image(ctx, pvc.Namespace, ref); err != nil {
		return ctrl.Result{}, err
	} else if img != nil && img.Phase == common.PhaseFailed {
		c := meta.FindStatusCondition(img.Conditions, common.ConditionReady)
		r.tell(pvc, corev1.EventTypeWarning, ReasonPopulateFailed, fmt.Sprintf("%s %s failed: %s: %s: fix or recreate it, and the claim is filled",
			ref.Kind, ref.Name, ptr.Deref(c, metav1.Condition{}).Reason, ptr.Deref(c, metav1.Condition{}).Message))
		return ctrl.Result{}, nil // its change brings the claim back (the DiskVolume watches it)
	}
	if d.Status.Phase == common.PhaseFailed {
		r.tell(pvc, corev1.EventTypeWarning, ReasonPopulateFailed, fmt.Sprintf("DiskVolume %s failed: %s", d.Name, readyOf(d.Status.Conditions)))
		return ctrl.Result{}, nil
	}
	r.tell(pvc, corev1.EventTypeNormal, ReasonPopulating, strings.Join(slices.DeleteFunc(
		[]string{"DiskVolume", d.Name, phaseOr(d.Status.Phase), d.Status.Progress, readyOf(d.Status.Conditions)}, func(s string) bool { return s == "" }), " "))
	return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
}

// deferredSpec is the spec of the DiskVolume that fills pvc, the claim of a disk deferred to
// its VM's node: the disk's own, of an image source. Only the disk that made the claim (its
// controller) is copied: a claim that names a disk it was not made by says why it is not
// filled.
func (r *Reconciler) deferredSpec(ctx context.Context, pvc *corev1.PersistentVolumeClaim, ref *corev1.TypedObjectReference) (spec *diskvolume.DiskVolumeSpec, transfer map[string]string, why string, err error) {
	key := types.NamespacedName{Namespace: pvc.Namespace, Name: ref.Name}
	var obj client.Object
	switch ref.Kind {
	case "DiskVolume":
		v := &diskvolume.DiskVolume{}
		if err := r.Get(ctx, key, v); err != nil {
			return nil, nil, fmt.Sprintf("%s %s does not exist: %v", ref.Kind, ref.Name, err), client.IgnoreNotFound(err)
		}
		obj, spec = v, v.Spec.DeepCopy()
	default:
		v := &hypercloud.VirtualMachinePvc{}
		if err := r.Get(ctx, key, v); err != nil {
			return nil, nil, fmt.Sprintf("%s %s does not exist: %v", ref.Kind, ref.Name, err), client.IgnoreNotFound(err)
		}
		obj = v
		spec = &diskvolume.DiskVolumeSpec{PVCTemplate: *v.Spec.PVC.DeepCopy(), CloneStrategy: v.Spec.CloneStrategy, Retry: v.Spec.Retry,
			Source: diskvolume.DiskVolumeSource{Image: &diskvolume.ImageSource{Name: common.LocalName(v.Spec.VirtualMachineImageName), Kind: diskvolume.ImageKindVirtualMachineImage}}}
	}
	if !owned.MineUnder("PersistentVolumeClaim", pvc, obj) { // an owner reference is anyone's to write; the mark is diskpipe's
		return nil, nil, fmt.Sprintf("the claim's dataSourceRef names %s %s, which did not make it: a claim is filled from a disk only by the disk that made it "+
			"(name an image instead)", ref.Kind, ref.Name), nil
	}
	if spec.Source.Image == nil && spec.Source.Blank == nil {
		return nil, nil, fmt.Sprintf("%s %s is neither of an image nor blank: only those wait for their VM's node", ref.Kind, ref.Name), nil
	}
	spec.Resources.Requests.Storage = nil // the claim's, below
	// The revision of a scheduled image the disk was planned from (and sized for), if it is
	// still one of that image's revisions: a newer one imported meanwhile may not fit.
	if rev := pvc.Annotations[disk.AnnotationDeferredRevision]; rev != "" && spec.Source.Image != nil {
		if ok, err := r.revisionOf(ctx, spec.Source.Image, obj.GetNamespace(), rev); err != nil {
			return nil, nil, "", err
		} else if ok {
			spec.Source.Image.Name = common.LocalName(rev)
		}
	}
	transfer = map[string]string{}
	for _, k := range []string{importpod.AnnTransferPriorityClass, importpod.AnnTransferNetworks} {
		if v := obj.GetAnnotations()[k]; v != "" {
			transfer[k] = v
		}
	}
	return spec, transfer, "", nil
}

// revisionOf says whether rev is a revision of img (the image of a disk in namespace ns): an
// image of its kind and namespace that the scheduled image controls.
func (r *Reconciler) revisionOf(ctx context.Context, img *diskvolume.ImageSource, ns, rev string) (bool, error) {
	imgNS := img.Namespace
	if imgNS == "" {
		imgNS = ns
	}
	parent, _ := goldenimage.NewObject(img.Kind)
	child, _ := goldenimage.NewObject(img.Kind)
	for _, o := range []struct {
		obj  client.Object
		name string
	}{{parent, string(img.Name)}, {child, rev}} {
		if err := r.Get(ctx, types.NamespacedName{Namespace: imgNS, Name: o.name}, o.obj); err != nil {
			return false, client.IgnoreNotFound(err)
		}
	}
	return metav1.IsControlledBy(child, parent), nil
}

// image is the status of the image the claim names, nil when it does not exist or the claim
// names a disk (whose image's failures are the disk's).
func (r *Reconciler) image(ctx context.Context, ns string, ref *corev1.TypedObjectReference) (*common.ImageStatus, error) {
	if isDisk(ref) {
		return nil, nil
	}
	key := types.NamespacedName{Namespace: ns, Name: ref.Name}
	var (
		obj client.Object
		st  *common.ImageStatus
	)
	if ref.Kind == "VirtualMachineImage" {
		v := &hypercloud.VirtualMachineImage{}
		obj, st = v, &v.Status
	} else {
		t := &virtualmachine.ImageTemplate{}
		obj, st = t, &t.Status
	}
	if err := r.Get(ctx, key, obj); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return st, nil
}

// tell makes an event of the claim's state each time it changes. (Events of one reason are
// counted as a series of the first, so a note that only changes its numbers is not told.)
func (r *Reconciler) tell(pvc *corev1.PersistentVolumeClaim, typ, reason, note string) {
	if last, _ := r.progress.Swap(client.ObjectKeyFromObject(pvc), reason+note); last == reason+note {
		return
	}
	r.event(pvc, typ, reason, "%s", note)
}

func readyOf(conds []metav1.Condition) string {
	if c := meta.FindStatusCondition(conds, common.ConditionReady); c != nil {
		return c.Reason + ": " + c.Message
	}
	return ""
}

// rebind points the prime PVC's volume at the claim; the PV controller binds the claim.
func (r *Reconciler) rebind(ctx context.Context, pvc *corev1.PersistentVolumeClaim, d *diskvolume.DiskVolume) (ctrl.Result, error) {
	prime := &corev1.PersistentVolumeClaim{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: pvc.Namespace, Name: d.Status.PVCName}, prime); err != nil {
		return ctrl.Result{}, err
	}
	if prime.Spec.VolumeName == "" {
		r.tell(pvc, corev1.EventTypeNormal, ReasonPopulating, fmt.Sprintf("waiting for PVC %s to be bound to a volume", prime.Name))
		return ctrl.Result{RequeueAfter: 2 * time.Second}, nil
	}
	if gave, err := storage.GiveVolume(ctx, r.Client, prime, pvc); errors.As(err, new(*storage.ErrNotBound)) {
		// Not the prime's volume (yet, or ever): said, and looked at again.
		r.tell(pvc, corev1.EventTypeWarning, ReasonPopulateFailed, err.Error())
		return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
	} else if err != nil {
		return ctrl.Result{}, err
	} else if gave {
		size := "size unknown"
		if d.Status.VirtualSize != nil {
			size = "a disk of " + d.Status.VirtualSize.String()
		}
		from := "a blank disk"
		if img := d.Spec.Source.Image; img != nil {
			from = fmt.Sprintf("%s %s", img.Kind, img.Name)
		}
		r.event(pvc, corev1.EventTypeNormal, ReasonPopulated, "filled from %s (%s): volume %s is the claim's", from, size, prime.Spec.VolumeName)
	}
	return ctrl.Result{RequeueAfter: 2 * time.Second}, nil // until the PV controller binds the claim
}

// cleanup deletes the DiskVolume of a claim that is bound: its PVC goes with it, the volume
// stays with the claim.
func (r *Reconciler) cleanup(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	d := &diskvolume.DiskVolume{}
	err := r.Get(ctx, types.NamespacedName{Namespace: pvc.Namespace, Name: DiskName(pvc)}, d)
	if apierrors.IsNotFound(err) || (err == nil && !d.DeletionTimestamp.IsZero()) {
		return nil
	}
	if err != nil {
		return err
	}
	return client.IgnoreNotFound(r.Delete(ctx, d, client.PropagationPolicy(metav1.DeletePropagationBackground)))
}

func (r *Reconciler) event(pvc *corev1.PersistentVolumeClaim, typ, reason, format string, args ...any) {
	r.Events.Eventf(pvc, nil, typ, reason, "Populate", format, args...)
}

func phaseOr(p common.Phase) string {
	if p == "" {
		return "Pending"
	}
	return string(p)
}
