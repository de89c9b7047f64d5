package importpod

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/internal/metrics"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/status"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// ProgressInterval is how often a running pod's progress is read.
const ProgressInterval = 5 * time.Second

// Tracker turns importer pods' state into status.
type Tracker struct {
	client.Client
	Config Config
	Events events.EventRecorder
	// HTTP reads importer metrics.
	HTTP *http.Client
}

// Start creates w's pod unless it exists (preparing its namespace, see Create); a pod this
// call creates counts as an attempt started.
func (t *Tracker) Start(ctx context.Context, w Work, pod *corev1.Pod) error {
	created, err := create(ctx, t.Client, t.Config, w.Obj, pod)
	if created {
		w.op().Started()
	}
	return err
}

// Work describes what a pod does for an object, for status and Events.
type Work struct {
	Obj    client.Object
	Status status.Work
	// Running is the phase while the pod runs (Importing, Cloning).
	Running common.Phase
	// Action names the work in Events ("Import", "Clone").
	Action string
	// Retry is how many transient failures are retried.
	Retry common.RetryLimit
	// Source labels the work's metrics: the image's source type, how a disk is made, or
	// where an export goes.
	Source string
}

func (w Work) op() metrics.Op {
	return metrics.Op{Operation: strings.ToLower(w.Action), Source: w.Source, Namespace: w.Obj.GetNamespace()}
}

// Observe moves status along with pod; done is called with a successful result, after which
// the pod is deleted (the next pass of the owner's reconcile takes the next step). When done
// fails the pod stays, and done is called again on the next pass.
func (t *Tracker) Observe(ctx context.Context, w Work, pod *corev1.Pod, done func(*transfer.Result) error) (ctrl.Result, error) {
	st := w.Status
	if !metav1.IsControlledBy(pod, w.Obj) || !Made(pod, w.Obj.GetUID()) {
		// Its status and result are whatever its maker wrote: none of them is believed.
		st.SetFailed(status.ReasonNameTaken, (&owned.ErrNotOwned{Kind: "Pod", Name: pod.Name}).Error())
		return ctrl.Result{}, nil
	}
	switch pod.Status.Phase {
	case corev1.PodRunning:
		*st.Phase = w.Running
		st.SetReady(metav1.ConditionFalse, status.ReasonRunning, "the pod "+pod.Name+" is running")
		if tr, err := t.readProgress(ctx, pod); err == nil {
			*st.Transfer, *st.Progress = tr, percent(tr)
		}
		return ctrl.Result{RequeueAfter: ProgressInterval}, nil
	case corev1.PodSucceeded, corev1.PodFailed:
		res := Result(pod)
		if pod.Status.Phase == corev1.PodSucceeded && res.Succeeded {
			if err := done(res); err != nil {
				return ctrl.Result{}, err
			}
			w.op().Succeeded(res.BytesWritten, res.DurationSeconds)
			t.Events.Eventf(w.Obj, nil, corev1.EventTypeNormal, ReasonTimeline, w.Action, "%s", Timeline(w.Action, pod, res, time.Now()))
			if tr := *st.Transfer; tr != nil {
				tr.BytesDone = tr.BytesTotal
			}
			return ctrl.Result{}, client.IgnoreNotFound(t.Delete(ctx, pod))
		}
		return t.failed(ctx, w, pod, res)
	default:
		if *st.Phase == "" {
			*st.Phase = common.PhasePending
		}
		st.SetReady(metav1.ConditionFalse, status.ReasonPending, "waiting for the pod "+pod.Name+" to start"+whyWaiting(pod))
		return ctrl.Result{}, nil
	}
}

// whyWaiting is what keeps a pending pod's containers from starting, as the kubelet says it
// (an image the node cannot pull, ErrImagePull, ImagePullBackOff: a container disk pulled by
// the node), or "" when it says nothing.
func whyWaiting(pod *corev1.Pod) string {
	for _, cs := range append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "PodInitializing" && w.Reason != "ContainerCreating" {
			return fmt.Sprintf(": its container %s is %s: %s", cs.Name, w.Reason, w.Message)
		}
	}
	return ""
}

