// Package policy holds the admission policies of diskpipe's CDI API: what of CDI's API it does
// not serve, refused with the reason as the object is written (a ValidatingAdmissionPolicy),
// and the PVC made for an upload pointed at its staging image (a MutatingAdmissionPolicy).
// The chart installs both with cdi.compatibility.enabled; test/chart checks they are these.
package policy

import (
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/admission"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/internal/cdiclaims"
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
	{`!has(variables.spec.contentType) || variables.spec.contentType == 'kubevirt'`,
		"contentType archive is not served by diskpipe's CDI API: diskpipe imports disk images (contentType kubevirt) only"},
	{`!has(variables.spec.checkpoints) || size(variables.spec.checkpoints) == 0`,
		"checkpoints (multi-stage warm imports) are not served by diskpipe's CDI API"},
}

// dvInvalid is each rule CDI's DataVolume webhook holds a new DataVolume to, as a CEL condition
// on object.spec that holds when it is met (any other object, and an update, passes), and
// CDI's words for it: CDI refuses these as the DataVolume is created, so GitOps tools and UIs
// see the error, not a created object that fails. A DataVolume's spec cannot change after
// (dvImmutable).
var dvInvalid = []struct{ ok, reason string }{
	{`has(object.spec.pvc) || has(object.spec.storage)`, "Missing Data volume PVC: give spec.storage (or spec.pvc)"},
	{`!has(object.spec.pvc) || !has(object.spec.storage)`, "Duplicate storage definition, both target storage and target pvc defined"},
	{`!has(object.spec.pvc) || (has(object.spec.pvc.resources) && has(object.spec.pvc.resources.requests) && 'storage' in object.spec.pvc.resources.requests)`,
		"PVC size is missing: give spec.pvc.resources.requests.storage"},
	{`!has(object.spec.storage) || (has(object.spec.storage.resources) && has(object.spec.storage.resources.requests) && 'storage' in object.spec.storage.resources.requests) || ` +
		`has(object.spec.sourceRef) || (has(object.spec.source) && (has(object.spec.source.pvc) || has(object.spec.source.snapshot)))`,
		"Storage size is missing: give spec.storage.resources.requests.storage (only a clone, of a pvc, a snapshot or a sourceRef, takes its source's size)"},
	{`has(object.spec.source) || has(object.spec.sourceRef)`, "Data volume should have either Source or SourceRef"},
	{`!has(object.spec.source) || !has(object.spec.sourceRef)`, "Data volume should have either Source or SourceRef, not both"},
	{`!has(object.spec.source) || [` + sourceTypes + `].filter(x, x).size() == 1`,
		"Data volume should have exactly one source: one of http, s3, gcs, registry, pvc, upload, blank, imageio, vddk or snapshot"},
	{`!has(object.spec.sourceRef) || object.spec.sourceRef.kind == 'DataSource'`, "Unsupported sourceRef kind, currently only DataSource is supported"},
}

// sourceTypes are CEL conditions, one a DataVolume source type, that hold when it is set.
var sourceTypes = func() string {
	var has []string
	for _, t := range []string{"http", "s3", "gcs", "registry", "pvc", "upload", "blank", "imageio", "vddk", "snapshot"} {
		has = append(has, "has(object.spec.source."+t+")")
	}
	return strings.Join(has, ", ")
}()

