package importpod

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// KubeVirt's VirtualMachineExport serves a VM's or a PVC's disks from a pod in the export's
// namespace, behind its Service virt-export-<name>, at
// https://virt-export-<name>.<namespace>.svc/volumes/<pvc>/disk.img[.gz]; the manifests it
// gives for making the VM again elsewhere name those URLs as DataVolumes' http sources. The
// Service's address is in the cluster's network, which importers may not reach, and cannot be
// allowed as such: a Service can be made to lead anywhere in the cluster. What the manager
// vouches for is narrower: the export server's own pod, in the export's namespace, controlled
// by the export that controls the Service the URL names. The importer dials that pod for the
// URL's host (contract.Pod.ConnectTo), checks its certificate against that host and sends the
// export's token as the URL's source says; it reaches nothing else so. A pod of the node's
// network (whose address is the node's) is never vouched for, nor an import that skips TLS
// verification (the image controller asks only for one that verifies): the address is learnt
// when the importer's pod is made, and should the export's pod go and its address pass to
// another pod, that pod holds no certificate for the export's name.

// exportHost matches the host of an export server's URL: the Service virt-export-<name> in a
// namespace, by its cluster-local name.
var exportHost = regexp.MustCompile(`^(virt-export-[a-z0-9]([-a-z0-9]*[a-z0-9])?)\.([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.svc(\.cluster\.local)?\.?$`)

const (
	// exportGroup is the API group of KubeVirt's VirtualMachineExport.
	exportGroup = "export.kubevirt.io"
	// exportServiceLabel is on an export server's pod, the selector of its Service.
	exportServiceLabel = "kubevirt.io.virt-export-service"
	// exportServerPort is where an export server listens (its Service's 443 leads there).
	exportServerPort = 8443
)

// ExportWait says why the KubeVirt export server a URL names cannot be read from yet.
type ExportWait struct{ Message string }

func (e *ExportWait) Error() string { return e.Message }

// ExportServer returns the contract.Pod.ConnectTo entry for rawURL when it names a KubeVirt
// export server ("host:443=<pod address>:<port>"), "" when it names none (it is then dialled
// under the usual rule). An *ExportWait says that the export exists but its server is not
// serving yet.
func ExportServer(ctx context.Context, c client.Reader, rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "https" || (u.Port() != "" && u.Port() != "443") {
		return "", nil
	}
	m := exportHost.FindStringSubmatch(strings.ToLower(u.Hostname()))
	if m == nil {
		return "", nil
	}
	service, namespace := m[1], m[3]
	svc := &corev1.Service{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: service}, svc); apierrors.IsNotFound(err) {
		return "", nil
	} else if err != nil {
		return "", err
	}
	owner := metav1.GetControllerOf(svc)
	if owner == nil || owner.Kind != "VirtualMachineExport" || !strings.HasPrefix(owner.APIVersion, exportGroup+"/") || len(svc.Spec.Selector) == 0 {
		return "", nil // a Service of the name that no export made: nothing to vouch for
	}
	export := &metav1.PartialObjectMetadata{}
	export.SetGroupVersionKind(schema.FromAPIVersionAndKind(owner.APIVersion, owner.Kind))
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: owner.Name}, export); apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
		return "", nil
	} else if err != nil {
		return "", fmt.Errorf("reading the VirtualMachineExport %s/%s: %w", namespace, owner.Name, err)
	}
	if export.UID != owner.UID {
		return "", nil
	}
	// KubeVirt names both after the export and leads 443 to the server's own port: anything
	// else is not its making.
	name := "virt-export-" + owner.Name
	port := false
	for _, p := range svc.Spec.Ports {
		port = port || (p.Port == 443 && p.TargetPort.IntValue() == exportServerPort)
	}
	if !port || svc.Name != name {
		return "", nil
	}
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods, client.InNamespace(namespace), client.MatchingLabels(svc.Spec.Selector)); err != nil {
		return "", err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if ref := metav1.GetControllerOf(p); ref != nil && ref.UID == export.UID && p.Name == name && p.DeletionTimestamp.IsZero() &&
			!p.Spec.HostNetwork && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" && podReady(p) {
			return net.JoinHostPort(u.Hostname(), "443") + "=" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(exportServerPort)), nil
		}
	}
	return "", &ExportWait{fmt.Sprintf("the VirtualMachineExport %s/%s has no export server ready yet (its pod starts once its source may be read: a VM stopped, its disks populated)",
		namespace, owner.Name)}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
