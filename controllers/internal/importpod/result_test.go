package importpod

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// TestResultOfADeletedPod checks that a pod deleted mid-way is retried whatever its
// termination message says, and that a pod left alone keeps its permanent failure.
func TestResultOfADeletedPod(t *testing.T) {
	ended := func(msg string) *corev1.Pod {
		return &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: msg}}}}}}
	}
	malformed := `{"succeeded":false,"reason":"MalformedImage","message":"malformed image: unexpected EOF"}`

	if r := Result(ended(malformed)); r.Transient || r.Reason != transfer.ReasonMalformedImage {
		t.Errorf("a pod that ended by itself: %+v, want a permanent MalformedImage", r)
	}
	deleted := ended(malformed)
	deleted.DeletionTimestamp = &metav1.Time{}
	r := Result(deleted)
	if !r.Transient || r.Reason != transfer.ReasonMalformedImage || r.Message != "the pod was deleted before it finished: malformed image: unexpected EOF" {
		t.Errorf("a deleted pod: %+v, want a transient failure that says the pod was deleted", r)
	}
	done := ended(`{"succeeded":true}`)
	done.Status.Phase, done.Status.ContainerStatuses[0].State.Terminated.ExitCode = corev1.PodSucceeded, 0
	done.DeletionTimestamp = &metav1.Time{}
	if r := Result(done); !r.Succeeded {
		t.Errorf("a deleted pod that had finished: %+v, want its success", r)
	}
}

// TestResultOfAKilledSuccess: a pod killed after it wrote a successful result (exit -1 or 137,
// phase Failed) is retried with a reason. It used to be taken as a failure with no reason,
// which the status schema refuses: the chaos suite found an image stuck that way.
func TestResultOfAKilledSuccess(t *testing.T) {
	for _, code := range []int32{-1, 137} {
		pod := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Message: `{"succeeded":true,"format":"qcow2"}`}}}}}}
		if r := Result(pod); r.Succeeded || !r.Transient || r.Reason == "" {
			t.Errorf("exit code %d after a successful result: %+v, want a transient failure with a reason", code, r)
		}
	}
}
