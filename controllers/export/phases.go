package export

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	"github.com/minio/minio-go/v7"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/status"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
	"github.com/diskpipe/diskpipe/internal/backup"
	"github.com/diskpipe/diskpipe/internal/contract"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore"
)

// Condition reasons of exports.
const (
	reasonExported             = "Exported"
	reasonInUseWithoutSnapshot = "InUseWithoutSnapshot"
	reasonWaitingForSnapshot   = "WaitingForSnapshot"
	reasonWaitingForBackup     = "WaitingForBackup"
)

const (
	authDir = "/var/run/diskpipe/auth"
	caDir   = "/var/run/diskpipe/ca"
	// defaultExpiry and maxExpiry bound the download URL (SigV4 allows 7 days at most).
	defaultExpiry = 4 * time.Hour
	maxExpiry     = 7 * 24 * time.Hour
)

func (r *Reconciler) reconcile(ctx context.Context, ex *hypercloud.VirtualMachineVolumeExport) (ctrl.Result, error) {
	st, tr := &ex.Status, tracked(ex)
	switch st.Phase {
	case common.PhaseFailed:
		return ctrl.Result{}, nil
	case common.PhaseReady:
		return ctrl.Result{}, nil
	}
	if wait := tr.RetryWait(time.Now()); wait > 0 {
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	dest, err := r.destination(ctx, ex, true)
	if err == nil {
		err = r.backupAhead(ctx, ex)
	}
	if err == nil {
		var src *corev1.PersistentVolumeClaim
		if src, err = r.source(ctx, ex); err == nil && src == nil {
			return ctrl.Result{RequeueAfter: 5 * time.Second}, nil // the snapshot is being taken
		} else if err == nil {
			res, err := r.export(ctx, ex, src, dest)
			return refused(ex, res, err)
		}
	}
	var nr *goldenimage.NotReadyError
	if errors.As(err, &nr) {
		st.Phase = common.PhasePending
		tr.SetReady(metav1.ConditionFalse, nr.Reason, nr.Message)
		return ctrl.Result{RequeueAfter: 15 * time.Second}, nil
	}
	return refused(ex, ctrl.Result{}, err)
}

// backupAhead has a backup wait while an older backup of the same index is not done: each
// rewrites the index, and two at once would lose one's entry (and a retention run could
// delete what the other's index still names).
func (r *Reconciler) backupAhead(ctx context.Context, ex *hypercloud.VirtualMachineVolumeExport) error {
	if ex.Spec.Backup == nil {
		return nil
	}
	list := &hypercloud.VirtualMachineVolumeExportList{}
	if err := r.List(ctx, list, client.InNamespace(ex.Namespace)); err != nil {
		return err
	}
	for i := range list.Items {
		o := &list.Items[i]
		older := o.CreationTimestamp.Before(&ex.CreationTimestamp) || o.CreationTimestamp.Equal(&ex.CreationTimestamp) && o.Name < ex.Name
		if o.UID == ex.UID || o.Spec.Backup == nil || !older || o.Status.Phase == common.PhaseReady || o.Status.Phase == common.PhaseFailed ||
			!equality.Semantic.DeepEqual(o.Spec.ObjectStore, ex.Spec.ObjectStore) || !sameS3Object(o.Spec.S3, ex.Spec.S3) {
			continue
		}
		return &goldenimage.NotReadyError{Reason: reasonWaitingForBackup,
			Message: fmt.Sprintf("waiting for the backup %s of the same index to finish: backups of one index run one at a time", o.Name)}
	}
	return nil
}

// sameS3Object says whether two s3 destinations name one object.
func sameS3Object(a, b *common.S3Source) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Endpoint == b.Endpoint && a.BucketName == b.BucketName && a.ObjectName == b.ObjectName
}

// refused fails the export whose child's name is taken by an object diskpipe did not make for
// it, or that the store refused for good, and has it wait while the object that holds the name
// is being deleted; any other err is returned with res.
func refused(ex *hypercloud.VirtualMachineVolumeExport, res ctrl.Result, err error) (ctrl.Result, error) {
	if res, waits := tracked(ex).WaitForName(err); waits {
		return res, nil
	}
	if nt := (*owned.ErrNotOwned)(nil); errors.As(err, &nt) {
		tracked(ex).SetFailed(status.ReasonNameTaken, nt.Error())
		return ctrl.Result{}, nil
	}
	if te := (*transfer.Error)(nil); errors.As(err, &te) && !te.Transient {
		tracked(ex).SetFailed(string(te.Reason), te.Error())
		return ctrl.Result{}, nil
	}
	return res, err
}

