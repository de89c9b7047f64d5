package importpod

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// TestTimeline: a finished pod's Event tells each step after the pod's making, the source's
// bytes placed after its container's start, and the rate between the first and last byte;
// what the pod does not tell is left out, not made up.
func TestTimeline(t *testing.T) {
	made := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "copy-0", CreationTimestamp: metav1.NewTime(made)},
		Status: corev1.PodStatus{
			Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(made.Add(300 * time.Millisecond))}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "importer", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				StartedAt: metav1.NewTime(made.Add(2 * time.Second))}}}}}}
	res := &transfer.Result{BytesRead: 1 << 30, FirstByteSeconds: 0.5, LastByteSeconds: 5.5, FlushedSeconds: 6}
	got := Timeline("Clone", pod, res, made.Add(9*time.Second))
	want := "Clone of pod copy-0: pod made, scheduled +0.3s, running +2.0s, first byte +2.5s, last byte +7.5s, flushed +8.0s, result read +9.0s; 1073741824 bytes read at 215 MB/s"
	if got != want {
		t.Errorf("timeline\n got %s\nwant %s", got, want)
	}

	bare := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "blank-0", CreationTimestamp: metav1.NewTime(made)}}
	if got, want := Timeline("Import", bare, &transfer.Result{}, made.Add(time.Second)), "Import of pod blank-0: pod made, result read +1.0s"; got != want {
		t.Errorf("a pod that tells nothing\n got %s\nwant %s", got, want)
	}
}