// dvImmutable holds when a DataVolume's update leaves its spec as it was: CDI refuses any other.
// Sizes are compared as quantities, not as written: a client that reads the DataVolume and
// writes it back whole may write 2048Mi as 2Gi.
var dvImmutable = func() string {
	same := func(field string) string {
		return fmt.Sprintf("(has(object.spec.%[1]s) == has(oldObject.spec.%[1]s) && (!has(object.spec.%[1]s) || object.spec.%[1]s == oldObject.spec.%[1]s))", field)
	}
	size := func(of string) string {
		return fmt.Sprintf("(has(%[1]s.resources) && has(%[1]s.resources.requests) && 'storage' in %[1]s.resources.requests)", of)
	}
	target := func(field string) string {
		conds := []string{}
		for _, f := range []string{"accessModes", "storageClassName", "volumeMode", "dataSource", "dataSourceRef", "selector", "volumeName"} {
			conds = append(conds, same(field+"."+f))
		}
		n, o := "object.spec."+field, "oldObject.spec."+field
		conds = append(conds, fmt.Sprintf("%[1]s == %[2]s && (!%[1]s || quantity(string(%[3]s.resources.requests.storage)).compareTo(quantity(string(%[4]s.resources.requests.storage))) == 0)",
			size(n), size(o), n, o))
		return fmt.Sprintf("(has(object.spec.%[1]s) == has(oldObject.spec.%[1]s) && (!has(object.spec.%[1]s) || (%[2]s)))", field, strings.Join(conds, " && "))
	}
	conds := []string{}
	for _, f := range []string{"source", "sourceRef", "contentType", "preallocation", "priorityClassName", "checkpoints", "finalCheckpoint"} {
		conds = append(conds, same(f))
	}
	conds = append(conds, target("storage"), target("pvc"))
	return "oldObject == null || (" + strings.Join(conds, " && ") + ")"
}()

// configUnsupported is each field of the CDIConfig's spec that diskpipe does not read, and the
// reason; it is refused when set or changed (kept as it was, an update of other fields passes).
// spec.uploadProxyURLOverride and spec.filesystemOverhead are read (controllers/cdi), and the
// rest are of CDI's own pods.
var configUnsupported = []struct{ field, reason string }{
	{"podResourceRequirements", "CDIConfig spec.podResourceRequirements is not read by diskpipe: set importer.resources in diskpipe's chart values"},
	{"dataVolumeTTLSeconds", "CDIConfig spec.dataVolumeTTLSeconds is not served by diskpipe: a DataVolume is kept until it is deleted"},
}

// An upload into a PVC (virtctl image-upload pvc) is served on a PVC created for it, marked
// cdiclaims.AnnUploadTarget: UploadPVCPolicy gives it a dataSourceRef to its staging image as
// it is created, and CDIPolicy refuses a marked PVC without that reference (the mark added to an
// existing PVC, a data source of its own, or a cluster without MutatingAdmissionPolicy), an
// archive, and a name too long for its image, each with its reason.

// AnnUploadTarget marks a PVC made for an upload (cdiclaims.AnnUploadTarget).
const AnnUploadTarget = cdiclaims.AnnUploadTarget

// CDI's legacy import into a PVC (cdiclaims.AnnImportEndpoint on a plain PVC) is staged the
// same way, and held to the same rules: made with the annotation, of a source diskpipe serves.
const annImportEndpoint = cdiclaims.AnnImportEndpoint

