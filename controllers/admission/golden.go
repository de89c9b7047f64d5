package admission

import (
	"context"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/diskpipe/diskpipe/controllers/image"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
)

// goldenGuard keeps golden PVCs read-only: a pod that mounts one is admitted only when
// diskpipe itself creates it (its importers fill them, its clone and export pods read them).
// A golden PVC is known by diskpipe's mark, which its namespace's owner cannot remove as they
// can its label; and a pod may not name a claim that does not exist yet under a golden image's
// name (vmim-..., imt-...), which the image would make later, under the pod.
type goldenGuard struct {
	reader  client.Reader
	decoder admission.Decoder
	self    string
}

func (h *goldenGuard) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.UserInfo.Username == h.self {
		return admission.Allowed("diskpipe's own pod")
	}
	pod := &corev1.Pod{}
	if err := h.decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim == nil {
			continue
		}
		pvc := &corev1.PersistentVolumeClaim{}
		err := h.reader.Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: v.PersistentVolumeClaim.ClaimName}, pvc)
		if apierrors.IsNotFound(err) {
			if name := v.PersistentVolumeClaim.ClaimName; image.GoldenName(name) {
				return denied("the PVC %s does not exist yet, and a claim of that name would hold a golden image of diskpipe, which is read-only: "+
					"create the PVC first, or name it otherwise", name)
			}
			continue
		}
		if err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
		if golden(pvc) {
			return denied("the PVC %s holds a golden image of diskpipe and is read-only: "+
				"make a disk from the image with a VirtualMachinePvc or a DiskVolume and mount that", pvc.Name)
		}
	}
	return admission.Allowed("")
}

// golden says whether pvc holds a golden image: labelled so, or made by diskpipe for an image.
func golden(pvc *corev1.PersistentVolumeClaim) bool {
	if pvc.Labels[image.LabelGolden] == "true" {
		return true
	}
	ref := metav1.GetControllerOf(pvc)
	return ref != nil && image.Kind(ref.Kind) && owned.Marked("PersistentVolumeClaim", pvc, ref.UID)
}
