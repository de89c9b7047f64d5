package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// UploadTokenRequest asks for a token that lets its creator upload one image through the
// upload proxy. It is created (`kubectl create -f`, what `kubectl diskpipe upload` does) and
// answered, never stored: the apiserver authenticates the user with whatever credential their
// kubeconfig holds and forwards the request to diskpipe's aggregated API, which checks that
// the user may `create` the image's `upload` subresource and answers with the token in the
// status. There is nothing to get, list or delete.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced
type UploadTokenRequest struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   UploadTokenRequestSpec   `json:"spec"`
	Status UploadTokenRequestStatus `json:"status,omitempty"`
}

// UploadTokenRequestSpec names the image to upload to, in the request's namespace.
type UploadTokenRequestSpec struct {
	// kind is the image's kind.
	// +kubebuilder:validation:Enum=VirtualMachineImage;ImageTemplate
	Kind string `json:"kind"`
	// name is the image's name; its source must be `upload`.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// UploadTokenRequestStatus is the answer: the token and where to send the upload.
type UploadTokenRequestStatus struct {
	// token authorizes uploads to this one image (by its UID) until expirationTimestamp. Send
	// it to the upload proxy in the Diskpipe-Upload-Token header (or as Authorization: Bearer).
	// +optional
	Token string `json:"token,omitempty"`
	// expirationTimestamp is when the token stops being accepted for a new request.
	// +optional
	ExpirationTimestamp *metav1.Time `json:"expirationTimestamp,omitempty"`
	// path is the image's path on the upload proxy.
	// +optional
	Path string `json:"path,omitempty"`
	// url is the upload proxy's address outside the cluster, when the installation has one (an
	// Ingress, a load balancer). Without it, clients reach the proxy's Service through the
	// apiserver.
	// +optional
	URL string `json:"url,omitempty"`
	// service is the upload proxy's Service.
	// +optional
	Service *ProxyService `json:"service,omitempty"`
}

// ProxyService is the upload proxy's Service.
type ProxyService struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// port is the name of the Service's port.
	Port string `json:"port"`
	// scheme is http or https.
	Scheme string `json:"scheme"`
}

// +kubebuilder:object:root=true

// UploadTokenRequestList is a list of UploadTokenRequests (always empty: none is stored).
type UploadTokenRequestList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []UploadTokenRequest `json:"items"`
}