// export runs the exporter pod on src and records its result.
func (r *Reconciler) export(ctx context.Context, ex *hypercloud.VirtualMachineVolumeExport, src *corev1.PersistentVolumeClaim, dest *destination) (ctrl.Result, error) {
	st := &ex.Status
	format, compression := ex.Spec.Format, ex.Spec.Compression
	if format == "" {
		format = hypercloud.ExportFormatQcow2
	}
	if compression == "" {
		compression = hypercloud.ExportCompressionNone
	}
	spec := importpod.Spec{Name: fmt.Sprintf("%s-export-%d", ex.Name, st.Retries), Namespace: ex.Namespace, Command: "/exporter",
		Labels:    map[string]string{LabelExport: string(ex.UID), goldenimage.LabelRole: "exporter"},
		SourcePVC: src.Name, SourceBlock: goldenimage.IsBlock(src), Mounts: dest.mounts}
	exp := dest.exp
	exp.Source, exp.Format, exp.Compression = spec.SourcePath(), string(format), string(compression)
	if dest.client == nil { // the user's store: the pod signs the download URL with the user's keys
		key, err := sealKey()
		if err != nil {
			return ctrl.Result{}, err
		}
		exp.DownloadURLExpiry, exp.SealKey, exp.SealContext = expiryOf(ex), key, sealContext(ex)
	}
	spec.Export = &exp
	pod := importpod.Build(r.Pods.Config, spec)
	work := importpod.Work{Obj: ex, Status: tracked(ex), Running: common.PhaseExporting, Action: "Export", Retry: retryOf(ex.Spec.Retry), Source: dest.kind}
	if dest.secret != nil {
		// Only before the attempt's pod exists; the cache answers while it runs, the apiserver
		// confirms it is missing (a pod made a moment ago may not be cached yet).
		err := r.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{})
		if apierrors.IsNotFound(err) {
			err = r.Fresh.API.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{})
		}
		if apierrors.IsNotFound(err) {
			err = r.prepareStore(ctx, ex, dest)
		}
		if te := (*transfer.Error)(nil); errors.As(err, &te) && !te.Transient {
			// The store refused for good (a bucket of another namespace, an invalid name).
			tracked(ex).SetFailed(string(te.Reason), te.Error())
			return ctrl.Result{}, nil
		} else if err != nil {
			return ctrl.Result{}, err
		}
	}
	if err := r.Pods.Start(ctx, work, pod); err != nil {
		return ctrl.Result{}, err
	}
	return r.Pods.Observe(ctx, work, pod, func(res *transfer.Result) error {
		now := metav1.Now()
		st.Phase, st.Progress, st.ObjectURL, st.Digest, st.CompletionTime = common.PhaseReady, "100%", res.URL, res.Digest, &now
		st.VirtualSize = resource.NewQuantity(res.VirtualSize, resource.BinarySI)
		st.StoredSize = resource.NewQuantity(res.BytesWritten, resource.BinarySI)
		msg := fmt.Sprintf("exported %s as %s to %s in %.0f s", ex.Spec.PVCName, format, res.URL, res.DurationSeconds)
		if dest.client == nil {
			if ok, err := r.fromPod(ctx, ex, res); err != nil {
				msg += "; no download URL: " + err.Error()
			} else if !ok {
				msg += "; no download URL: the exporter could not sign one (its log says why)"
			}
		} else if err := r.presign(ctx, ex, dest); err != nil {
			msg += "; no download URL: " + err.Error()
		}
		tracked(ex).SetReady(metav1.ConditionTrue, reasonExported, msg)
		r.Pods.Events.Eventf(ex, nil, corev1.EventTypeNormal, reasonExported, "Export", "Exported %s to %s", ex.Spec.PVCName, res.URL)
		if err := r.cleanupTemp(ctx, ex); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Could not remove the export's snapshot")
		}
		return nil
	})
}

