package importpod

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestWithTransferOptions: an owner's transfer annotations set its pods' priority class and
// Multus networks; without them the pods are as built.
func TestWithTransferOptions(t *testing.T) {
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
		AnnTransferPriorityClass: "imports-low", AnnTransferNetworks: "storage-net"}}}
	pod := &corev1.Pod{Spec: corev1.PodSpec{PriorityClassName: "chart-default"}}
	WithTransferOptions(pod, owner)
	if pod.Spec.PriorityClassName != "imports-low" || pod.Annotations[AnnMultusNetworks] != "storage-net" {
		t.Errorf("got priority %q, networks %q", pod.Spec.PriorityClassName, pod.Annotations[AnnMultusNetworks])
	}
	plain := &corev1.Pod{Spec: corev1.PodSpec{PriorityClassName: "chart-default"}}
	WithTransferOptions(plain, &corev1.ConfigMap{})
	if plain.Spec.PriorityClassName != "chart-default" || plain.Annotations != nil {
		t.Errorf("an owner without the annotations changed the pod: %+v", plain)
	}
}
