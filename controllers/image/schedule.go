package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/controllers/internal/metrics"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/internal/contract"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// A scheduled image (spec.schedule) imports nothing itself. Its check pod (the importer with
// --check) reads the source's revision on the schedule; each new revision gets an image of its
// own, of the same kind and spec without the schedule, named after the scheduled image and the
// revision. The scheduled image's status names the newest Ready one (status.schedule.current,
// which goldenimage.Lookup follows), so new disks are made from it while disks already made keep theirs;
// the images of older revisions beyond spec.schedule.keep are deleted, each waiting for the
// clones that still read it.

// Labels and annotations of the images a schedule makes.
const (
	// LabelScheduledBy holds the UID of the scheduled image that made an image.
	LabelScheduledBy = "diskpipe.io/scheduled-by"
	// AnnotationRevision is the source's revision the check found, which the image imports.
	AnnotationRevision = "diskpipe.io/revision"
	// AnnotationFoundBy is the number of the check that last found the revision: images are
	// ordered by it, newest first.
	AnnotationFoundBy = "diskpipe.io/found-by-check"
)

// ConditionUpToDate says whether a scheduled image holds its source's newest revision.
const ConditionUpToDate = "UpToDate"

// Condition reasons of scheduled images.
const (
	reasonCurrent             = "Current"
	reasonWaitingForRevision  = "WaitingForRevision"
	reasonInvalidSchedule     = "InvalidSchedule"
	reasonSuspended           = "Suspended"
	reasonUnchanged           = "Unchanged"
	reasonUpdated             = "Updated"
	reasonUpdating            = "Updating"
	reasonUpdateFailed        = "UpdateFailed"
	reasonCheckTimedOut       = "CheckTimedOut"
	reasonWaitingForRevisions = "WaitingForRevisions"
)

const (
	// checkRetry is how soon a check that failed for a transient reason is made again, unless
	// the schedule comes sooner.
	checkRetry = time.Minute
	// checkTimeout ends a check whose pod has not finished, so that one stuck pod cannot stop
	// the schedule.
	checkTimeout = 10 * time.Minute
)

// revision is one image made by a schedule.
type revision struct {
	obj      client.Object
	status   *common.ImageStatus
	revision string
	foundBy  int64
}

func (v *revision) ready() bool {
	return v.status.Phase == common.PhaseReady && v.obj.GetDeletionTimestamp().IsZero()
}

func (r *Reconciler) reconcileSchedule(ctx context.Context, g *goldenImage) (ctrl.Result, error) {
	st := g.status
	st.SourceType = g.source.kind
	if st.Schedule == nil {
		st.Schedule = &common.ScheduleStatus{}
	}
	ss := st.Schedule
	sched, err := cron.ParseStandard(g.schedule.Cron)
	if err != nil {
		r.setUpToDate(g, metav1.ConditionFalse, reasonInvalidSchedule,
			fmt.Sprintf("spec.schedule.cron %q: %v (e.g. \"0 */6 * * *\", \"@daily\", \"@every 6h\")", g.schedule.Cron, err))
		ss.NextCheckTime = nil
		if ss.Current == "" {
			g.tracked().SetFailed(reasonInvalidSchedule, meta.FindStatusCondition(st.Conditions, ConditionUpToDate).Message)
		}
		return ctrl.Result{}, nil
	}
	revs, err := r.revisions(ctx, g)
	if err != nil {
		return ctrl.Result{}, err
	}
	r.follow(g, revs)
	if err := r.prune(ctx, g, revs); err != nil {
		return ctrl.Result{}, err
	}
	if ptr.Deref(g.schedule.Suspend, false) {
		ss.NextCheckTime = nil
		r.setUpToDate(g, metav1.ConditionFalse, reasonSuspended, "the schedule is suspended (spec.schedule.suspend): no check is made until it is cleared")
		return ctrl.Result{}, nil
	}
	since := g.obj.GetCreationTimestamp().Time
	if ss.UpToDateTime != nil {
		since = ss.UpToDateTime.Time
	}
	ss.OutOfDateTime = &metav1.Time{Time: sched.Next(sched.Next(since))}
	now := time.Now()
	if ss.LastCheckTime != nil && ss.NextCheckTime != nil {
		if want := sched.Next(ss.LastCheckTime.Time); want.Before(ss.NextCheckTime.Time) {
			ss.NextCheckTime = &metav1.Time{Time: want} // the schedule was changed to check sooner
		}
	}
	if ss.NextCheckTime != nil && now.Before(ss.NextCheckTime.Time) && ss.LastCheckTime != nil {
		return ctrl.Result{RequeueAfter: ss.NextCheckTime.Sub(now)}, nil
	}
	return r.check(ctx, g, revs, sched, now)
}

