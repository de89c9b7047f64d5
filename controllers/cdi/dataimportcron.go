package cdi

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
)

// A DataImportCron is served by a scheduled VirtualMachineImage, dic-<name>-<hash>, that it
// controls: its template's source is checked on its schedule, each new revision is imported
// into an image of its own, importsToKeep of them are kept (all of them, up to a hundred, with
// garbageCollect Never), and the managed DataSource names the golden PVC of the newest Ready
// one. A DataVolume made from that DataSource is cloned from the revision's image itself.
//
// An image's source cannot change, so the hash names the template's source, storage class and
// volume mode: a template changed to a new source (another mirror, another registry) gets an
// image of its own, and the one it replaces, with its revisions, is deleted once the new one
// has a Ready revision; until then the DataSource keeps naming the old one's.

// LabelDataImportCron marks the DataSource a DataImportCron keeps, as CDI does.
const LabelDataImportCron = "cdi.kubevirt.io/dataImportCron"

// Reasons of a DataImportCron's conditions.
const (
	ReasonUpToDate       = "UpToDate"
	ReasonImportProgress = "ImportProgressing"
	ReasonNoImport       = "NoImport"
	ReasonInvalidCron    = "InvalidSpec"
	// ReasonSnapshotNotReady: the newest revision's snapshot, the source in the snapshot
	// format, is not ready to use yet.
	ReasonSnapshotNotReady = "SnapshotNotReady"
)

// CronReconciler serves DataImportCrons.
type CronReconciler struct {
	client.Client
	// API reads the CDIConfig's insecure registries uncached until a cron's image is made.
	API client.Reader
}

// CronImageName names the scheduled image that serves cron's template as it is now.
func CronImageName(cron *cdiv1.DataImportCron) (string, error) {
	what := struct {
		Source *cdiv1.DataVolumeSource
		Class  *string
		Mode   *corev1.PersistentVolumeMode
	}{Source: cron.Spec.Template.Spec.Source}
	what.Class, what.Mode = templateStorage(cron)
	b, err := json.Marshal(what)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return fmt.Sprintf("dic-%s-%x", cron.Name, sum[:4]), nil
}

// templateStorage is the storage class and volume mode cron's template asks for.
func templateStorage(cron *cdiv1.DataImportCron) (*string, *corev1.PersistentVolumeMode) {
	t := cron.Spec.Template.Spec
	switch {
	case t.Storage != nil:
		return t.Storage.StorageClassName, t.Storage.VolumeMode
	case t.PVC != nil:
		return t.PVC.StorageClassName, t.PVC.VolumeMode
	}
	return nil, nil
}

// finalizerRetention holds a DataImportCron until what it made is let go of, as its
// retentionPolicy says.
const finalizerRetention = "cdi.diskpipe.io/retention"

// Reconcile keeps the DataImportCron's image, its DataSource and its status.
func (r *CronReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	cron := &cdiv1.DataImportCron{}
	if err := r.Get(ctx, req.NamespacedName, cron); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !cron.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.retain(ctx, cron)
	}
	if !controllerutil.ContainsFinalizer(cron, finalizerRetention) {
		patch := client.MergeFrom(cron.DeepCopy())
		controllerutil.AddFinalizer(cron, finalizerRetention)
		if err := r.Patch(ctx, cron, patch); err != nil {
			return ctrl.Result{}, err
		}
	}
	base := cron.DeepCopy()
	st, err := r.status(ctx, cron)
	if err != nil {
		return ctrl.Result{}, err
	}
	stamp(metav1.Now(), st.Conditions, base.Status.Conditions, func(c *cdiv1.DataImportCronCondition) (string, *cdiv1.ConditionState) {
		return string(c.Type), &c.ConditionState
	})
	cron.Status = st
	var res ctrl.Result
	for _, c := range st.Conditions {
		if c.Reason == ReasonSnapshotNotReady {
			res.RequeueAfter = 5 * time.Second // nothing wakes it when a snapshot is ready
		}
	}
	if equality.Semantic.DeepEqual(base.Status, cron.Status) {
		return res, nil
	}
	return res, r.Patch(ctx, cron, client.MergeFrom(base)) // CDI's DataImportCron CRD has no status subresource
}