// source is the PVC to read: the export's own PVC, or, while that is in use by a running pod,
// a temporary PVC restored from a snapshot of it (nil while the snapshot is not ready).
func (r *Reconciler) source(ctx context.Context, ex *hypercloud.VirtualMachineVolumeExport) (*corev1.PersistentVolumeClaim, error) {
	st := &ex.Status
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: ex.Namespace, Name: ex.Spec.PVCName}, pvc); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &goldenimage.NotReadyError{Reason: "SourceNotFound", Message: "the PVC " + ex.Spec.PVCName + " does not exist"}
		}
		return nil, err
	}
	if st.SnapshotName == "" {
		pod, err := importpod.UserOf(ctx, r.Client, ex.Namespace, pvc.Name, ex.UID)
		if err != nil || pod == nil {
			return pvc, err
		}
		user := pod.Name
		class, err := storage.Class(ctx, r.Client, ptr.Deref(pvc.Spec.StorageClassName, ""))
		if err != nil {
			return nil, err
		}
		snapClass, why, err := storage.SnapshotClasses{Reader: r.Client, Named: r.SnapshotClassNamed}.For(ctx, class)
		if err != nil {
			return nil, err
		}
		if snapClass == "" {
			return nil, &goldenimage.NotReadyError{Reason: reasonInUseWithoutSnapshot, Message: fmt.Sprintf(
				"the PVC %s is in use by the pod %s and it cannot be snapshotted (%s), so it cannot be exported "+
					"without reading a disk that is being written: stop the VM, or install a VolumeSnapshotClass for its driver", pvc.Name, user, why)}
		}
		snap := &snapshotv1.VolumeSnapshot{ObjectMeta: metav1.ObjectMeta{Name: ex.Name + "-export", Namespace: ex.Namespace,
			Labels: map[string]string{LabelExport: string(ex.UID)}},
			Spec: snapshotv1.VolumeSnapshotSpec{Source: snapshotv1.VolumeSnapshotSource{PersistentVolumeClaimName: &pvc.Name},
				VolumeSnapshotClassName: &snapClass}}
		if err := owned.Create(ctx, r.Client, ex, snap); err != nil {
			return nil, err
		}
		st.SnapshotName = snap.Name
		tracked(ex).SetReady(metav1.ConditionFalse, reasonWaitingForSnapshot,
			fmt.Sprintf("the PVC is in use by the pod %s: exporting a snapshot of it, %s", user, snap.Name))
		r.Pods.Events.Eventf(ex, nil, corev1.EventTypeNormal, reasonWaitingForSnapshot, "Snapshot", "PVC %s is in use by %s: exporting snapshot %s", pvc.Name, user, snap.Name)
		return nil, nil
	}
	snap := &snapshotv1.VolumeSnapshot{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: ex.Namespace, Name: st.SnapshotName}, snap); err != nil {
		return nil, err
	}
	if snap.Status == nil || !ptr.Deref(snap.Status.ReadyToUse, false) {
		st.Phase = common.PhasePending
		tracked(ex).SetReady(metav1.ConditionFalse, reasonWaitingForSnapshot, "waiting for the snapshot "+snap.Name+" to be ready")
		return nil, nil
	}
	size := storage.ClaimSize(pvc)
	if snap.Status.RestoreSize != nil && snap.Status.RestoreSize.Cmp(size) > 0 {
		size = *snap.Status.RestoreSize
	}
	temp := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: snap.Name, Namespace: ex.Namespace,
		Labels: map[string]string{LabelExport: string(ex.UID)}},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
			StorageClassName: pvc.Spec.StorageClassName, VolumeMode: pvc.Spec.VolumeMode,
			DataSource: &corev1.TypedLocalObjectReference{APIGroup: ptr.To(snapshotv1.GroupName), Kind: "VolumeSnapshot", Name: snap.Name}}}
	if err := owned.Create(ctx, r.Client, ex, temp); err != nil {
		return nil, err
	}
	return temp, nil
}

// destination is where the exporter writes, and how the manager reaches it.
type destination struct {
	kind   string          // for metrics: "s3" (the user's store) or "bundled"
	exp    contract.Export // the exporter's flags for the store
	mounts []importpod.Mount
	// client is the bundled store as the export's namespace; nil for the user's store, which
	// only pods reach.
	client *objectstore.Client
	// presigner signs the download URL; nil: client.
	presigner *objectstore.Client
	// secret is the bundled store's credentials Secret for the pod, made by prepareStore.
	secret *corev1.Secret
	bucket string
	object string
	// index is a backup's index, beside which object is (spec.backup); empty otherwise.
	index string
}

