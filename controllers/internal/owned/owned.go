// Package owned creates the children that controllers own.
package owned

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// ErrNotOwned means an object of the child's name exists and diskpipe did not make it for
// this owner (another controls it, or it carries no mark of diskpipe's).
type ErrNotOwned struct {
	Kind, Name string
	// Why, when set, says what the object is and what to do, instead of the default words.
	Why string
}

func (e *ErrNotOwned) Error() string {
	if e.Why != "" {
		return e.Why
	}
	return fmt.Sprintf("a %s named %s already exists and was not made by diskpipe for this object; delete it and diskpipe makes it again", e.Kind, e.Name)
}

// ErrTerminating means an object of the child's name, not made for this owner, is being
// deleted: most often the child of an earlier object of the owner's name, deleted and made
// again before all of its children were gone (a PVC a pod still uses, a snapshot a restore
// still reads). Not a failure: the child is made once the name is free (ReasonNameTerminating).
type ErrTerminating struct {
	Kind, Name string
	// Why, when set, says what the object is and what is awaited, instead of the default words.
	Why string
}

func (e *ErrTerminating) Error() string {
	if e.Why != "" {
		return e.Why
	}
	return fmt.Sprintf("a %s named %s, not made for this object (most often an earlier object's of the same name), is still being deleted: this object's is made once it is gone", e.Kind, e.Name)
}

// ReasonNameTerminating is the reason of the condition of an object that waits for an
// ErrTerminating's name.
const ReasonNameTerminating = "NameTerminating"

// Create creates obj controlled by owner unless it exists, and reads it into obj; an
// existing object that owner does not control is an *ErrNotOwned (an *ErrTerminating while it
// is being deleted). The cache is read first: most calls find the child made by an earlier
// pass, without a request to the apiserver.
func Create(ctx context.Context, c client.Client, owner, obj client.Object) error {
	_, err := Ensure(ctx, c, owner, obj)
	return err
}

// Put creates obj controlled by owner, or overwrites the one of its name, without reading it:
// for the Secrets the manager writes but may not read.
func Put(ctx context.Context, c client.Client, owner, obj client.Object) error {
	if err := controllerutil.SetControllerReference(owner, obj, c.Scheme()); err != nil {
		return err
	}
	if err := c.Create(ctx, obj); apierrors.IsAlreadyExists(err) {
		return c.Update(ctx, obj)
	} else if err != nil {
		return fmt.Errorf("creating %s: %w", obj.GetName(), err)
	}
	return nil
}

// CreateUnder is Create for a child that goes with owner's controller, above, as under CDI
// (a DataVolume's claim, made by its DiskVolume): the child is controlled by above, and owned
// by owner beside it; it is marked for owner, and Controls (mark.go) takes it as owner's.
func CreateUnder(ctx context.Context, c client.Client, owner client.Object, above metav1.OwnerReference, obj client.Object) error {
	if ctl := metav1.GetControllerOf(owner); ctl == nil || ctl.UID != above.UID {
		return fmt.Errorf("%s is not controlled by %s %s", owner.GetName(), above.Kind, above.Name)
	}
	if err := controllerutil.SetOwnerReference(owner, obj, c.Scheme(), controllerutil.WithBlockOwnerDeletion(true)); err != nil {
		return err
	}
	above.Controller, above.BlockOwnerDeletion = ptr.To(true), ptr.To(true)
	obj.SetOwnerReferences(append([]metav1.OwnerReference{above}, obj.GetOwnerReferences()...))
	_, err := ensure(ctx, c, owner, obj, MineUnder)
	return err
}

// Ensure is Create that also says whether this call created obj. A child it creates is
// marked as diskpipe's (mark.go); one it finds is taken only if it is Mine.
func Ensure(ctx context.Context, c client.Client, owner, obj client.Object) (bool, error) {
	if err := controllerutil.SetControllerReference(owner, obj, c.Scheme()); err != nil {
		return false, err
	}
	return ensure(ctx, c, owner, obj, Mine)
}

// ensure creates obj, its owners set, marked for owner, unless it exists; an existing obj is
// taken only if it is mine.
func ensure(ctx context.Context, c client.Client, owner, obj client.Object, mine func(string, client.Object, client.Object) bool) (bool, error) {
	gvk, err := c.GroupVersionKindFor(obj)
	if err != nil {
		return false, err
	}
	Stamp(gvk.Kind, obj, owner.GetUID())
	err = c.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	if apierrors.IsNotFound(err) {
		if err = c.Create(ctx, obj); apierrors.IsAlreadyExists(err) {
			err = c.Get(ctx, client.ObjectKeyFromObject(obj), obj) // the cache has not seen it yet: try again
		} else if err != nil {
			return false, fmt.Errorf("creating %s: %w", obj.GetName(), err)
		} else {
			return true, nil
		}
	}
	if err != nil {
		return false, err
	}
	if !mine(gvk.Kind, obj, owner) {
		if obj.GetDeletionTimestamp() != nil {
			return false, &ErrTerminating{Kind: gvk.Kind, Name: obj.GetName()}
		}
		return false, &ErrNotOwned{Kind: gvk.Kind, Name: obj.GetName()}
	}
	return false, nil
}