// status is the DataImportCron's status now, after keeping its image and DataSource.
func (r *CronReconciler) status(ctx context.Context, cron *cdiv1.DataImportCron) (cdiv1.DataImportCronStatus, error) {
	st := cdiv1.DataImportCronStatus{LastImportedPVC: cron.Status.LastImportedPVC, LastImportTimestamp: cron.Status.LastImportTimestamp}
	failed := func(reason, msg string) cdiv1.DataImportCronStatus {
		st.Conditions = []cdiv1.DataImportCronCondition{
			{Type: cdiv1.DataImportCronProgressing, ConditionState: cdiv1.ConditionState{Status: corev1.ConditionFalse, Reason: reason, Message: msg}},
			{Type: cdiv1.DataImportCronUpToDate, ConditionState: cdiv1.ConditionState{Status: corev1.ConditionFalse, Reason: reason, Message: msg}},
		}
		return st
	}
	name, err := CronImageName(cron)
	if err != nil {
		return st, err
	}
	// The image is made once: the CDIConfig is read uncached until it is.
	made := r.Get(ctx, client.ObjectKey{Namespace: cron.Namespace, Name: name}, &hypercloud.VirtualMachineImage{})
	if client.IgnoreNotFound(made) != nil {
		return st, made
	}
	config, err := settings(ctx, r.Client, r.API, made == nil)
	if err != nil {
		return st, err
	}
	img, err := r.cronImage(cron, config.InsecureRegistries)
	if ref := (*refusal)(nil); errors.As(err, &ref) {
		return failed(ref.reason, ref.message), nil
	} else if err != nil {
		return st, err
	}
	if err := r.ensureImage(ctx, cron, img); errors.As(err, new(*owned.ErrNotOwned)) {
		return failed(ReasonResourceExists, fmt.Sprintf("VirtualMachineImage %s already exists and is not managed by DataImportCron %s", img.Name, cron.Name)), nil
	} else if apierrors.IsInvalid(err) {
		return failed(ReasonInvalidCron, fmt.Sprintf("the DataImportCron cannot be served: %v", err)), nil
	} else if err != nil {
		return st, err
	}

	sched := ptr.Deref(img.Status.Schedule, common.ScheduleStatus{})
	st.LastExecutionTimestamp = sched.LastCheckTime
	for _, rev := range sched.Revisions {
		if rev.Phase != common.PhaseReady && rev.Phase != common.PhaseFailed {
			st.CurrentImports = append(st.CurrentImports, cdiv1.ImportStatus{DataVolumeName: rev.Image, Digest: rev.Revision})
		}
	}
	progressing := cdiv1.DataImportCronCondition{Type: cdiv1.DataImportCronProgressing,
		ConditionState: cdiv1.ConditionState{Status: corev1.ConditionFalse, Reason: ReasonNoImport, Message: "no import is running"}}
	if len(st.CurrentImports) > 0 {
		progressing.Status, progressing.Reason = corev1.ConditionTrue, ReasonImportProgress
		progressing.Message = fmt.Sprintf("importing revision %s into VirtualMachineImage %s", st.CurrentImports[0].Digest, st.CurrentImports[0].DataVolumeName)
	}
	upToDate := cdiv1.DataImportCronCondition{Type: cdiv1.DataImportCronUpToDate,
		ConditionState: cdiv1.ConditionState{Status: corev1.ConditionFalse, Reason: ReasonNoImport, Message: "no revision is imported yet"}}

	golden, err := goldenimage.Lookup(ctx, r.Client, goldenimage.KindVirtualMachineImage, cron.Namespace, img.Name)
	if nr := (*goldenimage.NotReadyError)(nil); errors.As(err, &nr) {
		upToDate.Message = nr.Message
		st.Conditions = []cdiv1.DataImportCronCondition{progressing, upToDate}
		return st, nil
	} else if err != nil {
		return st, err
	}
	st.LastImportedPVC = &cdiv1.DataVolumeSourcePVC{Namespace: cron.Namespace, Name: golden.PVC.Name}
	st.LastImportTimestamp = golden.Status.CompletionTime
	if len(st.CurrentImports) == 0 {
		upToDate.Status, upToDate.Reason = corev1.ConditionTrue, ReasonUpToDate
		upToDate.Message = fmt.Sprintf("PVC %s holds the newest revision (VirtualMachineImage %s)", golden.PVC.Name, golden.Obj.GetName())
	} else {
		upToDate.Message = "a newer revision is being imported"
	}
	st.Conditions = []cdiv1.DataImportCronCondition{progressing, upToDate}
	src := cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: cron.Namespace, Name: golden.PVC.Name}}
	format, snapshotClass, err := r.sourceFormat(ctx, cron)
	if err != nil {
		return st, err
	}
	st.SourceFormat = &format
	if format == cdiv1.DataImportCronSourceFormatSnapshot {
		// The revision's golden snapshot is the source, once it is ready to use; until then the
		// DataSource names what it named.
		snap, err := goldenimage.EnsureSnapshot(ctx, r.Client, golden, snapshotClass)
		if err != nil {
			return st, err
		}
		if snap.Status == nil || !ptr.Deref(snap.Status.ReadyToUse, false) {
			msg := fmt.Sprintf("waiting for the VolumeSnapshot %s of PVC %s to be ready to use", snap.Name, golden.PVC.Name)
			if snap.Status != nil && snap.Status.Error != nil && snap.Status.Error.Message != nil {
				msg += ": " + *snap.Status.Error.Message // the snapshotter's own words
			}
			st.Conditions[1] = cdiv1.DataImportCronCondition{Type: cdiv1.DataImportCronUpToDate, ConditionState: cdiv1.ConditionState{
				Status: corev1.ConditionFalse, Reason: ReasonSnapshotNotReady, Message: msg}}
			return st, nil
		}
		src = cdiv1.DataSourceSource{Snapshot: &cdiv1.DataVolumeSourceSnapshot{Namespace: cron.Namespace, Name: snap.Name}}
	}
	if err := r.keepDataSource(ctx, cron, src); err != nil {
		return st, err
	}
	return st, r.deleteSuperseded(ctx, cron, img.Name)
}

