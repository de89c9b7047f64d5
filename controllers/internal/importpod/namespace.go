package importpod

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/diskpipe/diskpipe/controllers/internal/owned"
)

// NetworkPolicyName is the policy PrepareNamespace gives each namespace diskpipe runs pods in;
// EgressPolicyName limits where its importer and exporter pods connect.
const (
	NetworkPolicyName = "diskpipe-pods"
	EgressPolicyName  = "diskpipe-pods-egress"
)

// AnnotationWrittenSpec is, on a NetworkPolicy PrepareNamespace made, the hash of the spec
// it wrote (writtenSpec).
const AnnotationWrittenSpec = "diskpipe.io/written-spec"

// PrepareNamespace makes, once per namespace and manager, what c's pods need there: the
// service account they run as (bound to nothing; its token is never mounted) and, with
// c.NetworkPolicy, a policy that admits only the manager to their metrics port and only
// diskpipe's importer pods to a clone source, and one that limits where they connect. A
// policy still as diskpipe wrote it (its spec hashes to its AnnotationWrittenSpec) is brought
// to what c asks now (an upgrade's new rule, an allowed destination added to the chart); one
// an administrator changed, or that an older diskpipe wrote without the annotation, is left
// as it is, so an administrator may tighten them.
func PrepareNamespace(ctx context.Context, cl client.Client, c Config, ns string) error {
	if c.prepared != nil {
		if _, done := c.prepared.Load(ns); done {
			return nil
		}
	}
	var objs []client.Object
	if c.ServiceAccountName != "" {
		objs = append(objs, &corev1.ServiceAccount{ObjectMeta: objectMeta(c.ServiceAccountName, ns), AutomountServiceAccountToken: ptr.To(false)})
	}
	if np := c.NetworkPolicy; np != nil {
		objs = append(objs, withWrittenSpec(c.networkPolicy(ns)), withWrittenSpec(c.egressPolicy(ns)))
	}
	again := false
	for _, o := range objs {
		err := cl.Create(ctx, o)
		if p, ok := o.(*networkingv1.NetworkPolicy); ok && apierrors.IsAlreadyExists(err) {
			// The pods run under the policy as it is while it cannot be brought up to date;
			// the next pod made here tries again. A conflict is another controller's refresh.
			if err := refreshPolicy(ctx, cl, p); err != nil && !apierrors.IsConflict(err) {
				log.FromContext(ctx).Error(err, "the NetworkPolicy of diskpipe's pods is left as it is", "namespace", ns, "name", p.Name)
				again = true
			}
			continue
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("preparing namespace %s for diskpipe's pods: %w", ns, err)
		}
	}
	if c.prepared != nil && !again {
		c.prepared.Store(ns, true)
	}
	return nil
}

// refreshPolicy brings the existing policy of want's name to want where it is still as
// diskpipe wrote it.
func refreshPolicy(ctx context.Context, cl client.Client, want *networkingv1.NetworkPolicy) error {
	have := &networkingv1.NetworkPolicy{}
	if err := cl.Get(ctx, client.ObjectKeyFromObject(want), have); err != nil {
		return client.IgnoreNotFound(err)
	}
	written := have.Annotations[AnnotationWrittenSpec]
	if written == "" || written != writtenSpec(have.Spec) || written == want.Annotations[AnnotationWrittenSpec] {
		return nil
	}
	have.Spec = want.Spec
	metav1.SetMetaDataAnnotation(&have.ObjectMeta, AnnotationWrittenSpec, want.Annotations[AnnotationWrittenSpec])
	return cl.Update(ctx, have)
}

// withWrittenSpec marks p with the hash of its spec, as PrepareNamespace writes it.
func withWrittenSpec(p *networkingv1.NetworkPolicy) *networkingv1.NetworkPolicy {
	metav1.SetMetaDataAnnotation(&p.ObjectMeta, AnnotationWrittenSpec, writtenSpec(p.Spec))
	return p
}