var (
	uploadMarked   = "request.resource.resource == 'persistentvolumeclaims' && has(object.metadata.annotations) && '" + AnnUploadTarget + "' in object.metadata.annotations"
	uploadWasThere = "(oldObject != null && has(oldObject.metadata.annotations) && '" + AnnUploadTarget + "' in oldObject.metadata.annotations)"
	importMarked   = "request.resource.resource == 'persistentvolumeclaims' && has(object.metadata.annotations) && '" + annImportEndpoint + "' in object.metadata.annotations"
	importWasThere = "(oldObject != null && has(oldObject.metadata.annotations) && '" + annImportEndpoint + "' in oldObject.metadata.annotations)"
	// uploadTargetRef holds when the PVC's dataSourceRef is its staging image, as UploadPVCPolicy writes it.
	uploadTargetRef = "has(object.spec.dataSourceRef) && has(object.spec.dataSourceRef.apiGroup) && " +
		"object.spec.dataSourceRef.apiGroup == '" + hypercloud.GroupVersion.Group + "' && object.spec.dataSourceRef.kind == 'VirtualMachineImage' && " +
		"object.spec.dataSourceRef.name == '" + cdiclaims.UploadPVCImagePrefix + "' + object.metadata.name && !has(object.spec.dataSourceRef.namespace)"
	uploadTargets = []struct{ ok, reason string }{
		{uploadRule("(oldObject == null && " + uploadTargetRef + ")"),
			"uploads into a PVC (" + AnnUploadTarget + ") are served into a PVC made for the upload: let virtctl make it " +
				"(virtctl image-upload pvc NAME --size ...), without a data source of its own, or upload to a DataVolume " +
				"(virtctl image-upload dv NAME --size ...); an existing PVC cannot be marked for an upload"},
		{uploadRule("!('" + annContentType + "' in object.metadata.annotations) || object.metadata.annotations['" + annContentType + "'] == 'kubevirt'"),
			"archive uploads (" + annContentType + ": archive, virtctl image-upload --archive-path) are not served by diskpipe's CDI API: diskpipe takes disk images only"},
		{uploadRule(fmt.Sprintf("size(object.metadata.name) <= %d", cdiclaims.MaxUploadPVCName)),
			fmt.Sprintf("a PVC for an upload has a name of at most %d characters (its staging image is named %s<name>)", cdiclaims.MaxUploadPVCName, cdiclaims.UploadPVCImagePrefix)},
		{importRule("(oldObject == null && " + uploadTargetRef + ")"),
			"CDI's import into a PVC (" + annImportEndpoint + ") is served into a PVC made with the annotation, without a data source of its own: " +
				"make the PVC so, or import with a DataVolume; an existing PVC cannot be given an endpoint"},
		{importRule("!('" + cdiclaims.AnnImportSource + "' in object.metadata.annotations) || object.metadata.annotations['" + cdiclaims.AnnImportSource + "'] in ['http', 'registry', 's3']"),
			cdiclaims.AnnImportSource + " is served by diskpipe for http, registry and s3 (imageio, vddk, gcs and none are not): import those with a DataVolume of a source diskpipe serves, or a blank DataVolume"},
		{importRule("!('" + annContentType + "' in object.metadata.annotations) || object.metadata.annotations['" + annContentType + "'] == 'kubevirt'"),
			"archive imports (" + annContentType + ": archive) are not served by diskpipe's CDI API: diskpipe imports disk images only"},
		{importRule(fmt.Sprintf("size(object.metadata.name) <= %d", cdiclaims.MaxUploadPVCName)),
			fmt.Sprintf("a PVC for CDI's import has a name of at most %d characters (its staging image is named %s<name>)", cdiclaims.MaxUploadPVCName, cdiclaims.UploadPVCImagePrefix)},
		{"!(" + importWasThere + ") || " + importKept,
			"the annotations of CDI's import into a PVC (" + strings.Join(importAnnotations, ", ") + ") are fixed once it is made: delete the PVC and make it again"},
	}
)

// importAnnotations are what a PVC of CDI's legacy import says of its source, and importKept
// holds when an update leaves each of them as it was.
var (
	importAnnotations = []string{annImportEndpoint, cdiclaims.AnnImportSource, cdiclaims.AnnImportSecret, cdiclaims.AnnImportCertConfigMap, annContentType}
	importKept        = func() string {
		var conds []string
		for _, a := range importAnnotations {
			conds = append(conds, fmt.Sprintf("(('%[1]s' in object.metadata.annotations) == ('%[1]s' in oldObject.metadata.annotations) && "+
				"(!('%[1]s' in object.metadata.annotations) || object.metadata.annotations['%[1]s'] == oldObject.metadata.annotations['%[1]s']))", a))
		}
		return "(has(object.metadata.annotations) && " + strings.Join(conds, " && ") + ")"
	}()
)

// importRule is a condition that only a PVC newly given CDI's import endpoint must meet.
func importRule(cond string) string {
	return "!(" + importMarked + ") || " + importWasThere + " || " + cond
}

// uploadRule is a condition that only a PVC newly marked for an upload must meet (one marked
// before, or any other object, passes).
func uploadRule(cond string) string {
	return "!(" + uploadMarked + ") || " + uploadWasThere + " || " + cond
}

// annContentType is CDI's content type of a PVC: kubevirt (a disk image) or archive.
const annContentType = "cdi.kubevirt.io/storage.contentType"

// UploadPVCPolicyName names the MutatingAdmissionPolicy that points a PVC made for an upload
// at its staging image, and its binding.
const UploadPVCPolicyName = "diskpipe-cdi-upload-pvc"