// failed retries a transient failure with backoff, up to the retry limit, and ends the work
// on any other.
func (t *Tracker) failed(ctx context.Context, w Work, pod *corev1.Pod, res *transfer.Result) (ctrl.Result, error) {
	st := w.Status
	if res.Reason == "" { // the status schema needs a reason; Result always gives one
		res.Reason = transfer.ReasonInternal
	}
	if res.Transient && *st.Retries < int32(w.Retry) {
		*st.Retries++
		w.op().Retried(string(res.Reason))
		st.SetReady(metav1.ConditionFalse, status.ReasonRetrying,
			fmt.Sprintf("attempt %d failed (%s: %s); retrying", *st.Retries, res.Reason, res.Message))
		t.Events.Eventf(w.Obj, nil, corev1.EventTypeWarning, status.ReasonRetrying, w.Action, "Attempt %d failed: %s", *st.Retries, res.Message)
		return ctrl.Result{RequeueAfter: status.Backoff(*st.Retries)}, client.IgnoreNotFound(t.Delete(ctx, pod))
	}
	st.SetFailed(string(res.Reason), res.Message)
	w.op().Failed(string(res.Reason))
	t.Events.Eventf(w.Obj, nil, corev1.EventTypeWarning, string(res.Reason), w.Action, "%s failed: %s", w.Action, res.Message)
	return ctrl.Result{}, nil
}

// readProgress reads a running importer's progress metrics from its pod.
func (t *Tracker) readProgress(ctx context.Context, pod *corev1.Pod) (*common.Transfer, error) {
	if pod.Status.PodIP == "" {
		return nil, fmt.Errorf("pod %s has no IP yet", pod.Name)
	}
	url := "http://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(int(t.Config.MetricsPort))) + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := t.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	now := metav1.Now()
	tr := &common.Transfer{UpdateTime: &now}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		switch name {
		case "diskpipe_transfer_bytes_done":
			tr.BytesDone = int64(v)
		case "diskpipe_transfer_bytes_total":
			tr.BytesTotal = int64(v)
		case "diskpipe_transfer_bytes_per_second":
			tr.BytesPerSecond = int64(v)
		}
	}
	return tr, sc.Err()
}

// percent prints a transfer's progress, e.g. "42.5%".
func percent(t *common.Transfer) string {
	if t == nil || t.BytesTotal <= 0 {
		return ""
	}
	return fmt.Sprintf("%.1f%%", 100*float64(min(t.BytesDone, t.BytesTotal))/float64(t.BytesTotal))
}

// ReasonTimeline is the Event that tells where a finished pod's time went.
const ReasonTimeline = "Timeline"

// Timeline tells where the time of a pod's work went, from the pod's making to its result
// being read: waiting to be scheduled, the node starting it, the source's first byte, the
// bytes, the final flush. The pod's times are the apiserver's and its node's clocks, the
// result's are seconds after the command began (its container's start).
func Timeline(action string, pod *corev1.Pod, res *transfer.Result, now time.Time) string {
	made := pod.CreationTimestamp.Time
	at := func(what string, t time.Time) string { return fmt.Sprintf("%s +%.1fs", what, t.Sub(made).Seconds()) }
	parts := []string{"pod made"}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue && !c.LastTransitionTime.IsZero() {
			parts = append(parts, at("scheduled", c.LastTransitionTime.Time))
		}
	}
	var started time.Time
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil && !t.StartedAt.IsZero() {
			started = t.StartedAt.Time
		}
	}
	if !started.IsZero() {
		parts = append(parts, at("running", started))
		after := func(s float64) time.Time { return started.Add(time.Duration(s * float64(time.Second))) }
		if res.FirstByteSeconds > 0 {
			parts = append(parts, at("first byte", after(res.FirstByteSeconds)), at("last byte", after(res.LastByteSeconds)))
		}
		if res.FlushedSeconds > 0 {
			parts = append(parts, at("flushed", after(res.FlushedSeconds)))
		}
	}
	parts = append(parts, at("result read", now))
	msg := fmt.Sprintf("%s of pod %s: %s", action, pod.Name, strings.Join(parts, ", "))
	if span := res.LastByteSeconds - res.FirstByteSeconds; res.BytesRead > 0 && span > 0 {
		msg += fmt.Sprintf("; %d bytes read at %.0f MB/s", res.BytesRead, float64(res.BytesRead)/span/1e6)
	}
	return msg
}
