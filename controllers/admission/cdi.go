package admission

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// CDIPolicyName names the ValidatingAdmissionPolicy that refuses the parts of CDI's API that
// diskpipe does not serve, and its binding.
const CDIPolicyName = "diskpipe-cdi-unsupported"

// cdiUnsupported is each part of a DataVolume's spec that diskpipe refuses, as a CEL condition
// that holds when the spec (variables.spec) is fine, and the reason given when it is not. A
// DataImportCron's template is checked alike: its imports would fail the same way.
var cdiUnsupported = []struct{ ok, reason string }{
	{`!has(variables.spec.source) || !has(variables.spec.source.gcs)`,
		"source gcs is not served by diskpipe's CDI API: import the object over http (a signed URL) " +
			"or through Cloud Storage's S3-compatible endpoint (source s3, https://storage.googleapis.com, HMAC keys)"},
	{`!has(variables.spec.source) || !has(variables.spec.source.imageio)`,
		"source imageio (oVirt) is not served by diskpipe's CDI API: export the disk from oVirt and import it over http or s3"},
	{`!has(variables.spec.source) || !has(variables.spec.source.vddk)`,
		"source vddk (VMware) is not served by diskpipe's CDI API: import the VM's VMDK or OVA over http or s3 " +
			"(diskpipe converts both)"},
	{`!has(variables.spec.source) || !has(variables.spec.source.registry) || !has(variables.spec.source.registry.imageStream)`,
		"source registry imageStream (OpenShift) is not served by diskpipe's CDI API: name the image by url (docker://...)"},
	{`!has(variables.spec.source) || !has(variables.spec.source.registry) || !has(variables.spec.source.registry.pullMethod) || ` +
		`variables.spec.source.registry.pullMethod == 'pod'`,
		"source registry pullMethod node is not served by diskpipe's CDI API: diskpipe's importer pulls the image itself " +
			"(pullMethod pod, the default)"},
	{`!has(variables.spec.contentType) || variables.spec.contentType == 'kubevirt'`,
		"contentType archive is not served by diskpipe's CDI API: diskpipe imports disk images (contentType kubevirt) only"},
	{`!has(variables.spec.checkpoints) || size(variables.spec.checkpoints) == 0`,
		"checkpoints (multi-stage warm imports) are not served by diskpipe's CDI API"},
}

// CDIPolicy is the ValidatingAdmissionPolicy that refuses, as the DataVolume or DataImportCron
// is created or changed, what diskpipe's CDI API cannot do, each with its reason: no object is
// accepted only to fail later. The chart installs it with cdi.compatibility.enabled.
func CDIPolicy() *admissionregistrationv1.ValidatingAdmissionPolicy {
	validations := make([]admissionregistrationv1.Validation, 0, len(cdiUnsupported))
	for _, u := range cdiUnsupported {
		validations = append(validations, admissionregistrationv1.Validation{Expression: u.ok, Message: u.reason,
			Reason: ptr.To(metav1.StatusReasonInvalid)})
	}
	return &admissionregistrationv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: CDIPolicyName},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{"cdi.kubevirt.io"}, APIVersions: []string{"v1beta1"},
						Resources: []string{"datavolumes", "dataimportcrons"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope)}}}}},
			Variables: []admissionregistrationv1.Variable{{Name: "spec",
				Expression: `request.resource.resource == 'dataimportcrons' ? object.spec.template.spec : object.spec`}},
			Validations:   validations,
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
		},
	}
}

// CDIPolicyBinding binds CDIPolicy in every namespace, denying what it refuses.
func CDIPolicyBinding() *admissionregistrationv1.ValidatingAdmissionPolicyBinding {
	return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: CDIPolicyName},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: CDIPolicyName,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}},
	}
}
