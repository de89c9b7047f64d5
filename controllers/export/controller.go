// Package export reconciles VirtualMachineVolumeExports: an exporter pod converts a PVC's disk
// to qcow2 (or raw) and uploads it to the bundled object store or an external S3 store; the
// export's download Secret gets a presigned HTTP GET URL that downloads it (download.go). A PVC in use by a running pod is
// never read live: it is snapshotted, the snapshot restored to a temporary PVC, and that is
// exported.
package export

import (
	"context"
	"errors"
	"net/http"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/status"
	"github.com/diskpipe/diskpipe/objectstore"
)

// Finalizer holds an export until its pods and temporary volumes are gone, and, with
// retainPolicy Delete, its object.
const Finalizer = "diskpipe.io/export"

// LabelExport marks an export's children with its UID.
const LabelExport = "diskpipe.io/export"

// Options configure the export controller.
type Options struct {
	Pods importpod.Config
	// Store is the bundled object store, and StoreConfig how exporter pods reach it; nil
	// when the installation has none (exports then need spec.s3).
	Store       *objectstore.Client
	StoreConfig *objectstore.ClientConfig
	// Downloads presigns the download URLs of the bundled store's exports: a client of the
	// store's public endpoint (an Ingress), which users outside the cluster reach; nil uses
	// Store, whose in-cluster address works only inside the cluster.
	Downloads *objectstore.Client
	// SnapshotClassNamed is storage.SnapshotClasses.Named: what names the VolumeSnapshotClass
	// of a class's volumes before its annotation (CDI's StorageProfile); nil for none.
	SnapshotClassNamed func(context.Context, *storagev1.StorageClass) (*string, string, error)
}

// Reconciler reconciles VirtualMachineVolumeExports.
type Reconciler struct {
	client.Client
	// Fresh reads the reconciled object, from the apiserver when the cache may predate this
	// manager's last write.
	Fresh *owned.Fresh
	Pods  *importpod.Tracker
	Options
}

// Setup registers the controller.
func Setup(mgr ctrl.Manager, o Options) error {
	o.Pods.Defaults()
	r := &Reconciler{Client: mgr.GetClient(), Fresh: &owned.Fresh{Cache: mgr.GetClient(), API: mgr.GetAPIReader()}, Options: o,
		Pods: &importpod.Tracker{Client: mgr.GetClient(), Config: o.Pods, Events: mgr.GetEventRecorder("diskpipe-export"),
			HTTP: &http.Client{Timeout: 2 * time.Second}}}
	return ctrl.NewControllerManagedBy(mgr).Named("virtualmachinevolumeexport").For(&hypercloud.VirtualMachineVolumeExport{}).
		Owns(&corev1.Pod{}).Owns(&corev1.PersistentVolumeClaim{}).Owns(&snapshotv1.VolumeSnapshot{}).Complete(r)
}

// Reconcile brings one export forward.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, err error) {
	ex := &hypercloud.VirtualMachineVolumeExport{}
	if err := r.Fresh.Get(ctx, req.NamespacedName, ex); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !ex.DeletionTimestamp.IsZero() {
		if err := r.delete(ctx, ex); errors.Is(err, errDeleting) {
			return ctrl.Result{RequeueAfter: 10 * time.Second}, nil // the pod's end also wakes this
		} else if err != nil {
			return ctrl.Result{}, err
		}
		if controllerutil.RemoveFinalizer(ex, Finalizer) {
			return ctrl.Result{}, r.Update(ctx, ex)
		}
		return ctrl.Result{}, nil
	}
	if controllerutil.AddFinalizer(ex, Finalizer) {
		if err := r.Update(ctx, ex); err != nil {
			return ctrl.Result{}, err
		}
	}
	if ex.Status.Phase == common.PhaseReady && legacy(ex) {
		err := r.migrate(ctx, ex)
		r.Fresh.Saw(ex)
		return ctrl.Result{}, err // the annotation wakes the renewal
	}
	if ex.Status.Phase == common.PhaseReady && needsRenewal(ex) {
		done, err := r.renew(ctx, ex)
		r.Fresh.Saw(ex)
		if !done && err == nil {
			return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
		}
		return ctrl.Result{}, err
	}
	base := ex.DeepCopy()
	defer func() {
		if err == nil {
			ex.Status.ObservedGeneration = ex.Generation
		}
		if werr := status.Write(ctx, r.Client, base, ex, base.Status, ex.Status); werr != nil {
			err = werr
		}
		r.Fresh.Saw(ex)
	}()
	return r.reconcile(ctx, ex)
}

func tracked(ex *hypercloud.VirtualMachineVolumeExport) status.Work {
	st := &ex.Status
	return status.Work{Phase: &st.Phase, Conditions: &st.Conditions, Retries: &st.Retries, Transfer: &st.Transfer, Progress: &st.Progress}
}

func retryOf(r *common.RetryLimit) common.RetryLimit {
	if r == nil {
		return common.DefaultRetryLimit
	}
	return *r
}
