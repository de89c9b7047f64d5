package cdi

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// KubeVirt makes some PVCs itself (a VM's persistent EFI and TPM state, the VM state of
// incremental backups, memory dumps) with the label cdi.kubevirt.io/applyStorageProfile, and
// leaves their access and volume modes to CDI's webhook, which completes them from the class's
// StorageProfile as it completes a DataVolume's claim: RWX Block on Ceph RBD, which the VM's
// live migration needs. diskpipe serves that webhook (ProfileHookConfiguration).

// Names of the StorageProfile webhook.
const (
	LabelApplyStorageProfile = "cdi.kubevirt.io/applyStorageProfile"
	PathProfileHook          = "/mutate-persistentvolumeclaims-storageprofile"
	ProfileHookName          = "diskpipe-cdi-storageprofile"
)

// RegisterProfileHook serves the StorageProfile webhook on mgr's webhook server; overhead is
// the filesystem's share kept in a Filesystem claim, as the DataVolumes' claims keep it.
func RegisterProfileHook(mgr ctrl.Manager, overhead importpod.FilesystemOverhead) {
	mgr.GetWebhookServer().Register(PathProfileHook, &webhook.Admission{Handler: &profileHook{
		c: mgr.GetClient(), decoder: admission.NewDecoder(mgr.GetScheme()), overhead: overhead}})
}

type profileHook struct {
	c        client.Reader
	decoder  admission.Decoder
	overhead importpod.FilesystemOverhead
}

func (h *profileHook) Handle(ctx context.Context, req admission.Request) admission.Response {
	pvc := &corev1.PersistentVolumeClaim{}
	if err := h.decoder.Decode(req, pvc); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if pvc.Labels[LabelApplyStorageProfile] != "true" {
		return admission.Allowed("")
	}
	if err := renderClaim(ctx, h.c, h.overhead, pvc); err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	raw, err := json.Marshal(pvc)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, raw)
}

// renderClaim completes pvc from its class's StorageProfile, as CDI renders a claim: the class
// KubeVirt's disks default to when it names none; volumeMode FromStorageProfile taken as none
// (the API refuses it, so it must be resolved here); the access modes of the first claim
// property set of its volume mode when it gives none, and the volume mode of the first set that
// has one of its access modes when it gives none (Filesystem when none does); then its size:
// a Filesystem claim keeps the filesystem's share besides what it asks for (overhead, as a
// DataVolume's claim does), and no claim is smaller than the profile's
// cdi.kubevirt.io/minimumSupportedPvcSize (storage that makes no smaller volume would never
// bind a VM's 10 Mi EFI or TPM state).
func renderClaim(ctx context.Context, c client.Reader, overhead importpod.FilesystemOverhead, pvc *corev1.PersistentVolumeClaim) error {
	if pvc.Spec.VolumeMode != nil && *pvc.Spec.VolumeMode == cdiv1.PersistentVolumeFromStorageProfile {
		pvc.Spec.VolumeMode = nil
	}
	defer func() {
		if pvc.Spec.VolumeMode == nil {
			pvc.Spec.VolumeMode = ptr.To(corev1.PersistentVolumeFilesystem)
		}
	}()
	if pvc.Spec.StorageClassName == nil {
		name, err := virtDefaultClass(ctx, c)
		if err != nil {
			return err
		}
		pvc.Spec.StorageClassName = name
	}
	class, err := storage.ClassName(ctx, c, pvc.Spec.StorageClassName)
	if err != nil {
		return err
	}
	p := &cdiv1.StorageProfile{}
	if class != "" {
		if err := c.Get(ctx, client.ObjectKey{Name: class}, p); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	sets := p.Status.ClaimPropertySets
	switch {
	case len(pvc.Spec.AccessModes) == 0:
		if set := claimPropertySet(sets, pvc.Spec.VolumeMode); set != nil {
			pvc.Spec.AccessModes = set.AccessModes
			if pvc.Spec.VolumeMode == nil {
				pvc.Spec.VolumeMode = set.VolumeMode
			}
		}
	case pvc.Spec.VolumeMode == nil:
		for _, set := range sets {
			if slices.ContainsFunc(set.AccessModes, func(m corev1.PersistentVolumeAccessMode) bool { return slices.Contains(pvc.Spec.AccessModes, m) }) {
				pvc.Spec.VolumeMode = set.VolumeMode
				break
			}
		}
	}
	size, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok {
		return nil
	}
	// A claim restored from a snapshot or cloned (KubeVirt's restore of a VM's state) is as
	// large as its source, which kept its share already: inflating it again would grow it with
	// every restore, past what strict drivers restore.
	restored := pvc.Spec.DataSource != nil || pvc.Spec.DataSourceRef != nil
	if !restored && ptr.Deref(pvc.Spec.VolumeMode, corev1.PersistentVolumeFilesystem) == corev1.PersistentVolumeFilesystem {
		size.Set(transfer.VolumeSizeFor(size.Value(), overhead.For(class)))
	}
	if least, err := resource.ParseQuantity(p.Annotations[AnnMinimumSize]); err == nil && size.Cmp(least) < 0 {
		size = least
	}
	pvc.Spec.Resources.Requests[corev1.ResourceStorage] = size
	return nil
}

// virtDefaultClass is the name of the class marked AnnDefaultVirtClass, nil when none is (the
// newest when several are, as Kubernetes picks among default classes).
func virtDefaultClass(ctx context.Context, c client.Reader) (*string, error) {
	list := &storagev1.StorageClassList{}
	if err := c.List(ctx, list); err != nil {
		return nil, err
	}
	var found *storagev1.StorageClass
	for i := range list.Items {
		sc := &list.Items[i]
		if sc.Annotations[AnnDefaultVirtClass] == "true" && (found == nil || sc.CreationTimestamp.After(found.CreationTimestamp.Time)) {
			found = sc
		}
	}
	if found == nil {
		return nil, nil
	}
	return &found.Name, nil
}

// ProfileHookConfiguration is the MutatingWebhookConfiguration that sends KubeVirt's labelled
// PVCs to the manager's Service (namespace/name) with caBundle (the chart's templates/cdi.yaml
// is the same, a test compares).
func ProfileHookConfiguration(namespace, service string, caBundle []byte) *admissionregistrationv1.MutatingWebhookConfiguration {
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: ProfileHookName},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name: "storageprofile.cdi.diskpipe.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: caBundle,
				Service: &admissionregistrationv1.ServiceReference{Namespace: namespace, Name: service, Path: ptr.To(PathProfileHook)}},
			Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"persistentvolumeclaims"},
					Scope: ptr.To(admissionregistrationv1.NamespacedScope)}}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{LabelApplyStorageProfile: "true"}},
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			ReinvocationPolicy:      ptr.To(admissionregistrationv1.NeverReinvocationPolicy),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](10),
		}},
	}
}