// revisions lists the images g's schedule made, newest first.
func (r *Reconciler) revisions(ctx context.Context, g *goldenImage) ([]*revision, error) {
	list := r.newList()
	if err := r.List(ctx, list, client.InNamespace(g.obj.GetNamespace()), client.MatchingLabels{LabelScheduledBy: string(g.obj.GetUID())}); err != nil {
		return nil, err
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return nil, err
	}
	var revs []*revision
	for _, it := range items {
		obj := it.(client.Object)
		v := &revision{obj: obj, status: r.adapt(obj).status, revision: obj.GetAnnotations()[AnnotationRevision]}
		v.foundBy, _ = strconv.ParseInt(obj.GetAnnotations()[AnnotationFoundBy], 10, 64)
		revs = append(revs, v)
	}
	slices.SortFunc(revs, func(a, b *revision) int {
		if a.foundBy != b.foundBy {
			return int(b.foundBy - a.foundBy)
		}
		return strings.Compare(a.obj.GetName(), b.obj.GetName())
	})
	return revs, nil
}

// follow points g at its newest Ready revision and shows the state of the newest one.
func (r *Reconciler) follow(g *goldenImage, revs []*revision) {
	st, ss := g.status, g.status.Schedule
	ss.Revisions = nil
	var current *revision
	for _, v := range revs {
		phase := v.status.Phase
		if !v.obj.GetDeletionTimestamp().IsZero() {
			phase = common.PhaseDeleting
		}
		if len(ss.Revisions) < 100 {
			ss.Revisions = append(ss.Revisions, common.ScheduledRevision{Image: v.obj.GetName(), Revision: v.revision, Phase: phase})
		}
		if current == nil && v.ready() {
			current = v
		}
	}
	var newest *revision
	if len(revs) > 0 {
		newest = revs[0]
		st.Progress, st.Transfer = newest.status.Progress, newest.status.Transfer
	}
	if current == nil {
		ss.Current, st.PVCName, st.CompletionTime = "", "", nil
		if newest == nil {
			st.Phase = common.PhasePending
			reason, msg := reasonWaitingForRevision, "no revision of the source is imported yet: the first check is under way"
			if up := meta.FindStatusCondition(st.Conditions, ConditionUpToDate); up != nil && up.Status == metav1.ConditionFalse {
				reason, msg = up.Reason, up.Message // the check failed
			}
			g.tracked().SetReady(metav1.ConditionFalse, reason, msg)
			return
		}
		st.Phase = newest.status.Phase
		if newest.status.Phase == "" || newest.status.Phase == common.PhaseReady { // Ready but being deleted
			st.Phase = common.PhasePending
		}
		reason, msg := reasonWaitingForRevision, "waiting for it to start"
		if c := meta.FindStatusCondition(newest.status.Conditions, common.ConditionReady); c != nil {
			reason, msg = c.Reason, c.Message
		}
		g.tracked().SetReady(metav1.ConditionFalse, reason, fmt.Sprintf("revision %s, in %s: %s", newest.revision, newest.obj.GetName(), msg))
		return
	}
	c := current.status
	ss.Current = current.obj.GetName()
	st.Phase, st.PVCName, st.Format, st.VirtualSize, st.StoredSize = common.PhaseReady, c.PVCName, c.Format, c.VirtualSize, c.StoredSize
	st.Digest, st.Revision, st.CompletionTime = c.Digest, current.revision, c.CompletionTime
	if current == newest {
		st.Progress, st.Transfer = c.Progress, nil
	}
	g.tracked().SetReady(metav1.ConditionTrue, reasonCurrent,
		fmt.Sprintf("new disks are made from %s, which holds revision %s", current.obj.GetName(), current.revision))
	up := meta.FindStatusCondition(st.Conditions, ConditionUpToDate)
	switch {
	case current == newest && up != nil && up.Reason == reasonUpdating:
		now := metav1.Now()
		ss.UpToDateTime = &now
		r.setUpToDate(g, metav1.ConditionTrue, reasonUpdated, fmt.Sprintf("revision %s is imported into %s and current", current.revision, current.obj.GetName()))
		r.Pods.Events.Eventf(g.obj, current.obj, corev1.EventTypeNormal, reasonUpdated, "Update", "New disks are made from %s (revision %s)", current.obj.GetName(), current.revision)
	case newest.status.Phase == common.PhaseFailed:
		r.setUpToDate(g, metav1.ConditionFalse, reasonUpdateFailed, fmt.Sprintf(
			"the import of revision %s into %s failed (%s); disks are still made from %s. Delete %s to import the revision again at the next check",
			newest.revision, newest.obj.GetName(), readyMessage(newest.status), current.obj.GetName(), newest.obj.GetName()))
	}
}

