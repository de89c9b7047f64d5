// Package disk reconciles VM disks — VirtualMachinePvc and DiskVolume — with one core: a PVC
// owned by the disk, made from a golden image by the best clone strategy the storage allows
// (CSI clone, a restore of the image's golden snapshot, or a host-assisted copy by an
// importer pod), from a VolumeSnapshot, or blank; a disk asked larger than its image has
// disk.img grown to the volume.
package disk

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/hostcopy"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/status"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
)

// Finalizer holds a disk until what it made outside its namespace (a clone source) is gone.
const Finalizer = "diskpipe.io/disk"

// LabelDisk marks a disk's children with its UID.
const LabelDisk = "diskpipe.io/disk"

// ClaimMadeFor is the UID of the disk diskpipe made pvc for, its own claim or its prime; ""
// when diskpipe made it for none. The mark (owned.Marked) proves it, whatever pvc's owners say
// now: Kubernetes' garbage collector removes the reference to a disk deleted on its own from a
// claim that has another owner (a DataVolume's).
func ClaimMadeFor(pvc *corev1.PersistentVolumeClaim) types.UID {
	uid := types.UID(pvc.Labels[LabelDisk])
	if uid == "" || !owned.Marked("PersistentVolumeClaim", pvc, uid) {
		return ""
	}
	return uid
}

// indexSource indexes disks by what they are made from: imageKey, or snapshotKey.
const indexSource = "diskpipe.io/source"

// Reconciler reconciles one kind of VM disk.
type Reconciler struct {
	client.Client
	// Fresh reads the reconciled object, from the apiserver when the cache may predate this
	// manager's last write.
	Fresh *owned.Fresh
	Pods  *importpod.Tracker
	// Strategies are the installation's clone strategy defaults.
	Strategies StrategyDefaults
	// Snapshots chooses the class of an image's golden VolumeSnapshot.
	Snapshots storage.SnapshotClasses

	newObject func() client.Object
	adapt     func(client.Object) *vmDisk
}

// Options configure the disk controllers.
type Options struct {
	Pods       importpod.Config
	Strategies StrategyDefaults
	// SnapshotClassNamed is storage.SnapshotClasses.Named: what names a class's
	// VolumeSnapshotClass before its annotation (CDI's StorageProfile); nil for none.
	SnapshotClassNamed func(context.Context, *storagev1.StorageClass) (*string, string, error)
}

