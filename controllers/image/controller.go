// Package image reconciles golden images — VirtualMachineImage and ImageTemplate — with one
// core: a golden PVC owned by the image, an importer pod that fills it, and a status computed
// from what the pod reports. When the spec gives no size, a probe pod reads the source's
// virtual size first. Disks are made from golden images by the disk package, which finds
// them with goldenimage.Lookup and asks for the golden snapshot with goldenimage.EnsureSnapshot.
package image

import (
	"context"
	"net/http"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
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
	"github.com/diskpipe/diskpipe/objectstore"
)

// Options configure the image controllers.
type Options struct {
	// Pods is how importer pods run.
	Pods importpod.Config
	// ObjectStore is the bundled object store that objectStore sources read; nil when the
	// installation has none.
	ObjectStore *objectstore.Client
	// ObjectStoreCA is the PEM file of the store's CA when it is not publicly trusted (an
	// external store in place of the bundled one); importers get it with the URL.
	ObjectStoreCA string
}

// Reconciler reconciles one kind of golden image.
type Reconciler struct {
	client.Client
	// Fresh reads the image itself, from the apiserver when the cache may predate this
	// manager's last write: a reconcile that acted on a stale copy could start an import that
	// already finished.
	Fresh         *owned.Fresh
	Pods          *importpod.Tracker
	ObjectStore   *objectstore.Client
	ObjectStoreCA string

	newObject func() client.Object
	newList   func() client.ObjectList
	adapt     func(client.Object) *goldenImage
}

// SetupVirtualMachineImage registers the VirtualMachineImage controller.
func SetupVirtualMachineImage(mgr ctrl.Manager, o Options) error {
	return setup(mgr, o, "virtualmachineimage", &hypercloud.VirtualMachineImage{},
		func() client.Object { return &hypercloud.VirtualMachineImage{} },
		func() client.ObjectList { return &hypercloud.VirtualMachineImageList{} }, fromVirtualMachineImage)
}

// SetupImageTemplate registers the ImageTemplate controller.
func SetupImageTemplate(mgr ctrl.Manager, o Options) error {
	return setup(mgr, o, "imagetemplate", &virtualmachine.ImageTemplate{},
		func() client.Object { return &virtualmachine.ImageTemplate{} },
		func() client.ObjectList { return &virtualmachine.ImageTemplateList{} }, fromImageTemplate)
}

func setup(mgr ctrl.Manager, o Options, name string, kind client.Object, newObject func() client.Object, newList func() client.ObjectList,
	adapt func(client.Object) *goldenImage) error {
	o.Pods.Defaults()
	r := &Reconciler{Client: mgr.GetClient(), Fresh: &owned.Fresh{Cache: mgr.GetClient(), API: mgr.GetAPIReader()}, ObjectStore: o.ObjectStore, ObjectStoreCA: o.ObjectStoreCA,
		Pods: &importpod.Tracker{Client: mgr.GetClient(), Config: o.Pods, Events: mgr.GetEventRecorder("diskpipe-" + name),
			HTTP: &http.Client{Timeout: 2 * time.Second}},
		newObject: newObject, newList: newList, adapt: adapt}
	// A scheduled image owns the images of its source's revisions (schedule.go).
	gvk, err := apiutil.GVKForObject(kind, mgr.GetScheme())
	if err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).Named(name).For(kind).Owns(newObject()).
		Owns(&corev1.Pod{}).Owns(&corev1.PersistentVolumeClaim{}).Owns(&snapshotv1.VolumeSnapshot{}).
		// A copy from another namespace hears of its clone source's pod (hostcopy.Wakes).
		Watches(&corev1.Pod{}, hostcopy.Wakes(gvk.Kind)).
		Owns(&diskvolume.DiskVolume{}).
		// A node that leaves or joins the cluster may hold a golden volume (checkGoldenNode).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.readyImages),
			builder.WithPredicates(predicate.Funcs{UpdateFunc: func(event.UpdateEvent) bool { return false }})).
		Complete(r)
}

// readyImages are the Ready images of the reconciler's kind, which a node's coming or going
// may concern.
func (r *Reconciler) readyImages(ctx context.Context, _ client.Object) []reconcile.Request {
	list := r.newList()
	if err := r.List(ctx, list); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	_ = meta.EachListItem(list, func(o runtime.Object) error {
		obj := o.(client.Object)
		if g := r.adapt(obj); g.status.Phase == common.PhaseReady && g.status.PVCName != "" {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(obj)})
		}
		return nil
	})
	return reqs
}

// Reconcile brings one image's import forward.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, err error) {
	obj := r.newObject()
	if err := r.Fresh.Get(ctx, req.NamespacedName, obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	g := r.adapt(obj)
	base := obj.DeepCopyObject().(client.Object)
	defer func() {
		if err == nil {
			g.status.ObservedGeneration = obj.GetGeneration()
		}
		if werr := status.Write(ctx, r.Client, base, obj, r.adapt(base).status, g.status); werr != nil {
			err = werr
		}
		r.Fresh.Saw(obj)
	}()
	if !obj.GetDeletionTimestamp().IsZero() {
		return r.delete(ctx, g)
	}
	if controllerutil.AddFinalizer(obj, goldenimage.Finalizer) {
		if err := r.Update(ctx, obj); err != nil {
			return ctrl.Result{}, err
		}
		base = obj.DeepCopyObject().(client.Object)
	}
	if g.schedule != nil {
		return r.reconcileSchedule(ctx, g)
	}
	var lost time.Duration
	if g.status.Replicas, lost, err = r.replicas(ctx, obj); err != nil {
		return ctrl.Result{}, err
	}
	res, err := r.reconcile(ctx, g)
	if err != nil {
		return res, err
	}
	next, err := r.keepReplicas(ctx, g)
	for _, n := range []time.Duration{next, lost} {
		if n > 0 && (res.RequeueAfter == 0 || n < res.RequeueAfter) {
			res.RequeueAfter = n
		}
	}
	return res, err
}