func readyMessage(st *common.ImageStatus) string {
	if c := meta.FindStatusCondition(st.Conditions, common.ConditionReady); c != nil {
		return c.Reason + ": " + c.Message
	}
	return "no reason given"
}

// prune deletes the Ready images beyond the newest keep, and the unfinished ones older than
// the current: each waits for the disks still being cloned from it.
func (r *Reconciler) prune(ctx context.Context, g *goldenImage, revs []*revision) error {
	keep := int32(common.DefaultKeep)
	if g.schedule.Keep != nil {
		keep = *g.schedule.Keep
	}
	ready, pastCurrent := int32(0), false
	for _, v := range revs {
		if !v.obj.GetDeletionTimestamp().IsZero() {
			continue
		}
		drop := pastCurrent && !v.ready()
		if v.ready() {
			ready++
			drop = ready > keep
			pastCurrent = true
		}
		if drop {
			if err := r.Delete(ctx, v.obj); client.IgnoreNotFound(err) != nil {
				return err
			}
			r.Pods.Events.Eventf(g.obj, v.obj, corev1.EventTypeNormal, "Pruned", "Prune", "Deleted %s (revision %s): schedule.keep is %d", v.obj.GetName(), v.revision, keep)
		}
	}
	return nil
}

// check runs the check pod and acts on the revision it found.
func (r *Reconciler) check(ctx context.Context, g *goldenImage, revs []*revision, sched cron.Schedule, now time.Time) (ctrl.Result, error) {
	ss := g.status.Schedule
	w := r.work(g, "Check")
	pod, err := r.ensurePod(ctx, g, importpod.Spec{Name: fmt.Sprintf("%s-check-%d", childName(g.prefix, g.obj.GetName()), ss.Checks), Import: contract.Import{Check: true}}, w)
	if res, handled := r.childError(g, err); handled {
		return res, nil
	} else if err != nil {
		return ctrl.Result{}, err
	}
	var res *transfer.Result
	switch pod.Status.Phase {
	case corev1.PodSucceeded, corev1.PodFailed:
		res = importpod.Result(pod)
		if pod.Status.Phase == corev1.PodFailed {
			res.Succeeded = false
		}
		if !res.Succeeded && res.Reason == "" { // a condition needs a reason; Result always gives one
			res.Reason = transfer.ReasonInternal
		}
	default:
		if age := now.Sub(pod.CreationTimestamp.Time); age < checkTimeout {
			return ctrl.Result{RequeueAfter: min(checkTimeout-age, 5*time.Second)}, nil
		}
		res = &transfer.Result{Reason: reasonCheckTimedOut, Transient: true, Message: fmt.Sprintf("the check's pod %s did not finish in %s", pod.Name, checkTimeout)}
	}
	// The check is over whatever follows: its objects go, and the next one is scheduled. A
	// presigned URL's Secret is named after its pod.
	for _, o := range []client.Object{pod, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}}} {
		if err := r.Delete(ctx, o); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, err
		}
	}
	op := metrics.Op{Operation: "check", Source: g.source.kind, Namespace: g.obj.GetNamespace()}
	next := sched.Next(now)
	ss.Checks++
	ss.LastCheckTime = &metav1.Time{Time: now}
	if res.Succeeded {
		op.Succeeded(0, res.DurationSeconds)
		if err := r.found(ctx, g, revs, res.Revision); err != nil {
			// The revision is found again by the next check, soon.
			ss.NextCheckTime = &metav1.Time{Time: earliest(next, now.Add(checkRetry))}
			r.setUpToDate(g, metav1.ConditionFalse, reasonUpdateFailed, fmt.Sprintf("revision %s was found, but: %v", res.Revision, err))
			return ctrl.Result{}, err
		}
	} else {
		op.Failed(string(res.Reason))
		keeps := "no revision is imported yet"
		if ss.Current != "" {
			keeps = "disks are still made from " + ss.Current
		}
		r.setUpToDate(g, metav1.ConditionFalse, string(res.Reason), fmt.Sprintf("the check failed: %s; %s", res.Message, keeps))
		r.Pods.Events.Eventf(g.obj, nil, corev1.EventTypeWarning, string(res.Reason), "Check", "Checking the source failed: %s", res.Message)
		if res.Transient {
			next = earliest(next, now.Add(checkRetry))
		}
	}
	ss.NextCheckTime = &metav1.Time{Time: next}
	return ctrl.Result{RequeueAfter: next.Sub(now)}, nil
}

