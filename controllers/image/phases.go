package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	"github.com/minio/minio-go/v7"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/hostcopy"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
	"github.com/diskpipe/diskpipe/internal/backup"
	"github.com/diskpipe/diskpipe/internal/contract"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore"
	"github.com/diskpipe/diskpipe/objectstore/uploads"
)

// presignExpiry is how long an importer may read an objectStore source through its URL.
const presignExpiry = 24 * time.Hour

// ReasonCloneSourceInUse says the PVC to copy is mounted by a pod that may be writing it (CDI's
// reason and event).
const ReasonCloneSourceInUse = "CloneSourceInUse"

func (r *Reconciler) reconcile(ctx context.Context, g *goldenImage) (ctrl.Result, error) {
	st, tr := g.status, g.tracked()
	if st.Phase == common.PhaseReady || st.Phase == common.PhaseFailed {
		if ref := g.source.copyOf; ref != nil && st.Phase == common.PhaseFailed {
			// A copy that failed for good lets go of what served it in the source's namespace
			// (its pod, its token, a volume restored from a snapshot).
			if err := hostcopy.Cleanup(ctx, r.Client, g.obj, ref.namespace); err != nil {
				return ctrl.Result{}, err
			}
		}
		// An import's outcome is final (the source cannot change); only the golden snapshot,
		// made when a disk first needs it, and whether the golden volume's node is there, are
		// noted.
		if err := r.checkGoldenNode(ctx, g); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, r.noteSnapshot(ctx, g)
	}
	st.SourceType = g.source.kind
	if wait := tr.RetryWait(time.Now()); wait > 0 {
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	if g.source.upload != "" {
		err := r.uploaded(ctx, g)
		if res, handled := r.childError(g, err); handled {
			return res, nil
		} else if err != nil {
			return ctrl.Result{}, err
		}
	}
	pvcName := childName(g.prefix, g.obj.GetName())
	class, err := storage.ClassName(ctx, r.Client, g.volume.StorageClassName)
	if err != nil {
		return ctrl.Result{}, err
	}
	var copyFrom *corev1.PersistentVolumeClaim
	if ref := g.source.copyOf; ref != nil {
		pvc, err := copySourcePVC(ctx, r.Client, r.Fresh.API, g.obj, ref, class)
		if nr := (*goldenimage.NotReadyError)(nil); errors.As(err, &nr) {
			st.Phase = common.PhasePending
			tr.SetReady(metav1.ConditionFalse, nr.Reason, nr.Message)
			return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
		} else if err != nil {
			return ctrl.Result{}, err
		}
		copyFrom = pvc
		// A claim its namespace's pods may write (a PVC, a disk's) is copied only while none
		// does: a golden image's and a snapshot's restore are read-only, diskpipe's own.
		if (ref.what == copyOfPVC || ref.what == copyOfDisk) && st.Phase != common.PhaseImporting {
			user, err := importpod.UserOf(ctx, r.Client, pvc.Namespace, pvc.Name, g.obj.GetUID())
			if err != nil {
				return ctrl.Result{}, err
			}
			if user != nil {
				msg := fmt.Sprintf("pod %s/%s using PersistentVolumeClaim %s: the copy waits until no pod writes it (a disk copied while a VM writes it is not a disk to trust)",
					user.Namespace, user.Name, pvc.Name)
				st.Phase = common.PhasePending
				tr.SetReady(metav1.ConditionFalse, ReasonCloneSourceInUse, msg)
				r.Pods.Events.Eventf(g.obj, nil, corev1.EventTypeNormal, ReasonCloneSourceInUse, "Copy", "%s", msg)
				return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
			}
		}
	}
	block := g.volume.VolumeMode != nil && *g.volume.VolumeMode == corev1.PersistentVolumeBlock
	capacity := int64(0)
	switch {
	case g.volume.Resources.Requests.Storage != nil:
		capacity = g.volume.Resources.Requests.Storage.Value()
	case copyFrom != nil:
		q := storage.ClaimSize(copyFrom)
		overhead := r.Pods.Config.FilesystemOverhead
		capacity = transfer.CopyCapacity(q.Value(), goldenimage.IsBlock(copyFrom), block, overhead.For(ptr.Deref(copyFrom.Spec.StorageClassName, "")), overhead.For(class))
	default:
		if c := meta.FindStatusCondition(st.Conditions, common.ConditionReady); c != nil && c.Reason == goldenimage.ReasonSizeRequired {
			return ctrl.Result{}, nil // until the spec gives a size
		}
		if st.VirtualSize == nil {
			return r.probe(ctx, g, pvcName)
		}
		capacity = transfer.RoundMiB(st.VirtualSize.Value()) // a block volume is the disk
		if !block {
			capacity = transfer.VolumeSizeFor(st.VirtualSize.Value(), r.Pods.Config.FilesystemOverhead.For(class))
		}
	}
	err = r.ensurePVC(ctx, g, pvcName, capacity)
	if res, handled := r.childError(g, err); handled {
		return res, nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	spec := importpod.Spec{Name: fmt.Sprintf("%s-import-%d", pvcName, st.Retries), PVC: pvcName, Capacity: capacity,
		Block: block, StorageClass: class, Preallocate: ptr.Deref(g.volume.Preallocation, false)}
	if copyFrom != nil {
		src := hostcopy.Source{Namespace: copyFrom.Namespace, Name: copyFrom.Name, Block: goldenimage.IsBlock(copyFrom)}
		if ready, err := hostcopy.Prepare(ctx, r.Client, r.Fresh.API, r.Pods.Config, g.obj, src, &spec); err != nil || !ready {
			st.Phase = common.PhasePending
			// Its pod's changes wake this (hostcopy.Wakes); ServingPoll is in case none comes.
			msg, wait := "waiting for the pod that serves "+copyFrom.Namespace+"/"+copyFrom.Name, hostcopy.ServingPoll
			if busy := (*hostcopy.BusyError)(nil); errors.As(err, &busy) {
				msg, wait, err = busy.Error(), 10*time.Second, nil
			}
			tr.SetReady(metav1.ConditionFalse, "WaitingForCloneSource", msg)
			return ctrl.Result{RequeueAfter: wait}, err
		}
	}
	pod, err := r.ensurePod(ctx, g, spec, r.work(g, "Import"))
	if res, handled := r.childError(g, err); handled {
		return res, nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	st.PVCName = pvcName
	return r.Pods.Observe(ctx, r.work(g, "Import"), pod, func(res *transfer.Result) error {
		setImported(st, res, pvcName)
		r.Pods.Events.Eventf(g.obj, nil, corev1.EventTypeNormal, reasonImported, "Import",
			"Imported %s (%s, %d bytes) into %s", g.source.kind, res.Format, res.VirtualSize, pvcName)
		if copyFrom != nil {
			if err := hostcopy.Cleanup(ctx, r.Client, g.obj, copyFrom.Namespace); err != nil {
				ctrl.LoggerFrom(ctx).Error(err, "Could not remove the clone source")
			}
		}
		return nil
	})
}

// uploaded turns an upload source into the object the upload proxy stored, once the proxy has
// marked it whole; until then the image waits.
func (r *Reconciler) uploaded(ctx context.Context, g *goldenImage) error {
	if r.ObjectStore == nil {
		return &goldenimage.NotReadyError{Reason: "ObjectStoreNotConfigured", Message: "uploads need the bundled object store, which this installation has not"}
	}
	key := uploads.ObjectKey(g.obj.GetNamespace(), g.source.upload, g.obj.GetName(), string(g.obj.GetUID()))
	if _, err := r.ObjectStore.StatObject(ctx, uploads.Bucket, uploads.MarkerKey(key), minio.StatObjectOptions{}); err != nil {
		if minio.ToErrorResponse(err).StatusCode == http.StatusNotFound {
			return &goldenimage.NotReadyError{Reason: goldenimage.ReasonWaitingForUpload, Message: fmt.Sprintf("upload the image: PUT it to the upload proxy at /v1/namespaces/%s/%s/%s",
				g.obj.GetNamespace(), g.source.upload, g.obj.GetName())}
		}
		return objectstore.Classify(err, "looking for the upload")
	}
	// Its marker and bytes are believed only in the proxy's own bucket, not in one of that
	// name a tenant made first.
	if err := r.ObjectStore.CheckOwnBucket(ctx, uploads.Bucket, transfer.ReasonSourceForbidden); err != nil {
		return err
	}
	g.source.objectStore = &common.ObjectStoreSource{BucketName: uploads.Bucket, ObjectName: common.ObjectName(key)}
	return nil
}

// childError turns the errors a user can act on into status: a child's name taken by
// another object fails the import; a missing dependency, or a name still held by an object
// being deleted, makes it wait.
func (r *Reconciler) childError(g *goldenImage, err error) (ctrl.Result, bool) {
	var notOwned *owned.ErrNotOwned
	var notReady *goldenimage.NotReadyError
	var refused *transfer.Error
	if res, waits := g.tracked().WaitForName(err); waits {
		return res, true
	}
	switch {
	case errors.As(err, &notOwned):
		g.tracked().SetFailed("NameTaken", notOwned.Error())
		return ctrl.Result{}, true
	case errors.As(err, &refused) && !refused.Transient:
		// The manager's own step with the source failed for good (the bundled store refused).
		g.tracked().SetFailed(string(refused.Reason), refused.Error())
		return ctrl.Result{}, true
	case errors.As(err, &notReady):
		g.status.Phase = common.PhasePending
		g.tracked().SetReady(metav1.ConditionFalse, notReady.Reason, notReady.Message)
		return ctrl.Result{RequeueAfter: 10 * time.Second}, true
	}
	return ctrl.Result{}, false
}

// work is what a pod of g does: action is "Import" (probes too) or "Check".
func (r *Reconciler) work(g *goldenImage, action string) importpod.Work {
	return importpod.Work{Obj: g.obj, Status: g.tracked(), Running: common.PhaseImporting, Action: action, Retry: g.retry, Source: g.source.kind}
}

// probe runs the importer in probe mode to learn the source's virtual size.
func (r *Reconciler) probe(ctx context.Context, g *goldenImage, pvcName string) (ctrl.Result, error) {
	w := r.work(g, "Import")
	pod, err := r.ensurePod(ctx, g, importpod.Spec{Name: fmt.Sprintf("%s-probe-%d", pvcName, g.status.Retries), Import: contract.Import{Probe: true}}, w)
	if res, handled := r.childError(g, err); handled {
		return res, nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	st := g.status
	return r.Pods.Observe(ctx, w, pod, func(res *transfer.Result) error {
		if res.VirtualSize < 0 {
			g.tracked().SetReady(metav1.ConditionFalse, goldenimage.ReasonSizeRequired,
				"the source's size cannot be known without importing it (a compressed raw image): set spec.resources.requests.storage")
			st.Phase = common.PhasePending
			return nil
		}
		if err := transfer.CheckVirtualSize(res.VirtualSize); err != nil {
			g.tracked().SetFailed(string(transfer.ReasonOf(err)), err.Error())
			return nil
		}
		st.Format, st.VirtualSize = res.Format, resource.NewQuantity(res.VirtualSize, resource.BinarySI)
		return nil
	})
}

func (r *Reconciler) ensurePVC(ctx context.Context, g *goldenImage, name string, capacity int64) error {
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: g.obj.GetNamespace(),
		Labels: map[string]string{goldenimage.LabelImage: string(g.obj.GetUID()), goldenimage.LabelGolden: "true"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(capacity, resource.BinarySI)}},
			StorageClassName: g.volume.StorageClassName, VolumeMode: g.volume.VolumeMode,
		}}
	return owned.Create(ctx, r.Client, g.obj, pvc)
}

// ensurePod creates the importer pod of s, doing w, unless it exists, with the source's flags
// added to s's; an objectStore source gets a fresh presigned URL, in a Secret, for each attempt.
func (r *Reconciler) ensurePod(ctx context.Context, g *goldenImage, s importpod.Spec, w importpod.Work) (*corev1.Pod, error) {
	s.Namespace = g.obj.GetNamespace()
	s.Labels = map[string]string{goldenimage.LabelImage: string(g.obj.GetUID()), goldenimage.LabelRole: "importer"}
	contract.Overlay(&s.Import, g.source.imp)
	s.Mounts = append(append([]importpod.Mount{}, g.source.mounts...), s.Mounts...)
	s.Scratch = s.Scratch || g.source.scratch
	s.Import.Checksum, s.Import.OVADisk = string(g.checksum), g.ovaDisk
	g.pulledByNode(&s)
	pod := &corev1.Pod{}
	err := r.Get(ctx, client.ObjectKey{Namespace: s.Namespace, Name: s.Name}, pod)
	if err == nil {
		return pod, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, err
	}
	if src := g.source.objectStore; src != nil {
		if err := r.presign(ctx, g, src, s.Name); err != nil {
			return nil, err
		}
		s.Import.Source, s.Import.URLFile = "http", urlDir+"/url"
		if g.source.chain {
			s.Import.LayerURLDir = urlDir
		}
		if r.ObjectStoreCA != "" {
			s.Import.CAFile = urlDir + "/ca.crt"
		}
		s.Mounts = append(s.Mounts, importpod.Mount{Secret: s.Name, Path: urlDir})
	}
	// A KubeVirt export server, read at its own pod (importpod.ExportServer).
	if s.Import.Source == "http" && s.Import.URL != "" && !s.Import.Insecure {
		to, err := importpod.ExportServer(ctx, r.Fresh.API, s.Import.URL)
		var wait *importpod.ExportWait
		if errors.As(err, &wait) {
			return nil, &goldenimage.NotReadyError{Reason: "SourceNotReady", Message: wait.Message}
		} else if err != nil {
			return nil, err
		}
		if to != "" {
			s.Import.ConnectTo = append(s.Import.ConnectTo, to)
		}
	}
	pod = importpod.Build(r.Pods.Config, s)
	if err := r.Pods.Start(ctx, w, pod); err != nil {
		return nil, err
	}
	return pod, nil
}

// presign writes a presigned GET URL of the source object into the Secret name: the importer
// reads the one object, for a day, without the store's keys. It is signed with the keys of the
// image's namespace, so the store refuses an object the namespace may not read; the refusal is
// learnt here, before a pod starts.
func (r *Reconciler) presign(ctx context.Context, g *goldenImage, src *common.ObjectStoreSource, name string) error {
	if r.ObjectStore == nil {
		return &goldenimage.NotReadyError{Reason: "ObjectStoreNotConfigured", Message: "this installation has no bundled object store; use an s3 source"}
	}
	// As the image's namespace: its own buckets, or those another namespace shared with it. An
	// upload is read from the upload proxy's own bucket, which no namespace can name.
	store := r.ObjectStore
	if g.source.upload == "" {
		var err error
		if store, err = r.ObjectStore.Namespace(ctx, g.obj.GetNamespace(), transfer.ReasonSourceForbidden); err != nil {
			return goldenimage.StoreUnavailable(g.obj.GetNamespace(), err)
		}
	}
	// A store that is away is the importer's to wait for, with its retries.
	if err := store.CheckRead(ctx, string(src.BucketName), string(src.ObjectName)); err != nil && !transfer.IsTransient(err) {
		return err
	}
	u, err := store.PresignGet(ctx, string(src.BucketName), string(src.ObjectName), presignExpiry)
	if err != nil {
		return err
	}
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: g.obj.GetNamespace(),
		Labels: map[string]string{goldenimage.LabelImage: string(g.obj.GetUID())}}, StringData: map[string]string{"url": u.String()}}
	if g.source.chain {
		if err := presignLayers(ctx, store, src, g.source.imp.ChainPoint, sec.StringData); err != nil {
			return err
		}
	}
	if r.ObjectStoreCA != "" {
		ca, err := os.ReadFile(r.ObjectStoreCA)
		if err != nil {
			return fmt.Errorf("reading the object store's CA: %w", err)
		}
		sec.StringData["ca.crt"] = string(ca)
	}
	return owned.Put(ctx, r.Client, g.obj, sec)
}

