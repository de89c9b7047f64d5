package admission

import (
	"context"
	"net/http"
	"slices"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
)

// podGuard keeps diskpipe's pods diskpipe's alone. NetworkPolicies know them by their labels
// (importpod.LabelManagedBy, importpod.LabelComponent): the bundled store admits importer and
// exporter pods of any namespace, a clone source admits importers. Those pods run in users'
// namespaces, whose owners write pods there, so a label alone proves nothing; this hook makes
// it proof: only the manager may create a pod that carries diskpipe's label or give it to a
// pod, and nobody else may change what a pod of diskpipe's is (its labels, its images, an
// ephemeral container) or run a command in it (exec, attach), which would make a tenant's code
// run as one of diskpipe's pods. Nor may anyone take its label off, which would leave the pod
// with diskpipe's mounts and open to all of that.
type podGuard struct{ podHook }

func (h *podGuard) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.UserInfo.Username == h.self {
		return admission.Allowed("diskpipe's own request")
	}
	if req.Operation == admissionv1.Connect {
		return h.connect(ctx, req)
	}
	pod, old := &corev1.Pod{}, &corev1.Pod{}
	if err := h.decoder.DecodeRaw(req.Object, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if req.Operation == admissionv1.Create {
		if importpod.Labelled(pod) {
			return denied("the label %s: %s is for pods diskpipe makes (NetworkPolicies admit them to the object store and to clone sources), "+
				"and only diskpipe's manager may create a pod that carries it: remove the label", importpod.LabelManagedBy, importpod.ManagedBy)
		}
		return admission.Allowed("")
	}
	if err := h.decoder.DecodeRaw(req.OldObject, old); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	switch {
	case !importpod.Labelled(old) && importpod.Labelled(pod):
		return denied("the label %s: %s is for pods diskpipe makes, and only diskpipe's manager may give it to a pod", importpod.LabelManagedBy, importpod.ManagedBy)
	case !importpod.Labelled(old):
		return admission.Allowed("")
	case !importpod.Labelled(pod):
		// Not a way out: a pod relabelled keeps diskpipe's mounts (a golden or prime claim),
		// which the tenant's changes to it would then reach.
		return denied("the pod %s is diskpipe's %s, and only diskpipe's manager may take its label %s off: delete the pod instead",
			pod.Name, component(old), importpod.LabelManagedBy)
	case old.Labels[importpod.LabelComponent] != pod.Labels[importpod.LabelComponent]:
		return denied("the pod %s is diskpipe's %s, and only diskpipe's manager may change its label %s", pod.Name, component(old), importpod.LabelComponent)
	case req.SubResource == "ephemeralcontainers" && len(pod.Spec.EphemeralContainers) > len(old.Spec.EphemeralContainers):
		return denied("the pod %s is diskpipe's %s, which runs diskpipe's code only: no ephemeral container may be added to it; read its logs instead", pod.Name, component(old))
	case !slices.Equal(images(old), images(pod)):
		return denied("the pod %s is diskpipe's %s, which runs diskpipe's code only: its images may not be changed", pod.Name, component(old))
	}
	return admission.Allowed("")
}

// connect refuses exec and attach into a pod of diskpipe's.
func (h *podGuard) connect(ctx context.Context, req admission.Request) admission.Response {
	pod := &corev1.Pod{}
	switch err := h.get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: req.Name}, pod, true); {
	case apierrors.IsNotFound(err):
		return admission.Allowed("")
	case err != nil:
		return admission.Errored(http.StatusInternalServerError, err)
	case importpod.Labelled(pod):
		return denied("the pod %s is diskpipe's %s, which runs diskpipe's code only: nobody may %s it; read its logs (kubectl logs) instead", pod.Name, component(pod), req.SubResource)
	}
	return admission.Allowed("")
}

func component(pod *corev1.Pod) string {
	if c := pod.Labels[importpod.LabelComponent]; c != "" {
		return c
	}
	return "pod"
}

// images are the images of every container of pod, in order.
func images(pod *corev1.Pod) []string {
	var out []string
	for _, c := range pod.Spec.InitContainers {
		out = append(out, c.Image)
	}
	for _, c := range pod.Spec.Containers {
		out = append(out, c.Image)
	}
	for _, c := range pod.Spec.EphemeralContainers {
		out = append(out, c.Image)
	}
	return out
}