// Setup registers the VirtualMachinePvc and DiskVolume controllers.
func Setup(mgr ctrl.Manager, o Options) error {
	pods := o.Pods
	pods.Defaults()
	for _, k := range []struct {
		name  string
		kind  client.Object
		list  func() client.ObjectList
		new   func() client.Object
		adapt func(client.Object) *vmDisk
	}{
		{"virtualmachinepvc", &hypercloud.VirtualMachinePvc{}, func() client.ObjectList { return &hypercloud.VirtualMachinePvcList{} },
			func() client.Object { return &hypercloud.VirtualMachinePvc{} }, fromVirtualMachinePvc},
		{"diskvolume", &diskvolume.DiskVolume{}, func() client.ObjectList { return &diskvolume.DiskVolumeList{} },
			func() client.Object { return &diskvolume.DiskVolume{} }, fromDiskVolume},
	} {
		adapt := k.adapt
		if err := mgr.GetFieldIndexer().IndexField(context.Background(), k.kind, indexSource, func(o client.Object) []string {
			switch d := adapt(o); {
			case d.image != nil:
				return []string{imageKey(d.image.Kind, d.imageNamespace(), string(d.image.Name))}
			case d.snapshot != "":
				return []string{snapshotKey(o.GetNamespace(), d.snapshot)}
			}
			return nil
		}); err != nil {
			return err
		}
		r := &Reconciler{Client: mgr.GetClient(), Fresh: &owned.Fresh{Cache: mgr.GetClient(), API: mgr.GetAPIReader()},
			Pods: &importpod.Tracker{Client: mgr.GetClient(), Config: pods, Events: mgr.GetEventRecorder("diskpipe-" + k.name),
				HTTP: &http.Client{Timeout: 2 * time.Second}},
			Strategies: o.Strategies, Snapshots: storage.SnapshotClasses{Reader: mgr.GetClient(), Named: o.SnapshotClassNamed},
			newObject: k.new, adapt: adapt}
		// A disk waiting for its image or snapshot is woken when that changes.
		toDisks := func(key func(client.Object) string) handler.EventHandler {
			return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, src client.Object) []reconcile.Request {
				list := k.list()
				if err := mgr.GetClient().List(ctx, list, client.MatchingFields{indexSource: key(src)}); err != nil {
					return nil
				}
				var reqs []reconcile.Request
				forEach(list, func(o client.Object) {
					reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(o)})
				})
				return reqs
			})
		}
		gvk, err := apiutil.GVKForObject(k.kind, mgr.GetScheme())
		if err != nil {
			return err
		}
		err = ctrl.NewControllerManagedBy(mgr).Named(k.name).For(k.kind).
			// A disk hears of its PVCs, its own claim too where that is controlled by the
			// disk's controller (claimController).
			Owns(&corev1.Pod{}).Watches(&corev1.PersistentVolumeClaim{}, handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), k.kind)).
			Watches(&corev1.Pod{}, hostcopy.Wakes(gvk.Kind)).
			Watches(&hypercloud.VirtualMachineImage{}, toDisks(func(o client.Object) string {
				return imageKey(goldenimage.KindVirtualMachineImage, o.GetNamespace(), o.GetName())
			})).
			Watches(&virtualmachine.ImageTemplate{}, toDisks(func(o client.Object) string {
				return imageKey(goldenimage.KindImageTemplate, o.GetNamespace(), o.GetName())
			})).
			Watches(&snapshotv1.VolumeSnapshot{}, toDisks(func(o client.Object) string { return snapshotKey(o.GetNamespace(), o.GetName()) })).
			// A deferred disk hears of the populator's disk that fills its claim (fillFailed):
			// that disk is controlled by the claim, whose name is the deferred disk's.
			Watches(&diskvolume.DiskVolume{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
				if ref := metav1.GetControllerOf(o); ref != nil && ref.Kind == "PersistentVolumeClaim" && o.GetName() == PopulateName(ref.UID) {
					return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: ref.Name}}}
				}
				return nil
			})).
			// A node that leaves the cluster, joins it or is labelled anew (checkNode): every
			// disk that is or was Ready looks again.
			Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
				list := k.list()
				if err := mgr.GetClient().List(ctx, list); err != nil {
					return nil
				}
				var reqs []reconcile.Request
				forEach(list, func(o client.Object) {
					if d := adapt(o); d.status.Phase == common.PhaseReady || nodeLost(d) {
						reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(o)})
					}
				})
				return reqs
			}), builder.WithPredicates(predicate.Funcs{
				// Every disk is looked at when the manager starts: the nodes it finds then are
				// not news. A node's labels change when it comes back (its CSI driver's topology
				// label is added once the driver registers); its status updates are not heard.
				CreateFunc: func(e event.CreateEvent) bool { return !e.IsInInitialList },
				UpdateFunc: func(e event.UpdateEvent) bool { return !maps.Equal(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()) },
			})).
			Complete(r)
		if err != nil {
			return fmt.Errorf("%s: %w", k.name, err)
		}
	}
	return nil
}

func forEach(list client.ObjectList, f func(client.Object)) {
	switch l := list.(type) {
	case *hypercloud.VirtualMachinePvcList:
		for i := range l.Items {
			f(&l.Items[i])
		}
	case *diskvolume.DiskVolumeList:
		for i := range l.Items {
			f(&l.Items[i])
		}
	}
}

// Reconcile brings one disk forward.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, err error) {
	obj := r.newObject()
	if err := r.Fresh.Get(ctx, req.NamespacedName, obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	d := r.adapt(obj)
	if !obj.GetDeletionTimestamp().IsZero() {
		if err := r.cleanup(ctx, d); err != nil {
			return ctrl.Result{}, err
		}
		if controllerutil.RemoveFinalizer(obj, Finalizer) {
			return ctrl.Result{}, r.Update(ctx, obj)
		}
		return ctrl.Result{}, nil
	}
	if d.image != nil && d.imageNamespace() != obj.GetNamespace() && controllerutil.AddFinalizer(obj, Finalizer) {
		if err := r.Update(ctx, obj); err != nil {
			return ctrl.Result{}, err
		}
	}
	base := obj.DeepCopyObject().(client.Object)
	defer func() {
		if err == nil {
			d.status.ObservedGeneration = obj.GetGeneration()
		}
		if werr := status.Write(ctx, r.Client, base, obj, r.adapt(base).status, d.status); werr != nil {
			err = werr
		}
		r.Fresh.Saw(obj)
	}()
	res, err := r.reconcile(ctx, d)
	return r.refused(d, res, err)
}
