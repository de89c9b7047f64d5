// Package status is how controllers write their objects' status: the part of it a pod's work
// moves forward (Work: phase, Ready, retries, progress), and the one writer of a status
// (Write), with an optimistic lock.
package status

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
)

// Reasons of a work's Ready condition, set by the tracker of its pods (importpod.Tracker).
const (
	ReasonPending  = "Pending"
	ReasonRunning  = "Running"
	ReasonRetrying = "Retrying"
	// ReasonNameTaken: a pod of the work's name exists that diskpipe did not make for it.
	ReasonNameTaken = "NameTaken"
)

// Work is the part of an image's or a disk's status that an importer pod moves forward.
type Work struct {
	Phase      *common.Phase
	Conditions *[]metav1.Condition
	Retries    *int32
	Transfer   **common.Transfer
	Progress   *string
}

// SetReady sets the Ready condition.
func (s Work) SetReady(status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(s.Conditions, metav1.Condition{Type: common.ConditionReady, Status: status, Reason: reason, Message: msg})
}

// WaitForName has the work wait, Pending, while a child's name is held by an object being
// deleted (owned.ErrTerminating), and says so; false when err is no such error.
func (s Work) WaitForName(err error) (ctrl.Result, bool) {
	t := (*owned.ErrTerminating)(nil)
	if !errors.As(err, &t) {
		return ctrl.Result{}, false
	}
	if *s.Phase == "" {
		*s.Phase = common.PhasePending
	}
	s.SetReady(metav1.ConditionFalse, owned.ReasonNameTerminating, t.Error())
	return ctrl.Result{RequeueAfter: 5 * time.Second}, true
}

// SetFailed ends the work with reason.
func (s Work) SetFailed(reason, msg string) {
	*s.Phase = common.PhaseFailed
	s.SetReady(metav1.ConditionFalse, reason, msg)
}

// RetryWait is how long to wait before the next attempt, derived from when the last one
// failed: the backoff survives a restart of the manager.
func (s Work) RetryWait(now time.Time) time.Duration {
	c := meta.FindStatusCondition(*s.Conditions, common.ConditionReady)
	if c == nil || c.Reason != ReasonRetrying {
		return 0
	}
	return c.LastTransitionTime.Add(Backoff(*s.Retries)).Sub(now)
}

// Backoff is the wait before retry n: 2, 4, 8, ... seconds, at most 5 minutes.
func Backoff(n int32) time.Duration {
	return min(time.Second<<min(n, 9), 5*time.Minute)
}

// Write writes obj's status, read as base, when it changed (before and after are the
// two statuses): with an optimistic lock, so a status computed from a stale view is a
// conflict, retried, never a lost update. A deleted object needs none.
func Write(ctx context.Context, c client.Client, base, obj client.Object, before, after any) error {
	if equality.Semantic.DeepEqual(before, after) {
		return nil
	}
	if err := c.Status().Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("patching status: %w", err)
	}
	return nil
}
