// Package admission holds diskpipe's validating webhooks, served by the manager:
//
//   - golden PVCs are read-only: only diskpipe itself (the manager's identity) may create pods
//     that mount a PVC labelled diskpipe.io/golden;
//   - diskpipe's pods are the manager's alone: only it may make or label a pod with
//     app.kubernetes.io/managed-by: diskpipe, which the NetworkPolicies admit, and nobody may
//     change what such a pod runs or exec into it (ownpods.go);
//   - a disk or image made from another namespace's image, disk or PVC needs the creating
//     user's right to read that source (a SubjectAccessReview as that user), unless the
//     image is labelled virtualmachine.kubesphere.io/image-public: "yes".
//
// Upload tokens are not issued here but by an aggregated API (uploadproxy.TokenAPI): a webhook
// learns its user from the request body, which anything that reaches the port can write.
package admission

import (
	"context"
	"fmt"
	"net/http"
	"slices"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
)

// Paths of the webhooks.
const (
	PathPods    = "/validate-pods"
	PathSources = "/validate-sources"
	PathVMs     = "/validate-virtualmachines"
	PathOwnPods = "/validate-diskpipe-pods"
)

// ConfigurationName is the name of the ValidatingWebhookConfiguration.
const ConfigurationName = "diskpipe-validating"

// Register serves the webhooks on mgr's webhook server; the sources webhook checks kinds
// besides the engine's (those Configuration was given). The manager's own user name, which
// alone may mount golden PVCs, is learnt from the apiserver (SelfSubjectReview).
func Register(ctx context.Context, mgr ctrl.Manager, allowHostDisk bool, kinds ...SourceKind) error {
	self, err := whoAmI(ctx, mgr)
	if err != nil {
		return fmt.Errorf("learning the manager's identity: %w", err)
	}
	dec := admission.NewDecoder(mgr.GetScheme())
	srv := mgr.GetWebhookServer()
	pods := podHook{reader: mgr.GetClient(), api: mgr.GetAPIReader(), decoder: dec, self: self}
	srv.Register(PathPods, &webhook.Admission{Handler: &goldenGuard{pods}})
	srv.Register(PathOwnPods, &webhook.Admission{Handler: &podGuard{pods}})
	sources := &sourceGuard{client: mgr.GetClient(), decoder: dec, self: self, kinds: map[string]SourceKind{}}
	for _, k := range append(slices.Clone(engineKinds), kinds...) {
		sources.kinds[k.Kind] = k
	}
	srv.Register(PathSources, &webhook.Admission{Handler: sources})
	srv.Register(PathVMs, &webhook.Admission{Handler: &vmGuard{sources: sources, decoder: dec, allowHostDisk: allowHostDisk}})
	return nil
}

func whoAmI(ctx context.Context, mgr ctrl.Manager) (string, error) {
	c, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		return "", err
	}
	r := &authenticationv1.SelfSubjectReview{}
	if err := c.Create(ctx, r); err != nil {
		return "", err
	}
	return r.Status.UserInfo.Username, nil
}

// crossNamespaceSource selects the disks, images and DataVolumes whose source names another
// namespace: the apiserver calls the sources webhook for those only, not for every one made.
const crossNamespaceSource = `(has(object.spec.source) && ['image', 'clone', 'disk', 'pvc', 'snapshot', 'dataSource'].exists(k, k in object.spec.source && ` +
	`has(object.spec.source[k].namespace) && object.spec.source[k].namespace != request.namespace)) || ` +
	`(has(object.spec.sourceRef) && has(object.spec.sourceRef.namespace) && object.spec.sourceRef.namespace != request.namespace)`

