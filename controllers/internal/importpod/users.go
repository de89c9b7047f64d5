package importpod

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// UserOf is a pod of namespace ns that may be writing the PVC pvc: one not finished that
// mounts it other than read-only, and that diskpipe did not make for owner (its own copy or
// export pods, known by Made, never by a label a tenant can write). Nil when there is none. A
// disk copied or exported while a pod writes it is not a disk anyone can trust: the copy
// waits (CDI's CloneSourceInUse), the export reads a snapshot.
func UserOf(ctx context.Context, c client.Reader, ns, pvc string, owner types.UID) (*corev1.Pod, error) {
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || Made(p, owner) {
			continue
		}
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == pvc && !v.PersistentVolumeClaim.ReadOnly {
				return p, nil
			}
		}
	}
	return nil, nil
}