// found acts on the revision a check found: the image that holds it is (or becomes) the
// newest, or one is made to import it.
func (r *Reconciler) found(ctx context.Context, g *goldenImage, revs []*revision, rev string) error {
	ss := g.status.Schedule
	for i, v := range revs {
		if v.revision != rev && v.status.Revision != rev {
			continue
		}
		if i > 0 && v.obj.GetDeletionTimestamp().IsZero() {
			// The source went back to an older revision that is still kept: it is the newest
			// again, and current once the next reconcile sees it.
			patch := client.MergeFrom(v.obj.DeepCopyObject().(client.Object))
			v.obj.SetAnnotations(mergeMaps(v.obj.GetAnnotations(), map[string]string{AnnotationFoundBy: strconv.FormatInt(ss.Checks, 10)}))
			if err := r.Patch(ctx, v.obj, patch); err != nil {
				return err
			}
		}
		switch {
		case v.obj.GetName() == ss.Current:
			now := metav1.Now()
			ss.UpToDateTime = &now
			r.setUpToDate(g, metav1.ConditionTrue, reasonUnchanged, fmt.Sprintf("the source is still at revision %s, in %s", rev, v.obj.GetName()))
		case v.status.Phase == common.PhaseFailed:
			r.setUpToDate(g, metav1.ConditionFalse, reasonUpdateFailed, fmt.Sprintf(
				"the import of revision %s into %s failed (%s); delete %s to import it again at the next check", rev, v.obj.GetName(), readyMessage(v.status), v.obj.GetName()))
		default:
			r.setUpToDate(g, metav1.ConditionFalse, reasonUpdating, fmt.Sprintf("revision %s is being imported into %s", rev, v.obj.GetName()))
		}
		return nil
	}
	name := revisionName(g.obj.GetName(), rev)
	img := g.revisionImage(pinnedDigest(g, rev))
	img.SetName(name)
	img.SetNamespace(g.obj.GetNamespace())
	img.SetLabels(mergeMaps(g.obj.GetLabels(), map[string]string{LabelScheduledBy: string(g.obj.GetUID())}))
	img.SetAnnotations(map[string]string{AnnotationRevision: rev, AnnotationFoundBy: strconv.FormatInt(ss.Checks, 10)})
	if err := owned.Create(ctx, r.Client, g.obj, img); err != nil {
		if notOwned := (*owned.ErrNotOwned)(nil); errors.As(err, &notOwned) {
			r.setUpToDate(g, metav1.ConditionFalse, "NameTaken", fmt.Sprintf("revision %s cannot be imported: %v", rev, err))
			return nil
		}
		return err
	}
	r.setUpToDate(g, metav1.ConditionFalse, reasonUpdating, fmt.Sprintf("revision %s is being imported into %s", rev, name))
	r.Pods.Events.Eventf(g.obj, img, corev1.EventTypeNormal, "NewRevision", "Check", "The source is at revision %s: importing it into %s", rev, name)
	return nil
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func (r *Reconciler) setUpToDate(g *goldenImage, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&g.status.Conditions, metav1.Condition{Type: ConditionUpToDate, Status: status, Reason: reason, Message: msg})
}

// pinnedDigest is the digest a registry source is read by, so that the image imports the
// revision its check found even if the tag moves on.
func pinnedDigest(g *goldenImage, rev string) string {
	if g.source.kind == "registry" && strings.HasPrefix(rev, "sha256:") {
		return rev
	}
	return ""
}

// pinRegistry points a docker:// source at digest, in place of its tag.
func pinRegistry(src *common.RegistrySource, digest string) {
	const scheme = "docker://"
	if src == nil || digest == "" || !strings.HasPrefix(src.URL, scheme) {
		return
	}
	name := strings.TrimPrefix(src.URL, scheme)
	name, _, _ = strings.Cut(name, "@")
	if slash, colon := strings.LastIndex(name, "/"), strings.LastIndex(name, ":"); colon > slash {
		name = name[:colon] // the tag (a colon before the last slash is a registry's port)
	}
	src.URL = scheme + name + "@" + digest
}

// revisionName names the image of one revision: the scheduled image's name and a hash of the
// revision, within the 253 characters of a name.
func revisionName(name, rev string) string {
	sum := sha256.Sum256([]byte(rev))
	return name[:min(len(name), 253-11)] + "-" + hex.EncodeToString(sum[:])[:10]
}

func mergeMaps(a, b map[string]string) map[string]string {
	out := maps.Clone(a)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, b)
	return out
}

// deleteRevisions deletes the images a scheduled image made; it reports how many remain.
func (r *Reconciler) deleteRevisions(ctx context.Context, g *goldenImage) (int, error) {
	revs, err := r.revisions(ctx, g)
	if err != nil {
		return 0, err
	}
	for _, v := range revs {
		if v.obj.GetDeletionTimestamp().IsZero() {
			if err := r.Delete(ctx, v.obj); client.IgnoreNotFound(err) != nil {
				return 0, err
			}
		}
	}
	return len(revs), nil
}
