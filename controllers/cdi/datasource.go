package cdi

import (
	"cmp"
	"context"
	"fmt"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Reasons of a DataSource's Ready condition.
const (
	ReasonReady    = "Ready"
	ReasonNoSource = "NoSource"
	ReasonNotFound = "NotFound"
	ReasonNotReady = "NotReady"
)

// SourceReconciler keeps a DataSource's status: the source it resolves to (a DataSource naming
// another is followed one step, as CDI does) and whether that source can be cloned now.
type SourceReconciler struct{ client.Client }

// Reconcile writes the DataSource's status.
func (r *SourceReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	ds := &cdiv1.DataSource{}
	if err := r.Get(ctx, req.NamespacedName, ds); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	base := ds.DeepCopy()
	src, err := resolve(ctx, r.Client, ds)
	if err != nil {
		return ctrl.Result{}, err
	}
	ready, reason, msg, err := r.ready(ctx, src)
	if err != nil {
		return ctrl.Result{}, err
	}
	ds.Status.Source = src
	cond := cdiv1.DataSourceCondition{Type: cdiv1.DataSourceReady, ConditionState: cdiv1.ConditionState{Status: ready, Reason: reason, Message: msg}}
	ds.Status.Conditions = []cdiv1.DataSourceCondition{cond}
	stamp(metav1.Now(), ds.Status.Conditions, base.Status.Conditions, func(c *cdiv1.DataSourceCondition) (string, *cdiv1.ConditionState) {
		return string(c.Type), &c.ConditionState
	})
	if equality.Semantic.DeepEqual(base.Status, ds.Status) {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{}, r.Patch(ctx, ds, client.MergeFrom(base)) // CDI's DataSource CRD has no status subresource
}

// resolve is the source ds stands for, with namespaces filled in.
func resolve(ctx context.Context, c client.Client, ds *cdiv1.DataSource) (cdiv1.DataSourceSource, error) {
	src := *ds.Spec.Source.DeepCopy()
	if ref := src.DataSource; ref != nil {
		target := &cdiv1.DataSource{}
		err := c.Get(ctx, client.ObjectKey{Namespace: cmp.Or(ref.Namespace, ds.Namespace), Name: ref.Name}, target)
		if apierrors.IsNotFound(err) {
			return src, nil // not ready, said by ready()
		} else if err != nil {
			return src, err
		}
		if target.Spec.Source.DataSource == nil {
			src = *target.Spec.Source.DeepCopy()
			ds = target
		}
	}
	if src.PVC != nil && src.PVC.Namespace == "" {
		src.PVC.Namespace = ds.Namespace
	}
	if src.Snapshot != nil && src.Snapshot.Namespace == "" {
		src.Snapshot.Namespace = ds.Namespace
	}
	return src, nil
}

// ready says whether src can be cloned now, and why not.
func (r *SourceReconciler) ready(ctx context.Context, src cdiv1.DataSourceSource) (corev1.ConditionStatus, string, string, error) {
	switch {
	case src.PVC != nil:
		pvc := &corev1.PersistentVolumeClaim{}
		err := r.Get(ctx, client.ObjectKey{Namespace: src.PVC.Namespace, Name: src.PVC.Name}, pvc)
		if apierrors.IsNotFound(err) {
			return corev1.ConditionFalse, ReasonNotFound, fmt.Sprintf("PVC %s/%s does not exist", src.PVC.Namespace, src.PVC.Name), nil
		} else if err != nil {
			return "", "", "", err
		}
		if pvc.Status.Phase != corev1.ClaimBound {
			return corev1.ConditionFalse, ReasonNotReady, fmt.Sprintf("PVC %s/%s is %s", pvc.Namespace, pvc.Name, pvc.Status.Phase), nil
		}
		if owner := metav1.GetControllerOf(pvc); owner != nil && owner.Kind == "DataVolume" {
			dv := &cdiv1.DataVolume{}
			if err := r.Get(ctx, client.ObjectKey{Namespace: pvc.Namespace, Name: owner.Name}, dv); err == nil && dv.UID == owner.UID && dv.Status.Phase != cdiv1.Succeeded {
				return corev1.ConditionFalse, ReasonNotReady, fmt.Sprintf("DataVolume %s/%s is %s", pvc.Namespace, dv.Name, dv.Status.Phase), nil
			}
		}
		return corev1.ConditionTrue, ReasonReady, "", nil
	case src.Snapshot != nil:
		snap := &snapshotv1.VolumeSnapshot{}
		err := r.Get(ctx, client.ObjectKey{Namespace: src.Snapshot.Namespace, Name: src.Snapshot.Name}, snap)
		if apierrors.IsNotFound(err) {
			return corev1.ConditionFalse, ReasonNotFound, fmt.Sprintf("VolumeSnapshot %s/%s does not exist", src.Snapshot.Namespace, src.Snapshot.Name), nil
		} else if err != nil {
			return "", "", "", err
		}
		if snap.Status == nil || !ptr.Deref(snap.Status.ReadyToUse, false) {
			return corev1.ConditionFalse, ReasonNotReady, fmt.Sprintf("VolumeSnapshot %s/%s is not ready to use", snap.Namespace, snap.Name), nil
		}
		return corev1.ConditionTrue, ReasonReady, "", nil
	default:
		return corev1.ConditionFalse, ReasonNoSource, "the DataSource names no PVC or VolumeSnapshot (or one that names none)", nil
	}
}

// indexSource indexes DataSources by what their spec names: "PersistentVolumeClaim/ns/name",
// "VolumeSnapshot/ns/name" or "DataSource/ns/name", so that a change to it wakes them.
const indexSource = "cdi.diskpipe.io/source"

func sourceKeys(o client.Object) []string {
	ds := o.(*cdiv1.DataSource)
	src := ds.Spec.Source
	switch {
	case src.PVC != nil:
		return []string{"PersistentVolumeClaim/" + cmp.Or(src.PVC.Namespace, ds.Namespace) + "/" + src.PVC.Name}
	case src.Snapshot != nil:
		return []string{"VolumeSnapshot/" + cmp.Or(src.Snapshot.Namespace, ds.Namespace) + "/" + src.Snapshot.Name}
	case src.DataSource != nil:
		return []string{"DataSource/" + cmp.Or(src.DataSource.Namespace, ds.Namespace) + "/" + src.DataSource.Name}
	}
	return nil
}

// setupDataSources registers the DataSource controller, woken by the PVCs, VolumeSnapshots and
// DataSources that DataSources name.
func setupDataSources(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &cdiv1.DataSource{}, indexSource, sourceKeys); err != nil {
		return err
	}
	r := &SourceReconciler{Client: mgr.GetClient()}
	return ctrl.NewControllerManagedBy(mgr).Named("datasource").For(&cdiv1.DataSource{}).
		Watches(&corev1.PersistentVolumeClaim{}, enqueue(r, &cdiv1.DataSourceList{}, indexSource, "PersistentVolumeClaim/")).
		// A DataVolume's claim, of its name, is ready once the DataVolume has Succeeded.
		Watches(&cdiv1.DataVolume{}, enqueue(r, &cdiv1.DataSourceList{}, indexSource, "PersistentVolumeClaim/")).
		Watches(&snapshotv1.VolumeSnapshot{}, enqueue(r, &cdiv1.DataSourceList{}, indexSource, "VolumeSnapshot/")).
		Watches(&cdiv1.DataSource{}, enqueue(r, &cdiv1.DataSourceList{}, indexSource, "DataSource/")).Complete(r)
}

// enqueue wakes the objects of list's kind whose index holds prefix + the namespace/name of
// the object that changed.
func enqueue(c client.Reader, list client.ObjectList, index, prefix string) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		l := list.DeepCopyObject().(client.ObjectList)
		if err := c.List(ctx, l, client.MatchingFields{index: prefix + o.GetNamespace() + "/" + o.GetName()}); err != nil {
			return nil
		}
		var reqs []reconcile.Request
		_ = meta.EachListItem(l, func(item runtime.Object) error {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(item.(client.Object))})
			return nil
		})
		return reqs
	})
}