// destination resolves where the export goes; forPod also prepares what the exporter pod
// mounts (the manager alone needs no Secret of its own to presign or delete).
func (r *Reconciler) destination(ctx context.Context, ex *hypercloud.VirtualMachineVolumeExport, forPod bool) (*destination, error) {
	d, err := r.destinationOf(ctx, ex, forPod)
	if err != nil || ex.Spec.Backup == nil {
		return d, err
	}
	// A backup is written beside its index, named by its checkpoint; the exporter reads and
	// writes the index (exporter.Keep).
	b := ex.Spec.Backup
	d.index = d.object
	d.object = backup.ObjectKey(d.index, cmp.Or(b.Checkpoint, ex.Name)+".qcow2")
	d.exp.Object = d.object
	d.exp.Backup = contract.Backup{BackupIndex: d.index, BackupCheckpoint: cmp.Or(b.Checkpoint, ex.Name), BackupFull: b.Full,
		BackupMaxChain: int(ptr.Deref(b.MaxChain, 7)), BackupKeepFulls: int(b.KeepFulls)}
	return d, nil
}

func (r *Reconciler) destinationOf(ctx context.Context, ex *hypercloud.VirtualMachineVolumeExport, forPod bool) (*destination, error) {
	if s3 := ex.Spec.S3; s3 != nil {
		// The user's store: the manager reads neither the keys nor the CA. Only the pods of
		// the export's namespace do, as volumes; they also sign the download URL and delete
		// the object (storeAction).
		d := &destination{kind: "s3", bucket: string(s3.BucketName), object: string(s3.ObjectName),
			exp: contract.Export{S3: contract.S3{Endpoint: string(s3.Endpoint), Region: s3.Region, BucketLookup: string(orAuto(s3.BucketLookup)),
				Bucket: string(s3.BucketName), Object: string(s3.ObjectName)}}}
		if s3.SecretRef != "" {
			d.exp.CredentialsDir = authDir
			d.mounts = append(d.mounts, importpod.Mount{Secret: string(s3.SecretRef), Path: authDir, Optional: true})
		}
		if s3.CertConfigMap != "" {
			d.exp.CAFile = caDir + "/ca.crt"
			d.mounts = append(d.mounts, importpod.Mount{ConfigMap: string(s3.CertConfigMap), Path: caDir})
		}
		return d, nil
	}
	if r.Store == nil || r.StoreConfig == nil {
		return nil, &goldenimage.NotReadyError{Reason: "ObjectStoreNotConfigured", Message: "this installation has no bundled object store: use spec.s3"}
	}
	target := ex.Spec.ObjectStore
	if target == nil {
		return nil, &goldenimage.NotReadyError{Reason: "InvalidSpec", Message: "spec.objectStore or spec.s3 is required"}
	}
	// Everything in the store is done as the export's namespace: its own buckets only.
	store, err := r.Store.Namespace(ctx, ex.Namespace, transfer.ReasonTargetForbidden)
	if err != nil {
		return nil, goldenimage.StoreUnavailable(ex.Namespace, err)
	}
	d := &destination{kind: "bundled", client: store, presigner: r.Downloads, bucket: string(target.BucketName), object: string(target.ObjectName)}
	if !forPod {
		return d, nil
	}
	// The exporter writes with keys in a Secret that only its pod mounts and that goes with
	// the export (made by prepareStore before each attempt's pod): on the bundled store, an
	// account that may write this one object and nothing else; on an external store in its
	// place, the keys the installation was given.
	// On a store of accounts the manager makes the bucket, and aborts stale uploads, which the
	// account may not list.
	d.exp.CreateBucket, d.exp.KeepStaleUploads = !r.StoreConfig.Scoped, r.StoreConfig.Scoped
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: ex.Name + "-export-store", Namespace: ex.Namespace,
		Labels: map[string]string{LabelExport: string(ex.UID)}}, StringData: map[string]string{}}
	if !r.StoreConfig.Scoped {
		sec.StringData["accessKeyId"], sec.StringData["secretAccessKey"] = r.StoreConfig.AccessKey, r.StoreConfig.SecretKey
	}
	if r.StoreConfig.CAFile != "" { // an external store in place of the bundled one, with its own CA
		ca, err := os.ReadFile(r.StoreConfig.CAFile)
		if err != nil {
			return nil, fmt.Errorf("reading the object store's CA: %w", err)
		}
		sec.StringData["ca.crt"] = string(ca)
		d.exp.CAFile = authDir + "/ca.crt"
	}
	d.secret = sec
	region, lookup := r.StoreConfig.Region, r.StoreConfig.BucketLookup
	if region == "" {
		region = "us-east-1"
	}
	if lookup == "" {
		lookup = "Auto"
	}
	d.exp.S3 = contract.S3{Endpoint: r.StoreConfig.Endpoint, Region: region, BucketLookup: lookup, Bucket: d.bucket, Object: d.object, CredentialsDir: authDir}
	d.mounts = []importpod.Mount{{Secret: sec.Name, Path: authDir}}
	return d, nil
}

