package admission

import (
	"context"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/diskpipe/diskpipe/controllers/disk"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
)

// goldenGuard keeps golden PVCs, and their replicas on other nodes, read-only, and a disk's
// prime (the claim diskpipe fills before it hands the volume to the disk's own PVC) out of
// reach while it is written: a pod that mounts one is admitted only when diskpipe itself
// creates it (its importers fill them, its clone and export pods read them). A replica is known by its name alone (IsReplicaName).
// A golden PVC is known by its label, by its controller (an image), or by its name (vmim-...,
// imt-...): its namespace's owner may remove the first two, not rename it, so a claim of a
// golden image's name is one unless diskpipe made it for a disk. A pod may not name such a
// claim before it exists either: the image would make it later, under the pod.
type goldenGuard struct{ podHook }

// podHook is what the pods hooks share: the manager's cache, the apiserver to confirm an
// object the cache does not know yet (made a moment ago), and the manager's own user name,
// whose requests they let through.
type podHook struct {
	reader  client.Reader
	api     client.Reader
	decoder admission.Decoder
	self    string
}

// get reads key into obj from the cache and, when the cache does not know it and confirm,
// from the apiserver.
func (h podHook) get(ctx context.Context, key client.ObjectKey, obj client.Object, confirm bool) error {
	err := h.reader.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) && confirm && h.api != nil {
		err = h.api.Get(ctx, key, obj)
	}
	return err
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
		key := client.ObjectKey{Namespace: req.Namespace, Name: v.PersistentVolumeClaim.ClaimName}
		switch replica, err := goldenimage.IsReplicaName(ctx, h.reader, key.Namespace, key.Name); {
		case err != nil:
			return admission.Errored(http.StatusInternalServerError, err)
		case replica:
			return denied("the PVC %s is a replica of a golden image of diskpipe on a node, which later disks on that node are cloned from, and is read-only: "+
				"make a disk from the image with a VirtualMachinePvc or a DiskVolume and mount that", key.Name)
		}
		prime, isPrime := disk.PrimeOf(key.Name)
		pvc := &corev1.PersistentVolumeClaim{}
		err := h.get(ctx, key, pvc, goldenimage.IsPVCName(key.Name) || isPrime)
		if apierrors.IsNotFound(err) {
			if isPrime {
				return denied("the PVC %s does not exist yet, and a claim of that name would be a disk diskpipe is still writing, which nobody else may mount: "+
					"mount the disk's own PVC once it is made, or name the claim otherwise", key.Name)
			}
			if name := v.PersistentVolumeClaim.ClaimName; goldenimage.IsPVCName(name) {
				return denied("the PVC %s does not exist yet, and a claim of that name would hold a golden image of diskpipe, which is read-only: "+
					"create the PVC first, or name it otherwise", name)
			}
			continue
		}
		if err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
		if ref := metav1.GetControllerOf(pvc); isPrime && ref != nil && ref.UID == prime && owned.Marked("PersistentVolumeClaim", pvc, prime) {
			return denied("the PVC %s is the %s %s while diskpipe writes it, which nobody else may mount: mount the disk's own PVC, %s, once it is made",
				pvc.Name, ref.Kind, ref.Name, ref.Name)
		}
		if golden(pvc) {
			return denied("the PVC %s holds a golden image of diskpipe and is read-only: "+
				"make a disk from the image with a VirtualMachinePvc or a DiskVolume and mount that", pvc.Name)
		}
	}
	return admission.Allowed("")
}

// golden says whether pvc holds a golden image: labelled so, controlled by an image, or of a
// golden image's name and not made by diskpipe for a disk.
func golden(pvc *corev1.PersistentVolumeClaim) bool {
	ref := metav1.GetControllerOf(pvc)
	switch {
	case pvc.Labels[goldenimage.LabelGolden] == "true", ref != nil && goldenimage.IsKind(ref.Kind):
		return true
	case !goldenimage.IsPVCName(pvc.Name):
		return false
	}
	// A disk's claim is marked for the disk, which controls it or owns it beside its own
	// controller (a DataVolume's claim).
	return owned.MadeFor("PersistentVolumeClaim", pvc, "DiskVolume", "VirtualMachinePvc") == nil
}