// sourceFormat is the format of cron's sources, as the StorageProfile of its template's class
// says (pvc by default, and where the class has no VolumeSnapshotClass), with the
// VolumeSnapshotClass that snapshots are taken with.
func (r *CronReconciler) sourceFormat(ctx context.Context, cron *cdiv1.DataImportCron) (cdiv1.DataImportCronSourceFormat, string, error) {
	class, _ := templateStorage(cron)
	name, err := storage.ClassName(ctx, r.Client, class)
	if err != nil || name == "" {
		return cdiv1.DataImportCronSourceFormatPvc, "", err
	}
	profile := &cdiv1.StorageProfile{}
	if err := r.Get(ctx, client.ObjectKey{Name: name}, profile); err != nil {
		return cdiv1.DataImportCronSourceFormatPvc, "", client.IgnoreNotFound(err)
	}
	format := ptr.Deref(profile.Status.DataImportCronSourceFormat, cdiv1.DataImportCronSourceFormatPvc)
	if format != cdiv1.DataImportCronSourceFormatSnapshot || ptr.Deref(profile.Status.SnapshotClass, "") == "" {
		return cdiv1.DataImportCronSourceFormatPvc, "", nil
	}
	return format, *profile.Status.SnapshotClass, nil
}

// retain lets go of what a DataImportCron being deleted made, as its retentionPolicy says, then
// of the DataImportCron. With All, CDI's default, its DataSource and its images stay, the
// images' checks suspended: disks keep being made from them, and a DataImportCron made again
// of the same name and template (an operator's upgrade) takes them back and resumes. With
// None they go with it.
func (r *CronReconciler) retain(ctx context.Context, cron *cdiv1.DataImportCron) error {
	if !controllerutil.ContainsFinalizer(cron, finalizerRetention) {
		return nil
	}
	if ptr.Deref(cron.Spec.RetentionPolicy, cdiv1.DataImportCronRetainAll) == cdiv1.DataImportCronRetainAll {
		images := &hypercloud.VirtualMachineImageList{}
		if err := r.List(ctx, images, client.InNamespace(cron.Namespace), client.MatchingLabels{LabelDataImportCron: cron.Name}); err != nil {
			return err
		}
		for i := range images.Items {
			img := &images.Items[i]
			if !metav1.IsControlledBy(img, cron) {
				continue
			}
			patch := client.MergeFrom(img.DeepCopy())
			img.OwnerReferences = slices.DeleteFunc(img.OwnerReferences, func(o metav1.OwnerReference) bool { return o.UID == cron.UID })
			metav1.SetMetaDataAnnotation(&img.ObjectMeta, annRetainedFrom, string(cron.UID))
			if img.Spec.Schedule != nil {
				img.Spec.Schedule.Suspend = ptr.To(true)
			}
			if err := r.Patch(ctx, img, patch); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
		ds := &cdiv1.DataSource{}
		err := r.Get(ctx, client.ObjectKey{Namespace: cron.Namespace, Name: cron.Spec.ManagedDataSource}, ds)
		if client.IgnoreNotFound(err) != nil {
			return err
		}
		if err == nil && metav1.IsControlledBy(ds, cron) {
			patch := client.MergeFrom(ds.DeepCopy())
			ds.OwnerReferences = slices.DeleteFunc(ds.OwnerReferences, func(o metav1.OwnerReference) bool { return o.UID == cron.UID })
			metav1.SetMetaDataAnnotation(&ds.ObjectMeta, annRetainedFrom, string(cron.UID))
			if err := r.Patch(ctx, ds, patch); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	patch := client.MergeFrom(cron.DeepCopy())
	controllerutil.RemoveFinalizer(cron, finalizerRetention)
	return client.IgnoreNotFound(r.Patch(ctx, cron, patch))
}

// annRetainedFrom is, on what a deleted DataImportCron retained, that DataImportCron's UID.
const annRetainedFrom = "cdi.diskpipe.io/retained-from"

// adopt takes back obj, which a DataImportCron of cron's name retained when it was deleted:
// controlled by none, labelled with cron's name, and carrying diskpipe's mark for the
// DataImportCron it names as the one it was retained from. An object of that name a user made
// (no mark of diskpipe's) is not taken: it would serve its own bytes as the cron's.
func (r *CronReconciler) adopt(ctx context.Context, cron *cdiv1.DataImportCron, obj client.Object) error {
	if err := r.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		return client.IgnoreNotFound(err)
	}
	from := obj.GetAnnotations()[annRetainedFrom]
	if obj.GetLabels()[LabelDataImportCron] != cron.Name || metav1.GetControllerOf(obj) != nil || !obj.GetDeletionTimestamp().IsZero() || from == "" {
		return nil
	}
	gvk, err := r.GroupVersionKindFor(obj)
	if err != nil {
		return err
	}
	if !owned.Marked(gvk.Kind, obj, types.UID(from)) {
		return nil
	}
	patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
	if err := controllerutil.SetControllerReference(cron, obj, r.Scheme()); err != nil {
		return err
	}
	owned.Stamp(gvk.Kind, obj, cron.GetUID())
	anns := obj.GetAnnotations()
	delete(anns, annRetainedFrom)
	obj.SetAnnotations(anns)
	return r.Patch(ctx, obj, patch)
}

// deleteSuperseded deletes the scheduled images cron made for its template's earlier sources,
// now that the image of its current one, current, has a Ready revision. Their revisions go with
// them, each once no disk is being cloned from it.
func (r *CronReconciler) deleteSuperseded(ctx context.Context, cron *cdiv1.DataImportCron, current string) error {
	list := &hypercloud.VirtualMachineImageList{}
	if err := r.List(ctx, list, client.InNamespace(cron.Namespace), client.MatchingLabels{LabelDataImportCron: cron.Name}); err != nil {
		return err
	}
	for i := range list.Items {
		old := &list.Items[i]
		if old.Name == current || old.Spec.Schedule == nil || !metav1.IsControlledBy(old, cron) || !old.DeletionTimestamp.IsZero() {
			continue
		}
		if err := r.Delete(ctx, old, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	return nil
}

// cronImage is the scheduled image that serves cron, or why there can be none.
func (r *CronReconciler) cronImage(cron *cdiv1.DataImportCron, insecure []string) (*hypercloud.VirtualMachineImage, error) {
	t := cron.Spec.Template.Spec
	if t.Source == nil || (t.Source.HTTP == nil && t.Source.S3 == nil && t.Source.Registry == nil) {
		return nil, &refusal{reason: ReasonInvalidCron, message: "spec.template.spec.source must be http, s3 or registry: diskpipe checks those for new revisions"}
	}
	src, err := imageSource(t.Source, cron.Namespace, insecure)
	if err != nil {
		return nil, err
	}
	keep := ptr.Deref(cron.Spec.ImportsToKeep, common.DefaultKeep)
	if ptr.Deref(cron.Spec.GarbageCollect, cdiv1.DataImportCronGarbageCollectOutdated) == cdiv1.DataImportCronGarbageCollectNever {
		keep = 100 // the most a schedule keeps
	}
	keep = min(max(keep, 1), 100)
	name, err := CronImageName(cron)
	if err != nil {
		return nil, err
	}
	img := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cron.Namespace,
		Labels: map[string]string{LabelDataImportCron: cron.Name}},
		Spec: hypercloud.VirtualMachineImageSpec{Source: *src, Schedule: &common.ImageSchedule{Cron: cron.Spec.Schedule, Keep: &keep}}}
	img.Spec.StorageClassName, img.Spec.VolumeMode = templateStorage(cron)
	return img, nil
}

// ensureImage makes img, controlled by cron, or brings its schedule to cron's.
func (r *CronReconciler) ensureImage(ctx context.Context, cron *cdiv1.DataImportCron, img *hypercloud.VirtualMachineImage) error {
	want := img.Spec.Schedule.DeepCopy()
	if err := r.adopt(ctx, cron, img.DeepCopy()); err != nil {
		return err
	}
	if _, err := owned.Ensure(ctx, r.Client, cron, img); err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(img.Spec.Schedule, want) {
		return nil
	}
	patch := client.MergeFrom(img.DeepCopy())
	img.Spec.Schedule = want
	return r.Patch(ctx, img, patch)
}

// keepDataSource points cron's managed DataSource at src: made, controlled by cron, when
// missing; one that exists (made beforehand, as SSP makes them) is kept pointed at it.
func (r *CronReconciler) keepDataSource(ctx context.Context, cron *cdiv1.DataImportCron, src cdiv1.DataSourceSource) error {
	labels := passedLabels(cron.Labels)
	labels[LabelDataImportCron] = cron.Name
	ds := &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Name: cron.Spec.ManagedDataSource, Namespace: cron.Namespace}}
	if err := r.adopt(ctx, cron, ds); err != nil {
		return err
	}
	err := r.Get(ctx, client.ObjectKey{Namespace: cron.Namespace, Name: cron.Spec.ManagedDataSource}, ds)
	if apierrors.IsNotFound(err) {
		ds = &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Name: cron.Spec.ManagedDataSource, Namespace: cron.Namespace,
			Labels: labels}, Spec: cdiv1.DataSourceSpec{Source: src}}
		if err := controllerutil.SetControllerReference(cron, ds, r.Scheme()); err != nil {
			return err
		}
		owned.Stamp("DataSource", ds, cron.UID)
		return r.Create(ctx, ds)
	} else if err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(ds.Spec.Source, src) && hasLabels(ds.Labels, labels) {
		return nil
	}
	patch := client.MergeFrom(ds.DeepCopy())
	ds.Spec.Source = src
	for k, v := range labels {
		metav1.SetMetaDataLabel(&ds.ObjectMeta, k, v)
	}
	return r.Patch(ctx, ds, patch)
}