// Configuration is the ValidatingWebhookConfiguration that sends requests to the manager's
// Service (namespace/name) with caBundle; the sources webhook gets the engine's kinds and
// kinds. Pods are sent to the golden hook only when they mount a PVC, and only creations (a
// pod's volumes cannot change); to the own-pods hook when they carry diskpipe's label, and
// every exec and attach; neither hook sees diskpipe's own namespace or kube-system.
func Configuration(namespace, service string, caBundle []byte, kinds ...SourceKind) *admissionregistrationv1.ValidatingWebhookConfiguration {
	hook := func(name, path string, rules []admissionregistrationv1.RuleWithOperations, match []admissionregistrationv1.MatchCondition) admissionregistrationv1.ValidatingWebhook {
		return admissionregistrationv1.ValidatingWebhook{
			Name: name,
			ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: caBundle,
				Service: &admissionregistrationv1.ServiceReference{Namespace: namespace, Name: service, Path: ptr.To(path)}},
			Rules: rules, MatchConditions: match,
			FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
			SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			TimeoutSeconds:          ptr.To[int32](10),
		}
	}
	rule := func(group, version string, resources ...string) admissionregistrationv1.RuleWithOperations {
		return admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{group}, APIVersions: []string{version}, Resources: resources,
				Scope: ptr.To(admissionregistrationv1.NamespacedScope)}}
	}
	// Pods in diskpipe's own namespace are left out, so that the bundled store's pod (which
	// mounts its PVC) can start again while the manager is down.
	goldenPods := hook("golden-pvcs.diskpipe.io", PathPods, []admissionregistrationv1.RuleWithOperations{rule("", "v1", "pods")},
		[]admissionregistrationv1.MatchCondition{{Name: "mounts-a-pvc",
			Expression: "has(object.spec.volumes) && object.spec.volumes.exists(v, has(v.persistentVolumeClaim))"}})
	// VirtualMachines are checked on every creation and update: what they do is the manager's.
	vmRule := rule(virtualmachine.GroupVersion.Group, virtualmachine.GroupVersion.Version, "virtualmachines")
	vmRule.Operations = append(vmRule.Operations, admissionregistrationv1.Update)
	vms := hook("virtualmachines.diskpipe.io", PathVMs, []admissionregistrationv1.RuleWithOperations{vmRule}, nil)
	var sources []admissionregistrationv1.RuleWithOperations
	for _, k := range append(slices.Clone(engineKinds), kinds...) {
		r := rule(k.Resource.Group, k.Resource.Version, k.Resource.Resource)
		if k.Updates {
			r.Operations = append(r.Operations, admissionregistrationv1.Update)
		}
		sources = append(sources, r)
	}
	// Not diskpipe's own namespace (the store's pod mounts its PVC and must start while the
	// manager is down) nor kube-system (the cluster's own pods must start whatever diskpipe's
	// state).
	notOurs := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: []string{namespace, metav1.NamespaceSystem}}}}
	goldenPods.NamespaceSelector = notOurs
	// diskpipe's pods: made, relabelled or changed by anyone but the manager. Always failing
	// closed: the hook is called only for pods that carry diskpipe's label, which nobody else
	// has a use for.
	podRules := rule("", "v1", "pods")
	podRules.Operations = append(podRules.Operations, admissionregistrationv1.Update)
	ephemeral := rule("", "v1", "pods/ephemeralcontainers")
	ephemeral.Operations = []admissionregistrationv1.OperationType{admissionregistrationv1.Update}
	labelled := func(o string) string {
		return fmt.Sprintf("(%s != null && has(%s.metadata.labels) && '%s' in %s.metadata.labels && %s.metadata.labels['%s'] == '%s')",
			o, o, importpod.LabelManagedBy, o, o, importpod.LabelManagedBy, importpod.ManagedBy)
	}
	ownPods := hook("diskpipe-pods.diskpipe.io", PathOwnPods, []admissionregistrationv1.RuleWithOperations{podRules, ephemeral},
		[]admissionregistrationv1.MatchCondition{{Name: "carries-diskpipes-label", Expression: labelled("object") + " || " + labelled("oldObject")}})
	ownPods.NamespaceSelector = notOurs
	// exec and attach: their review names the pod, not its labels, so every one is sent; this
	// hook fails as the pods hook does.
	connect := rule("", "v1", "pods/exec", "pods/attach")
	connect.Operations = []admissionregistrationv1.OperationType{admissionregistrationv1.Connect}
	ownPodsExec := hook("diskpipe-pods-exec.diskpipe.io", PathOwnPods, []admissionregistrationv1.RuleWithOperations{connect}, nil)
	ownPodsExec.NamespaceSelector = notOurs
	return &admissionregistrationv1.ValidatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: ConfigurationName},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			goldenPods,
			ownPods,
			ownPodsExec,
			hook("sources.diskpipe.io", PathSources, sources, []admissionregistrationv1.MatchCondition{{Name: "source-in-another-namespace", Expression: crossNamespaceSource}}),
			vms,
		},
	}
}

// denied is a refusal with a reason for the user, as HTTP 403.
func denied(format string, args ...any) admission.Response {
	r := admission.Denied(fmt.Sprintf(format, args...))
	r.Result.Code = http.StatusForbidden
	return r
}
