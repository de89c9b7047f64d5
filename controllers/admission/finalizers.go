package admission

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/export"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
)

// FinalizerPolicyName names the MutatingAdmissionPolicy that gives new images and exports
// their controller's finalizer, and its binding.
const FinalizerPolicyName = "diskpipe-finalizers"

// finalizers is the finalizer each kind's controller puts on every object of the kind, by
// group and resource.
var finalizers = map[string]map[string]string{
	hypercloud.GroupVersion.Group: {
		"virtualmachineimages":        goldenimage.Finalizer,
		"virtualmachinevolumeexports": export.Finalizer,
	},
	virtualmachine.GroupVersion.Group: {"imagetemplates": goldenimage.Finalizer},
}

// FinalizerPolicy is a MutatingAdmissionPolicy (admissionregistration.k8s.io/v1, Kubernetes
// 1.36 and later) that puts the controller's finalizer on an image or export as it is created,
// inside the apiserver. The controllers add it themselves when it is missing (an older cluster,
// or an object made before the policy), so the policy only saves each new object one write of
// the whole object and one more reconcile; it fails open.
func FinalizerPolicy() *admissionregistrationv1.MutatingAdmissionPolicy {
	var rules []admissionregistrationv1.NamedRuleWithOperations
	var entries []string
	for _, group := range slices.Sorted(maps.Keys(finalizers)) {
		resources := slices.Sorted(maps.Keys(finalizers[group]))
		rules = append(rules, admissionregistrationv1.NamedRuleWithOperations{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{group}, APIVersions: []string{"v1alpha1"}, Resources: resources,
				Scope: ptr.To(admissionregistrationv1.NamespacedScope)}}})
		for _, r := range resources {
			entries = append(entries, fmt.Sprintf("'%s/%s': '%s'", group, r, finalizers[group][r]))
		}
	}
	return &admissionregistrationv1.MutatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingAdmissionPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: FinalizerPolicyName},
		Spec: admissionregistrationv1.MutatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: rules},
			Variables: []admissionregistrationv1.Variable{{Name: "finalizer",
				Expression: "{" + strings.Join(entries, ", ") + "}[request.resource.group + '/' + request.resource.resource]"}},
			Mutations: []admissionregistrationv1.Mutation{{PatchType: admissionregistrationv1.PatchTypeJSONPatch,
				JSONPatch: &admissionregistrationv1.JSONPatch{Expression: `!has(object.metadata.finalizers) ? ` +
					`[JSONPatch{op: "add", path: "/metadata/finalizers", value: [variables.finalizer]}] : ` +
					`variables.finalizer in object.metadata.finalizers ? [] : ` +
					`[JSONPatch{op: "add", path: "/metadata/finalizers/-", value: variables.finalizer}]`}}},
			FailurePolicy:      ptr.To(admissionregistrationv1.Ignore),
			ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
		},
	}
}

// FinalizerPolicyBinding binds FinalizerPolicy in every namespace.
func FinalizerPolicyBinding() *admissionregistrationv1.MutatingAdmissionPolicyBinding {
	return MutatingBinding(FinalizerPolicyName)
}

// MutatingBinding binds the MutatingAdmissionPolicy of that name, named alike, in every namespace.
func MutatingBinding(name string) *admissionregistrationv1.MutatingAdmissionPolicyBinding {
	return &admissionregistrationv1.MutatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingAdmissionPolicyBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{PolicyName: name},
	}
}