// passedLabels are those of a DataImportCron's labels that CDI passes on to its DataSource:
// the VM defaults of instance types and preferences (instancetype.kubevirt.io/default-*,
// which "create a VM from this boot volume" reads) and kubevirt.io/dynamic-credentials-support.
func passedLabels(from map[string]string) map[string]string {
	passed := map[string]string{}
	for k, v := range from {
		if strings.HasPrefix(k, "instancetype.kubevirt.io/") || k == "kubevirt.io/dynamic-credentials-support" {
			passed[k] = v
		}
	}
	return passed
}

// hasLabels says whether have holds every label of want.
func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if w, ok := have[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// stamp sets the times of each of conds (any of CDI's condition kinds: state says its type and
// state) as CDI does: those of the condition of its type in old when that one says the same,
// now when it changed or is new.
func stamp[C any](now metav1.Time, conds, old []C, state func(*C) (string, *cdiv1.ConditionState)) {
	for i := range conds {
		typ, c := state(&conds[i])
		var prev *cdiv1.ConditionState
		for j := range old {
			if t, o := state(&old[j]); t == typ {
				prev = o
			}
		}
		if prev != nil && prev.Status == c.Status && prev.Reason == c.Reason && prev.Message == c.Message {
			c.LastTransitionTime, c.LastHeartbeatTime = prev.LastTransitionTime, prev.LastHeartbeatTime
		} else {
			c.LastTransitionTime, c.LastHeartbeatTime = now, now
		}
	}
}
