// Package v1alpha1 is diskpipe's own upload.diskpipe.io/v1alpha1 API: UploadTokenRequest, how
// a user of any Kubernetes credential gets a short-lived token for the upload proxy.
//
// +kubebuilder:object:generate=true
// +groupName=upload.diskpipe.io
//
// The group is served by the manager as an aggregated API (uploadproxy.TokenAPI), not by a CRD:
// +kubebuilder:skip
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of these kinds.
	GroupVersion = schema.GroupVersion{Group: "upload.diskpipe.io", Version: "v1alpha1"}

	// SchemeBuilder registers the kinds with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &UploadTokenRequest{}, &UploadTokenRequestList{}, &ObjectStoreKeysRequest{}, &ObjectStoreKeysRequestList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
