package admission

import (
	"context"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/diskpipe/diskpipe/controllers/image"
)

// goldenGuard keeps golden PVCs read-only: a pod that mounts one is admitted only when
// diskpipe itself creates it (its importers fill them, its clone and export pods read them).
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
			continue
		}
		if err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
		if pvc.Labels[image.LabelGolden] == "true" {
			return denied("the PVC %s holds a golden image of diskpipe and is read-only: "+
				"make a disk from the image with a VirtualMachinePvc or a DiskVolume and mount that", pvc.Name)
		}
	}
	return admission.Allowed("")
}