// prepareStore readies the bundled store for an attempt whose pod does not exist yet: on a
// store that makes accounts, the bucket, no unfinished upload left by an earlier attempt, and
// the export's account; then the Secret with the keys the pod uses. Run while a pod exists,
// aborting "stale" uploads would abort the running one.
func (r *Reconciler) prepareStore(ctx context.Context, ex *hypercloud.VirtualMachineVolumeExport, d *destination) error {
	if r.StoreConfig.Scoped {
		if err := d.client.EnsureBucket(ctx, d.bucket); err != nil {
			return err
		}
		// Another namespace's bucket that it shares with this one is not this export's to
		// write: its owner would read the disk (a tenant may make a bucket of a name others
		// use, and share it with them, before they do).
		if err := d.client.CheckOwnBucket(ctx, d.bucket, transfer.ReasonTargetForbidden); err != nil {
			return err
		}
		ids, err := d.client.AbortUploads(ctx, d.bucket, d.object)
		if err != nil {
			return err
		}
		if len(ids) > 0 {
			log.FromContext(ctx).Info("Aborted uploads an earlier attempt left behind", "object", objectstore.ObjectURL(d.bucket, d.object), "uploads", len(ids))
		}
		object, actions := d.object, objectstore.ScopedActions
		if d.index != "" {
			// A backup reads the index and its parent's sums, writes beside them and deletes
			// what keepFulls drops: everything under the index's directory, nothing else.
			object, actions = backup.ObjectKey(d.index, "*"), append(slices.Clone(actions), "s3:GetObject", "s3:DeleteObject")
		}
		access, secret, err := d.client.Scope(ctx, string(ex.UID), d.bucket, object, actions)
		if err != nil {
			return err
		}
		d.secret.StringData["accessKeyId"], d.secret.StringData["secretAccessKey"] = access, secret
	}
	return owned.Put(ctx, r.Client, ex, d.secret)
}

func orAuto(l common.BucketLookup) common.BucketLookup {
	if l == "" {
		return common.BucketLookupAuto
	}
	return l
}