// writtenSpec is the hash of a policy's spec: every field diskpipe writes is set, so the
// apiserver's defaults change nothing and a stored spec hashes as it was written.
func writtenSpec(spec networkingv1.NetworkPolicySpec) string {
	b, err := json.Marshal(spec)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

// Forget makes the next PrepareNamespace of ns check again, after a pod could not be made
// there (its service account may have been deleted).
func (c Config) Forget(ns string) {
	if c.prepared != nil {
		c.prepared.Delete(ns)
	}
}

// objectMeta names what PrepareNamespace makes, labelled as diskpipe's.
func objectMeta(name, ns string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{LabelManagedBy: ManagedBy}}
}

func (c Config) networkPolicy(ns string) *networkingv1.NetworkPolicy {
	tcp := ptr.To(corev1.ProtocolTCP)
	port := func(p int32) []networkingv1.NetworkPolicyPort {
		return []networkingv1.NetworkPolicyPort{{Protocol: tcp, Port: ptr.To(intstr.FromInt32(p))}}
	}
	diskpipePods := &metav1.LabelSelector{MatchLabels: map[string]string{LabelManagedBy: ManagedBy}}
	return &networkingv1.NetworkPolicy{
		ObjectMeta: objectMeta(NetworkPolicyName, ns),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: *diskpipePods,
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{
				{Ports: port(c.MetricsPort), From: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: c.NetworkPolicy.ManagerNamespace}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: c.NetworkPolicy.ManagerLabels},
				}}},
				{Ports: port(ServePort), From: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{}, PodSelector: diskpipePods,
				}}},
			},
		},
	}
}

// egressPolicy lets importer and exporter pods reach DNS, the bundled store, clone sources,
// KubeVirt's export servers, the allowed destinations and the internet, and nothing else in the cluster: the second layer
// under the pods' own refusal (transfer.Egress), for a cluster whose network enforces it.
// Allowed host names cannot be written as a peer; an allowed in-cluster mirror is reached by
// the CIDR it is listed by.
func (c Config) egressPolicy(ns string) *networkingv1.NetworkPolicy {
	port := func(proto corev1.Protocol, p int32) networkingv1.NetworkPolicyPort {
		return networkingv1.NetworkPolicyPort{Protocol: ptr.To(proto), Port: ptr.To(intstr.FromInt32(p))}
	}
	rules := []networkingv1.NetworkPolicyEgressRule{
		{Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolUDP, 53), port(corev1.ProtocolTCP, 53)}},
		{Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, ServePort)}, To: []networkingv1.NetworkPolicyPeer{{
			NamespaceSelector: &metav1.LabelSelector{},
			PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{LabelManagedBy: ManagedBy, LabelComponent: ComponentCloneSource}},
		}}},
	}
	// KubeVirt's export servers, which the pods reach only where the manager vouched for one
	// (ExportServer).
	rules = append(rules, networkingv1.NetworkPolicyEgressRule{Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, exportServerPort)},
		To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: &metav1.LabelSelector{
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: exportServiceLabel, Operator: metav1.LabelSelectorOpExists}}}}}})
	if np := c.NetworkPolicy; len(np.StoreLabels) > 0 && np.StorePort != 0 {
		rules = append(rules, networkingv1.NetworkPolicyEgressRule{Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, np.StorePort)},
			To: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: np.ManagerNamespace}},
				PodSelector:       &metav1.LabelSelector{MatchLabels: np.StoreLabels},
			}}})
	}
	var allowed []networkingv1.NetworkPolicyPeer
	for _, d := range c.AllowedDestinations {
		if p, err := netip.ParsePrefix(d); err == nil {
			allowed = append(allowed, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: p.Masked().String()}})
		} else if a, err := netip.ParseAddr(d); err == nil {
			allowed = append(allowed, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: netip.PrefixFrom(a, a.BitLen()).String()}})
		}
	}
	// The internet: everything but the cluster's networks.
	internet := map[bool]*networkingv1.IPBlock{true: {CIDR: "0.0.0.0/0"}, false: {CIDR: "::/0"}}
	for _, v := range c.ClusterCIDRs {
		if p, err := netip.ParsePrefix(v); err == nil {
			b := internet[p.Addr().Is4()]
			b.Except = append(b.Except, p.Masked().String())
		}
	}
	allowed = append(allowed, networkingv1.NetworkPolicyPeer{IPBlock: internet[true]}, networkingv1.NetworkPolicyPeer{IPBlock: internet[false]})
	rules = append(rules, networkingv1.NetworkPolicyEgressRule{To: allowed})
	return &networkingv1.NetworkPolicy{
		ObjectMeta: objectMeta(EgressPolicyName, ns),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelManagedBy: ManagedBy},
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: LabelComponent, Operator: metav1.LabelSelectorOpIn, Values: []string{"importer", "exporter"}}}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress:      rules,
		},
	}
}