// presignLayers reads the backup index src names, as the namespace, and adds a presigned URL
// of each layer of its point to urls, under "layer-<checkpoint>" (importer --layer-url-dir).
// An index that does not parse, or lacks the point, is the importer's to refuse with its
// reason: the pod is made without those layers, and says why.
func presignLayers(ctx context.Context, store *objectstore.Client, src *common.ObjectStoreSource, point string, urls map[string]string) error {
	b, err := store.ReadObject(ctx, string(src.BucketName), string(src.ObjectName), backup.MaxIndexBytes+1)
	if err != nil {
		return store.Forbidden(err, transfer.ReasonSourceForbidden, "read", objectstore.ObjectURL(string(src.BucketName), string(src.ObjectName)))
	}
	ix, err := backup.Parse(b)
	if err != nil {
		return nil
	}
	layers, err := ix.Chain(point, backup.MaxChainLayers)
	if err != nil {
		return nil
	}
	for _, l := range layers {
		u, err := store.PresignGet(ctx, string(src.BucketName), backup.ObjectKey(string(src.ObjectName), l.Object), presignExpiry)
		if err != nil {
			return err
		}
		urls[backup.LayerURLKey(l.Checkpoint)] = u.String()
	}
	return nil
}

// delete stops the import and removes what the image made, once no disk is being cloned
// from it, then lets the image go.
func (r *Reconciler) delete(ctx context.Context, g *goldenImage) (ctrl.Result, error) {
	uid := string(g.obj.GetUID())
	ns := client.InNamespace(g.obj.GetNamespace())
	if g.schedule != nil {
		if n, err := r.deleteRevisions(ctx, g); err != nil || n > 0 {
			g.status.Phase = common.PhaseDeleting
			g.tracked().SetReady(metav1.ConditionFalse, reasonWaitingForRevisions,
				fmt.Sprintf("the %d images of its revisions are being deleted, each once no disk is being cloned from it", n))
			return ctrl.Result{RequeueAfter: 5 * time.Second}, err
		}
	}
	if err := r.DeleteAllOf(ctx, &corev1.Pod{}, ns, client.MatchingLabels{goldenimage.LabelImage: uid}); err != nil {
		return ctrl.Result{}, err
	}
	clones, err := r.clones(ctx, g)
	if err != nil {
		return ctrl.Result{}, err
	}
	if n := len(clones); n > 0 {
		g.status.Phase = common.PhaseDeleting
		g.tracked().SetReady(metav1.ConditionFalse, reasonWaitingForClones,
			fmt.Sprintf("%d disks are being cloned from this image (first: %s/%s); it is deleted when they are made",
				n, clones[0].Namespace, clones[0].Name))
		return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
	}
	if err := r.DeleteAllOf(ctx, &snapshotv1.VolumeSnapshot{}, ns, client.MatchingLabels{goldenimage.LabelImage: uid}); err != nil && !meta.IsNoMatchError(err) {
		return ctrl.Result{}, err
	}
	if err := r.DeleteAllOf(ctx, &corev1.Secret{}, ns, client.MatchingLabels{goldenimage.LabelImage: uid}); err != nil {
		return ctrl.Result{}, err
	}
	if g.source.upload != "" && r.ObjectStore != nil {
		// The uploaded bytes are the image's: they go with it, and count against no one.
		key := uploads.ObjectKey(g.obj.GetNamespace(), g.source.upload, g.obj.GetName(), uid)
		if err := uploads.Remove(ctx, r.ObjectStore, key); err != nil {
			return ctrl.Result{}, err
		}
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: childName(g.prefix, g.obj.GetName()), Namespace: g.obj.GetNamespace()}}
	if err := r.Delete(ctx, pvc); err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	if ref := g.source.copyOf; ref != nil {
		if err := hostcopy.CleanupReading(ctx, r.Client, r.Fresh.API, g.obj, ref.namespace); err != nil {
			return ctrl.Result{}, err
		}
	}
	if controllerutil.RemoveFinalizer(g.obj, goldenimage.Finalizer) {
		return ctrl.Result{}, r.Update(ctx, g.obj)
	}
	return ctrl.Result{}, nil
}

// childName names an image's children: prefix and name, shortened with a hash when that
// would leave no room for the pods' suffixes.
func childName(prefix, name string) string {
	n := prefix + "-" + name
	if len(n) <= 200 {
		return n
	}
	sum := sha256.Sum256([]byte(n))
	return n[:180] + "-" + hex.EncodeToString(sum[:])[:10]
}
