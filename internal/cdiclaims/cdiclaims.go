// Package cdiclaims is the vocabulary of the claims CDI's uploads go into, as diskpipe serves
// CDI's API: the annotations virtctl reads and writes on them, and the image that stages an
// upload into a PVC. The CDI controllers, the admission webhooks and the upload proxy share it.
package cdiclaims

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
)

// The claim annotations of CDI's uploads.
const (
	// AnnPodPhase is the claim annotation virtctl waits on: Succeeded once the disk is made.
	AnnPodPhase = "cdi.kubevirt.io/storage.pod.phase"
	// AnnPodReady says the claim takes its upload now: virtctl image-upload pvc waits for "true".
	AnnPodReady = "cdi.kubevirt.io/storage.pod.ready"
	// AnnUploadTarget marks a PVC that virtctl image-upload pvc made to upload into.
	AnnUploadTarget = "cdi.kubevirt.io/storage.upload.target"
)

// An upload into a PVC (virtctl image-upload pvc) is staged by a VirtualMachineImage of source
// upload that the PVC controls, named UploadPVCImage(the PVC's name): admission gives a PVC
// marked AnnUploadTarget, as it is created, a dataSourceRef to that image
// (controllers/cdi/policy, UploadPVCPolicy), so that the PVC stays Pending, is filled by
// diskpipe's populator once the image is Ready, and is bound only then (controllers/cdi,
// UploadPVCReconciler).

// UploadPVCImage names the VirtualMachineImage that stages an upload into PVC name.
func UploadPVCImage(name string) string { return UploadPVCImagePrefix + name }

// UploadPVCImagePrefix is the prefix of UploadPVCImage's names, and MaxUploadPVCName the
// longest PVC name it takes (an image's name is at most 200 characters here, as
// a DataVolume's staging image's are).
const (
	UploadPVCImagePrefix = "pvc-"
	MaxUploadPVCName     = 200 - len(UploadPVCImagePrefix)
)

// The claim annotations of CDI's legacy import into a PVC: a plain PVC that names an
// endpoint, which CDI imports into (older tools and KubeVirt's own labs make them). Such a PVC
// is staged as an upload's is, by a VirtualMachineImage of the source the annotations name
// (UploadPVCImage), and says its state in AnnPodPhase.
const (
	AnnImportEndpoint      = "cdi.kubevirt.io/storage.import.endpoint"
	AnnImportSource        = "cdi.kubevirt.io/storage.import.source" // http (the default), registry or s3
	AnnImportSecret        = "cdi.kubevirt.io/storage.import.secretName"
	AnnImportCertConfigMap = "cdi.kubevirt.io/storage.import.certConfigMap"
)

// IsUploadPVC says whether pvc takes an upload: it is marked AnnUploadTarget and its data
// source is its staging image.
func IsUploadPVC(pvc *corev1.PersistentVolumeClaim) bool {
	_, marked := pvc.Annotations[AnnUploadTarget]
	return marked && staged(pvc)
}

// IsImportPVC says whether pvc takes CDI's legacy import: it names AnnImportEndpoint and its
// data source is its staging image.
func IsImportPVC(pvc *corev1.PersistentVolumeClaim) bool {
	_, marked := pvc.Annotations[AnnImportEndpoint]
	return marked && staged(pvc)
}

// staged says whether pvc's data source is its staging image, UploadPVCSource.
func staged(pvc *corev1.PersistentVolumeClaim) bool {
	ref, want := pvc.Spec.DataSourceRef, UploadPVCSource(pvc.Name)
	return ref != nil && ptr.Deref(ref.APIGroup, "") == *want.APIGroup && ref.Kind == want.Kind &&
		ref.Name == want.Name && ptr.Deref(ref.Namespace, pvc.Namespace) == pvc.Namespace
}

// UploadPVCSource is the data source of a PVC name made for an upload: its staging image.
func UploadPVCSource(name string) *corev1.TypedObjectReference {
	return &corev1.TypedObjectReference{APIGroup: ptr.To(hypercloud.GroupVersion.Group), Kind: "VirtualMachineImage", Name: UploadPVCImage(name)}
}