// UploadPVCPolicy is a MutatingAdmissionPolicy (admissionregistration.k8s.io/v1, Kubernetes
// 1.36 and later) that gives a PVC created with cdiclaims.AnnUploadTarget (or CDI's legacy
// cdiclaims.AnnImportEndpoint) and no data source
// the dataSourceRef to its staging image, cdiclaims.UploadPVCImage(its name): the claim then
// stays Pending until diskpipe's populator has written the upload into it, as KubeVirt needs
// of a disk it boots. The chart installs it with cdi.compatibility.enabled.
func UploadPVCPolicy() *admissionregistrationv1.MutatingAdmissionPolicy {
	return &admissionregistrationv1.MutatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingAdmissionPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: UploadPVCPolicyName},
		Spec: admissionregistrationv1.MutatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"persistentvolumeclaims"},
						Scope: ptr.To(admissionregistrationv1.NamespacedScope)}}}}},
			MatchConditions: []admissionregistrationv1.MatchCondition{{Name: "upload-target",
				Expression: "has(object.metadata.annotations) && ('" + AnnUploadTarget + "' in object.metadata.annotations || '" + annImportEndpoint + "' in object.metadata.annotations) && " +
					"!has(object.spec.dataSourceRef) && !has(object.spec.dataSource) && object.metadata.name != ''"}},
			Mutations: []admissionregistrationv1.Mutation{{PatchType: admissionregistrationv1.PatchTypeApplyConfiguration,
				ApplyConfiguration: &admissionregistrationv1.ApplyConfiguration{Expression: "Object{spec: Object.spec{" +
					"dataSourceRef: Object.spec.dataSourceRef{apiGroup: '" + hypercloud.GroupVersion.Group + "', kind: 'VirtualMachineImage', " +
					"name: '" + cdiclaims.UploadPVCImagePrefix + "' + object.metadata.name}}}"}}},
			FailurePolicy:      ptr.To(admissionregistrationv1.Fail),
			ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
		},
	}
}

// UploadPVCPolicyBinding binds UploadPVCPolicy in every namespace.
func UploadPVCPolicyBinding() *admissionregistrationv1.MutatingAdmissionPolicyBinding {
	return admission.MutatingBinding(UploadPVCPolicyName)
}

// overheadOK holds when the CDIConfig's spec.filesystemOverhead, set or changed, is one diskpipe
// takes: each value at most importpod.MaxOverhead (the CRD's pattern has made each a number
// from 0 to 1).
var (
	overheadOK = fmt.Sprintf("request.resource.resource != 'cdiconfigs' || !has(variables.spec.filesystemOverhead) || "+
		"(oldObject != null && has(oldObject.spec.filesystemOverhead) && oldObject.spec.filesystemOverhead == variables.spec.filesystemOverhead) || "+
		"((!has(variables.spec.filesystemOverhead.global) || double(variables.spec.filesystemOverhead.global) <= %[1]g) && "+
		"(!has(variables.spec.filesystemOverhead.storageClass) || "+
		"variables.spec.filesystemOverhead.storageClass.all(c, double(variables.spec.filesystemOverhead.storageClass[c]) <= %[1]g)))",
		importpod.MaxOverhead)
	overheadRefused = fmt.Sprintf("CDIConfig spec.filesystemOverhead above %[1]g is not taken by diskpipe (a volume more than "+
		"twice its disk): give fractions from 0 to %[1]g (0.06 keeps 6 %% of a volume free)", importpod.MaxOverhead)
)

// proxyOK holds when the CDIConfig's spec.importProxy, set or changed, names proxies the pods
// take (importpod.Proxy.Validate): http or https URLs with a host and no user name or password.
var (
	proxyOK = "request.resource.resource != 'cdiconfigs' || !has(variables.spec.importProxy) || " +
		"(oldObject != null && has(oldObject.spec.importProxy) && oldObject.spec.importProxy == variables.spec.importProxy) || " +
		"(" + proxyURLOK("HTTPProxy") + " && " + proxyURLOK("HTTPSProxy") + ")"
	proxyRefused = "CDIConfig spec.importProxy HTTPProxy and HTTPSProxy must be http:// or https:// URLs with a host and no " +
		"user name or password: diskpipe gives the proxy to its importer pods in their environment, which anyone who can read " +
		"pods in the import's namespace sees; let the proxy admit the importers by their address instead"
)

