package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ObjectStoreKeysRequest asks for the keys of the request's namespace in diskpipe's bundled
// object store, to upload images with awscli. Like an UploadTokenRequest it is created and
// answered, never stored: diskpipe's aggregated API checks that the user may create (or
// update) the Secret, then writes the namespace's keys into it (accessKeyId, secretAccessKey,
// endpoint), where whoever may read Secrets in the namespace reads them. The keys reach the
// namespace's own buckets only, and those another namespace shares with it.
//
// +kubebuilder:object:root=true
type ObjectStoreKeysRequest struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec ObjectStoreKeysRequestSpec `json:"spec,omitempty"`
	// +optional
	Status ObjectStoreKeysRequestStatus `json:"status,omitempty"`
}

// ObjectStoreKeysRequestSpec says where to write the keys.
type ObjectStoreKeysRequestSpec struct {
	// secretName is the Secret the keys are written to (default diskpipe-objectstore-keys). An
	// existing Secret is updated only if diskpipe made it.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	SecretName string `json:"secretName,omitempty"`
}

// ObjectStoreKeysRequestStatus is the answer.
type ObjectStoreKeysRequestStatus struct {
	// secretName is the Secret that holds the keys.
	// +optional
	SecretName string `json:"secretName,omitempty"`
	// endpoint is the store's URL, for awscli's --endpoint-url.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
	// accessKeyId is the namespace's access key (the principal another namespace names in its
	// bucket policy to share a bucket with this one).
	// +optional
	AccessKeyID string `json:"accessKeyId,omitempty"`
}

// +kubebuilder:object:root=true

// ObjectStoreKeysRequestList is a list of ObjectStoreKeysRequests (always empty: none is
// stored).
type ObjectStoreKeysRequestList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ObjectStoreKeysRequest `json:"items"`
}
