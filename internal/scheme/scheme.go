// Package scheme is the one scheme of every kind diskpipe's components read or write, built
// from apis/ and the API modules alone: a binary that needs a client (the manager, the upload
// proxy) links no reconciler for it.
package scheme

import (
	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	kubevirtv1 "kubevirt.io/api/core/v1"
	cdiv1beta1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	diskvolumev1alpha1 "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloudv1alpha1 "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	uploadv1alpha1 "github.com/diskpipe/diskpipe/apis/upload/v1alpha1"
	virtualmachinev1alpha1 "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
)

// New returns a scheme with every kind diskpipe reads or writes: Kubernetes' built-in
// kinds, diskpipe's groups, snapshot.storage.k8s.io/v1, kubevirt.io/v1 and cdi.kubevirt.io/v1beta1.
func New() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(hypercloudv1alpha1.AddToScheme(s))
	utilruntime.Must(virtualmachinev1alpha1.AddToScheme(s))
	utilruntime.Must(diskvolumev1alpha1.AddToScheme(s))
	utilruntime.Must(uploadv1alpha1.AddToScheme(s))
	utilruntime.Must(snapshotv1.AddToScheme(s))
	utilruntime.Must(kubevirtv1.AddToScheme(s))
	utilruntime.Must(cdiv1beta1.AddToScheme(s))
	return s
}