func proxyURLOK(field string) string {
	return fmt.Sprintf("(!has(variables.spec.importProxy.%[1]s) || variables.spec.importProxy.%[1]s == '' || "+
		"(isURL(variables.spec.importProxy.%[1]s) && url(variables.spec.importProxy.%[1]s).getScheme() in ['http', 'https'] && "+
		"url(variables.spec.importProxy.%[1]s).getHostname() != '' && !variables.spec.importProxy.%[1]s.contains('@')))", field)
}

// configCondition holds when CDIConfig spec.field is unset, or as it was.
func configCondition(field string) string {
	return fmt.Sprintf("request.resource.resource != 'cdiconfigs' || !has(variables.spec.%[1]s) || "+
		"(oldObject != null && has(oldObject.spec.%[1]s) && oldObject.spec.%[1]s == variables.spec.%[1]s)", field)
}

// CDIPolicy is the ValidatingAdmissionPolicy that refuses, as the DataVolume or DataImportCron
// is created or changed, what diskpipe's CDI API cannot do, the CDIConfig settings it does not
// read, and a PVC marked for an upload that diskpipe cannot serve, each with its reason: no object is accepted only to fail or be ignored later. The chart installs it with cdi.compatibility.enabled.
func CDIPolicy() *admissionregistrationv1.ValidatingAdmissionPolicy {
	validations := make([]admissionregistrationv1.Validation, 0, len(cdiUnsupported)+len(configUnsupported))
	for _, u := range cdiUnsupported {
		validations = append(validations, admissionregistrationv1.Validation{Expression: u.ok, Message: u.reason,
			Reason: ptr.To(metav1.StatusReasonInvalid)})
	}
	for _, u := range dvInvalid {
		validations = append(validations, admissionregistrationv1.Validation{Expression: "request.resource.resource != 'datavolumes' || oldObject != null || (" + u.ok + ")",
			Message: u.reason, Reason: ptr.To(metav1.StatusReasonInvalid)})
	}
	validations = append(validations, admissionregistrationv1.Validation{Expression: "request.resource.resource != 'datavolumes' || " + dvImmutable,
		Message: "Cannot update DataVolume Spec: a DataVolume's spec is fixed once it is made (delete it and make it again)", Reason: ptr.To(metav1.StatusReasonInvalid)})
	for _, u := range configUnsupported {
		validations = append(validations, admissionregistrationv1.Validation{Expression: configCondition(u.field), Message: u.reason,
			Reason: ptr.To(metav1.StatusReasonInvalid)})
	}
	validations = append(validations, admissionregistrationv1.Validation{Expression: overheadOK, Message: overheadRefused,
		Reason: ptr.To(metav1.StatusReasonInvalid)})
	validations = append(validations, admissionregistrationv1.Validation{Expression: proxyOK, Message: proxyRefused,
		Reason: ptr.To(metav1.StatusReasonInvalid)})
	for _, u := range uploadTargets {
		validations = append(validations, admissionregistrationv1.Validation{Expression: u.ok, Message: u.reason,
			Reason: ptr.To(metav1.StatusReasonInvalid)})
	}
	rule := func(group, version string, scope admissionregistrationv1.ScopeType, resources ...string) admissionregistrationv1.NamedRuleWithOperations {
		return admissionregistrationv1.NamedRuleWithOperations{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
			Rule: admissionregistrationv1.Rule{APIGroups: []string{group}, APIVersions: []string{version},
				Resources: resources, Scope: ptr.To(scope)}}}
	}
	return &admissionregistrationv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: CDIPolicyName},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{
				rule("cdi.kubevirt.io", "v1beta1", admissionregistrationv1.NamespacedScope, "datavolumes", "dataimportcrons"),
				rule("cdi.kubevirt.io", "v1beta1", admissionregistrationv1.ClusterScope, "cdiconfigs"),
				rule("", "v1", admissionregistrationv1.NamespacedScope, "persistentvolumeclaims")}},
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