// cleanupTemp removes the snapshot and temporary PVC of an in-use export, and the store
// credentials (on the bundled store, the export's account too).
func (r *Reconciler) cleanupTemp(ctx context.Context, ex *hypercloud.VirtualMachineVolumeExport) error {
	if err := r.unscope(ctx, ex, string(ex.UID)); err != nil {
		return err
	}
	meta := metav1.ObjectMeta{Name: ex.Name + "-export", Namespace: ex.Namespace}
	for _, obj := range []client.Object{&corev1.PersistentVolumeClaim{ObjectMeta: meta}, &snapshotv1.VolumeSnapshot{ObjectMeta: meta},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: ex.Name + "-export-store", Namespace: ex.Namespace}}} {
		if err := r.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// unscope removes the bundled store's account id of ex (the exporter's or the download URLs'),
// as ex's namespace, which owns the bucket's policy.
func (r *Reconciler) unscope(ctx context.Context, ex *hypercloud.VirtualMachineVolumeExport, id string) error {
	t := ex.Spec.ObjectStore
	if t == nil || ex.Spec.S3 != nil || r.Store == nil || r.StoreConfig == nil || !r.StoreConfig.Scoped {
		return nil
	}
	store, err := r.Store.Namespace(ctx, ex.Namespace, transfer.ReasonTargetForbidden)
	if err != nil {
		return err
	}
	return store.Unscope(ctx, id, string(t.BucketName))
}

// delete removes what the export made and, with retainPolicy Delete, the exported object.
func (r *Reconciler) delete(ctx context.Context, ex *hypercloud.VirtualMachineVolumeExport) error {
	// Its pods, known by diskpipe's mark: the label alone is one its namespace can write, on a
	// VM's pod as well.
	pods := &corev1.PodList{}
	if err := r.List(ctx, pods, client.InNamespace(ex.Namespace), client.MatchingLabels{LabelExport: string(ex.UID)}); err != nil {
		return err
	}
	for i := range pods.Items {
		if p := &pods.Items[i]; importpod.Made(p, ex.UID) {
			if err := r.Delete(ctx, p); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	if err := r.cleanupTemp(ctx, ex); err != nil {
		return err
	}
	if err := r.unscope(ctx, ex, downloadAccount(ex)); err != nil { // its URLs stop working
		return err
	}
	if err := r.dropDownload(ctx, ex); err != nil {
		return err
	}
	if ex.Spec.RetainPolicy != hypercloud.RetainPolicyDelete || ex.Status.ObjectURL == "" {
		return nil
	}
	d, err := r.destination(ctx, ex, false)
	if err != nil {
		return err
	}
	if d.client != nil {
		if err := d.client.RemoveObject(ctx, d.bucket, d.object, minio.RemoveObjectOptions{}); err != nil {
			return objectstore.Classify(err, "deleting "+ex.Status.ObjectURL)
		}
		return nil
	}
	res, err := r.storeAction(ctx, ex, d, "delete")
	switch {
	case apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
		// The namespace is going, with the Secret a pod would need: the object stays.
		r.Pods.Events.Eventf(ex, nil, corev1.EventTypeWarning, "ObjectKept", "Delete",
			"%s was not deleted: its namespace is being deleted, so no pod can delete it", ex.Status.ObjectURL)
		return nil
	case errors.As(err, new(*owned.ErrNotOwned)):
		// Someone else's pod holds the name: its result is not believed, and the export goes.
		r.Pods.Events.Eventf(ex, nil, corev1.EventTypeWarning, "ObjectKept", "Delete", "%s was not deleted: %v", ex.Status.ObjectURL, err)
		return nil
	case err != nil:
		return err
	case res == nil:
		return errDeleting
	case res.Succeeded:
		return nil
	case res.Transient:
		r.Pods.Events.Eventf(ex, nil, corev1.EventTypeWarning, string(res.Reason), "Delete",
			"Deleting %s failed, tried again: %s", ex.Status.ObjectURL, res.Message)
		return errDeleting
	default:
		r.Pods.Events.Eventf(ex, nil, corev1.EventTypeWarning, string(res.Reason), "Delete",
			"%s was not deleted (%s): the export goes, the object stays", ex.Status.ObjectURL, res.Message)
		return nil
	}
}

// errDeleting: a pod is deleting the export's object from the user's store.
var errDeleting = errors.New("a pod is deleting the exported object")

// LabelStoreAction marks the pod that signs a URL or deletes the object of an export to the
// user's store, with the export's UID.
const LabelStoreAction = "diskpipe.io/export-store-action"

// storeAction runs the exporter with --action (presign or delete) in the export's namespace
// for an export to the user's store, whose keys only that pod reads. It returns the pod's
// result once it ended, deleting the pod; nil while it runs.
func (r *Reconciler) storeAction(ctx context.Context, ex *hypercloud.VirtualMachineVolumeExport, d *destination, action string) (*transfer.Result, error) {
	exp := d.exp
	exp.Action = action
	if action == "presign" {
		key, err := sealKey()
		if err != nil {
			return nil, err
		}
		exp.DownloadURLExpiry, exp.SealKey, exp.SealContext = expiryOf(ex), key, sealContext(ex)
	}
	spec := importpod.Spec{Name: ex.Name + "-" + action, Namespace: ex.Namespace, Command: "/exporter",
		Labels: map[string]string{LabelStoreAction: string(ex.UID), goldenimage.LabelRole: "exporter"}, Mounts: d.mounts, Export: &exp}
	pod := importpod.Build(r.Pods.Config, spec)
	if err := importpod.Ensure(ctx, r.Client, r.Pods.Config, ex, pod); err != nil {
		return nil, err
	}
	if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
		return nil, nil
	}
	res := importpod.Result(pod)
	if pod.Status.Phase == corev1.PodFailed {
		res.Succeeded = false
	}
	return res, client.IgnoreNotFound(r.Delete(ctx, pod))
}