// Create creates a pod no object owns (a clone source in another namespace) after preparing
// its namespace; an existing pod of its name is taken as it. Owned pods go through
// Tracker.Start.
func Create(ctx context.Context, cl client.Client, c Config, pod *corev1.Pod) error {
	_, err := create(ctx, cl, c, nil, pod)
	return err
}

// Ensure creates pod, controlled by owner, after preparing its namespace, unless diskpipe made
// it already, and reads it into pod; a pod of its name that diskpipe did not make for owner is
// an *owned.ErrNotOwned. For a pod whose work no Tracker follows.
func Ensure(ctx context.Context, cl client.Client, c Config, owner client.Object, pod *corev1.Pod) error {
	_, err := create(ctx, cl, c, owner, pod)
	return err
}

// create creates pod, controlled by owner (nil: none), after preparing its namespace, and
// says whether this call created it.
func create(ctx context.Context, cl client.Client, c Config, owner client.Object, pod *corev1.Pod) (bool, error) {
	if err := PrepareNamespace(ctx, cl, c, pod.Namespace); err != nil {
		return false, err
	}
	var (
		created bool
		err     error
	)
	if owner != nil {
		WithTransferOptions(pod, owner)
		created, err = owned.Ensure(ctx, cl, owner, pod)
		if err == nil && !created && !Made(pod, owner.GetUID()) {
			err = &owned.ErrNotOwned{Kind: "Pod", Name: pod.Name}
		}
	} else if err = cl.Create(ctx, pod); err == nil {
		created = true
	} else if apierrors.IsAlreadyExists(err) {
		err = nil
	}
	if apierrors.IsForbidden(err) { // e.g. its service account was deleted
		c.Forget(pod.Namespace)
	}
	return created, err
}

// Annotations of an image, disk or export that shape its transfer pods: the pods' priority
// class, the secondary networks (Multus) they are attached to, as
// k8s.v1.cni.cncf.io/networks says it (a dedicated import network), and their service account.
// CDI's DataVolume passes its spec.priorityClassName, that annotation and its
// spec.serviceAccountName through them.
const (
	AnnTransferPriorityClass = "transfer.diskpipe.io/priority-class"
	AnnTransferNetworks      = "transfer.diskpipe.io/networks"
	// AnnTransferServiceAccount is the service account of the owner's namespace its pods run
	// as (CDI's DataVolume spec.serviceAccountName): its image pull secrets and the policies
	// bound to it apply; its token is never mounted, as diskpipe's code needs none.
	AnnTransferServiceAccount = "transfer.diskpipe.io/service-account"
	// AnnMultusNetworks is Multus's annotation of a pod's secondary networks.
	AnnMultusNetworks = "k8s.v1.cni.cncf.io/networks"
)

// WithTransferOptions gives pod what its owner's transfer annotations ask for. Whoever may
// write the owner may run pods of that priority class, on those networks and as that service
// account in its namespace anyway; the pods' own egress rules (internal/transfer) hold on every
// network, and a pod of another namespace (a clone source) never takes them.
func WithTransferOptions(pod *corev1.Pod, owner client.Object) {
	ann := owner.GetAnnotations()
	if v := ann[AnnTransferPriorityClass]; v != "" {
		pod.Spec.PriorityClassName = v
	}
	if v := ann[AnnTransferNetworks]; v != "" {
		metav1.SetMetaDataAnnotation(&pod.ObjectMeta, AnnMultusNetworks, v)
	}
	if v := ann[AnnTransferServiceAccount]; v != "" {
		pod.Spec.ServiceAccountName = v
	}
}
