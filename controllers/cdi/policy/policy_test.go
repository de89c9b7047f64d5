package policy_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	cdipolicy "github.com/diskpipe/diskpipe/controllers/cdi/policy"
	"github.com/diskpipe/diskpipe/controllers/internal/ctrltest"
	"github.com/diskpipe/diskpipe/internal/cdiclaims"
	"github.com/diskpipe/diskpipe/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.RunTests(m, &env) }

// TestCDIPolicy: with CDI's CRDs (generated from CDI's API module) and the chart's
// ValidatingAdmissionPolicy, the apiserver refuses each DataVolume, and each DataImportCron
// template, that asks for what diskpipe does not serve, and each CDIConfig setting diskpipe
// does not read or cannot take, naming it and saying what to do instead; what diskpipe serves is accepted.
// No manager runs.
func TestCDIPolicy(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	g.Expect(env.InstallCDICRDs()).To(Succeed())
	ns, err := env.CreateNamespace(ctx, "cdi-policy")
	g.Expect(err).NotTo(HaveOccurred())
	// A CDIConfig that held a setting before the policy (CDI's, say) may keep it.
	legacy := &unstructured.Unstructured{}
	g.Expect(yaml.Unmarshal([]byte("spec: {filesystemOverhead: {global: '0.9'}, insecureRegistries: ['registry.local:5000']}"), &legacy.Object)).To(Succeed())
	legacy.SetAPIVersion("cdi.kubevirt.io/v1beta1")
	legacy.SetKind("CDIConfig")
	legacy.SetName("legacy-" + ns)
	g.Expect(env.Client.Create(ctx, legacy)).To(Succeed())
	policies := []client.Object{cdipolicy.CDIPolicy(), cdipolicy.CDIPolicyBinding(), cdipolicy.UploadPVCPolicy(), cdipolicy.UploadPVCPolicyBinding()}
	for _, o := range policies {
		g.Expect(env.Client.Create(ctx, o)).To(Succeed())
	}
	t.Cleanup(func() { // t.Context() is done by now
		for _, o := range slices.Backward(policies) {
			_ = env.Client.Delete(context.Background(), o)
		}
	})

	object := func(kind, name, spec string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		g.Expect(yaml.Unmarshal([]byte(spec), &u.Object)).To(Succeed())
		u.SetAPIVersion("cdi.kubevirt.io/v1beta1")
		u.SetKind(kind)
		u.SetNamespace(ns)
		u.SetName(name)
		return u
	}
	const storage = "storage: {resources: {requests: {storage: 1Gi}}}\n"
	dv := func(name, spec string) *unstructured.Unstructured {
		return object("DataVolume", name, "spec: {"+spec+", "+strings.TrimSuffix(storage, "\n")+"}")
	}
	raw := func(name, spec string) *unstructured.Unstructured {
		return object("DataVolume", name, "spec: {"+spec+"}")
	}
	config := func(name, spec string) *unstructured.Unstructured {
		u := object("CDIConfig", name+"-"+ns, "spec: "+spec)
		u.SetNamespace("")
		return u
	}
	pvc := func(name, annotations string) *unstructured.Unstructured {
		u := object("PersistentVolumeClaim", name, "metadata: {annotations: {"+annotations+"}}\nspec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}")
		u.SetAPIVersion("v1")
		u.SetName(name)
		u.SetNamespace(ns)
		return u
	}
	withSource := func(u *unstructured.Unstructured, image string) *unstructured.Unstructured {
		g.Expect(unstructured.SetNestedStringMap(u.Object, map[string]string{"apiGroup": "hypercloud.tmaxanc.com", "kind": "VirtualMachineImage", "name": image},
			"spec", "dataSourceRef")).To(Succeed())
		return u
	}
	cron := func(name, source string) *unstructured.Unstructured {
		return object("DataImportCron", name, fmt.Sprintf(`spec:
  schedule: "0 */12 * * *"
  managedDataSource: fedora
  template: {spec: {source: %s, %s}}`, source, strings.TrimSuffix(storage, "\n")))
	}

	// The apiserver applies a new policy within seconds: until then the first refusal passes.
	g.Eventually(func() error {
		return env.Client.Create(ctx, dv("probe", "source: {gcs: {url: 'https://storage.googleapis.com/b/o'}}"), client.DryRunAll)
	}).WithTimeout(time.Minute).WithPolling(200 * time.Millisecond).Should(MatchError(ContainSubstring("source gcs is not served")))
	g.Eventually(func() error {
		return env.Client.Create(ctx, pvc("probe", "cdi.kubevirt.io/storage.upload.target: ''"), client.DryRunAll)
	}).WithTimeout(time.Minute).WithPolling(200*time.Millisecond).Should(Succeed(), "the upload PVC policy gives the PVC its data source")

	for _, tc := range []struct {
		name   string
		obj    *unstructured.Unstructured
		refuse string // "" when accepted
	}{
		{"gcs", dv("gcs", "source: {gcs: {url: 'https://storage.googleapis.com/b/o'}}"),
			"source gcs is not served by diskpipe's CDI API: import the object over http (a signed URL) or through Cloud Storage's S3-compatible endpoint"},
		{"imageio", dv("imageio", "source: {imageio: {url: 'https://ovirt/ovirt-engine/api', secretRef: s, certConfigMap: c, diskId: d}}"),
			"source imageio (oVirt) is not served by diskpipe's CDI API: export the disk from oVirt and import it over http or s3"},
		{"vddk", dv("vddk", "source: {vddk: {url: 'https://vcenter', uuid: u, backingFile: f, thumbprint: t, secretRef: s}}"),
			"source vddk (VMware) is not served by diskpipe's CDI API: import the VM's VMDK or OVA over http or s3"},
		{"image stream", dv("stream", "source: {registry: {imageStream: fedora}}"),
			"source registry imageStream (OpenShift) is not served"},
		{"archive", dv("archive", "source: {http: {url: 'https://example.com/files.tar'}}, contentType: archive"),
			"contentType archive is not served by diskpipe's CDI API: diskpipe imports disk images (contentType kubevirt) only"},
		{"checkpoints", dv("warm", "source: {http: {url: 'https://example.com/d.qcow2'}}, checkpoints: [{previous: '', current: s1}]"),
			"checkpoints (multi-stage warm imports) are not served"},
		{"service account", dv("account", "source: {http: {url: 'https://example.com/d.qcow2'}}, serviceAccountName: importer"), ""},
		// CDI's own rules for a new DataVolume, in its words.
		{"no storage", raw("nostorage", "source: {blank: {}}"), "Missing Data volume PVC: give spec.storage (or spec.pvc)"},
		{"pvc and storage", raw("both", "source: {blank: {}}, pvc: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}, "+strings.TrimSuffix(storage, "\n")),
			"Duplicate storage definition, both target storage and target pvc defined"},
		{"pvc without a size", raw("pvcsize", "source: {blank: {}}, pvc: {accessModes: [ReadWriteOnce]}"), "PVC size is missing"},
		{"storage without a size", raw("nosize", "source: {http: {url: 'https://example.com/d.qcow2'}}, storage: {}"), "Storage size is missing"},
		{"a clone without a size", raw("clonesize", "sourceRef: {kind: DataSource, name: fedora}, storage: {}"), ""},
		{"no source", dv("nosource", "contentType: kubevirt"), "Data volume should have either Source or SourceRef"},
		{"source and sourceRef", dv("bothsrc", "source: {blank: {}}, sourceRef: {kind: DataSource, name: fedora}"), "Data volume should have either Source or SourceRef, not both"},
		{"two sources", dv("two", "source: {blank: {}, http: {url: 'https://example.com/d.qcow2'}}"), "Data volume should have exactly one source"},
		{"an empty source", dv("emptysrc", "source: {}"), "Data volume should have exactly one source"},
		{"cron of gcs", cron("gcs", "{gcs: {url: 'https://storage.googleapis.com/b/o'}}"), "source gcs is not served"},

		{"http", dv("http", "source: {http: {url: 'https://example.com/d.qcow2'}}, contentType: kubevirt"), ""},
		{"http checksum, no verify", dv("sum", "source: {http: {url: 'https://example.com/d.qcow2', checksum: 'sha256:00', insecureSkipVerify: true}}"), ""},
		{"pod pull", dv("pod", "source: {registry: {url: 'docker://quay.io/containerdisks/fedora:41', pullMethod: pod}}"), ""},
		{"node pull", dv("node", "source: {registry: {url: 'docker://quay.io/containerdisks/fedora:41', pullMethod: node}}"), ""},
		{"blank", dv("blank", "source: {blank: {}}"), ""},
		{"clone", dv("clone", "source: {pvc: {namespace: golden, name: fedora}}"), ""},
		{"source ref", dv("ref", "sourceRef: {kind: DataSource, name: fedora}"), ""},
		{"cron of a registry", cron("registry", "{registry: {url: 'docker://quay.io/containerdisks/fedora:41'}}"), ""},

		{"config overhead", config("overhead", "{filesystemOverhead: {global: '0.1', storageClass: {thick: '0.5'}}}"), ""},
		{"config overhead too large", config("overhead-large", "{filesystemOverhead: {global: '0.6'}}"),
			"CDIConfig spec.filesystemOverhead above 0.5 is not taken by diskpipe (a volume more than twice its disk): give fractions from 0 to 0.5"},
		{"config class overhead too large", config("class-overhead-large", "{filesystemOverhead: {storageClass: {thin: '0.1', thick: '1'}}}"),
			"CDIConfig spec.filesystemOverhead above 0.5 is not taken by diskpipe"},
		{"config proxy", config("proxy", "{importProxy: {HTTPProxy: 'http://proxy:3128', HTTPSProxy: 'https://proxy.corp:3129', noProxy: '.corp', trustedCAProxy: ca}}"), ""},
		{"config proxy with a password", config("proxy-password", "{importProxy: {HTTPProxy: 'http://user:secret@proxy:3128'}}"),
			"CDIConfig spec.importProxy HTTPProxy and HTTPSProxy must be http:// or https:// URLs with a host and no user name or password"},
		{"config proxy not a URL", config("proxy-bare", "{importProxy: {HTTPSProxy: 'proxy.corp:3128'}}"), "CDIConfig spec.importProxy HTTPProxy and HTTPSProxy must be"},
		{"config proxy socks", config("proxy-socks", "{importProxy: {HTTPSProxy: 'socks5://proxy.corp:1080'}}"), "CDIConfig spec.importProxy HTTPProxy and HTTPSProxy must be"},
		{"config resources", config("resources", "{podResourceRequirements: {limits: {cpu: '1'}}}"),
			"CDIConfig spec.podResourceRequirements is not read by diskpipe: set importer.resources"},
		{"config insecure", config("insecure", "{insecureRegistries: ['registry.local:5000']}"), ""},
		{"config ttl", config("ttl", "{dataVolumeTTLSeconds: 60}"), "CDIConfig spec.dataVolumeTTLSeconds is not served by diskpipe"},
		{"config upload URL", config("url", "{uploadProxyURLOverride: 'https://upload.example.com'}"), ""},
		{"config empty", config("empty", "{}"), ""},

		// virtctl image-upload pvc's PVC, to which UploadPVCPolicy gives its staging image as its data source.
		{"upload PVC", pvc("upload", "cdi.kubevirt.io/storage.upload.target: '', cdi.kubevirt.io/storage.contentType: kubevirt"), ""},
		{"upload PVC of an archive", pvc("archive", "cdi.kubevirt.io/storage.upload.target: '', cdi.kubevirt.io/storage.contentType: archive"),
			"archive uploads (cdi.kubevirt.io/storage.contentType: archive, virtctl image-upload --archive-path) are not served by diskpipe's CDI API"},
		{"upload PVC with a data source", withSource(pvc("sourced", "cdi.kubevirt.io/storage.upload.target: ''"), "other"),
			"uploads into a PVC (cdi.kubevirt.io/storage.upload.target) are served into a PVC made for the upload: let virtctl make it " +
				"(virtctl image-upload pvc NAME --size ...), without a data source of its own"},
		{"upload PVC named too long", pvc(strings.Repeat("n", cdiclaims.MaxUploadPVCName+1), "cdi.kubevirt.io/storage.upload.target: ''"),
			"a PVC for an upload has a name of at most 196 characters (its staging image is named pvc-<name>)"},
		{"upload PVC named at the limit", pvc(strings.Repeat("n", cdiclaims.MaxUploadPVCName), "cdi.kubevirt.io/storage.upload.target: ''"), ""},
		// CDI's legacy import into a PVC: staged the same way, of the sources diskpipe serves.
		{"import PVC", pvc("import", "cdi.kubevirt.io/storage.import.endpoint: 'https://images.example.com/disk.img'"), ""},
		{"import PVC of a registry", pvc("import-registry", "cdi.kubevirt.io/storage.import.endpoint: 'docker://quay.io/a/b', cdi.kubevirt.io/storage.import.source: registry"), ""},
		{"import PVC of vddk", pvc("import-vddk", "cdi.kubevirt.io/storage.import.endpoint: 'https://vcenter', cdi.kubevirt.io/storage.import.source: vddk"),
			"cdi.kubevirt.io/storage.import.source is served by diskpipe for http, registry and s3 (imageio, vddk, gcs and none are not)"},
		{"import PVC of an archive", pvc("import-archive", "cdi.kubevirt.io/storage.import.endpoint: 'https://a/b.tar', cdi.kubevirt.io/storage.contentType: archive"),
			"archive imports (cdi.kubevirt.io/storage.contentType: archive) are not served by diskpipe's CDI API"},
		{"import PVC with a data source", withSource(pvc("import-sourced", "cdi.kubevirt.io/storage.import.endpoint: 'https://a/b'"), "other"),
			"CDI's import into a PVC (cdi.kubevirt.io/storage.import.endpoint) is served into a PVC made with the annotation, without a data source of its own"},
		{"plain PVC", pvc("plain", "team: a"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			err := env.Client.Create(ctx, tc.obj)
			if tc.refuse == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			g.Expect(err).To(MatchError(ContainSubstring(tc.refuse)))
			g.Expect(err.Error()).To(ContainSubstring("diskpipe-cdi-unsupported"), "the refusal names the policy")
		})
	}

	// What is refused on creation is refused on a change too.
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(dv("", "source: {blank: {}}").GroupVersionKind())
	u.SetNamespace(ns)
	u.SetName("http")
	g.Expect(ctrltest.Update(ctx, env.Client, u, func() {
		g.Expect(unstructured.SetNestedField(u.Object, "archive", "spec", "contentType")).To(Succeed())
	})).
		To(MatchError(ContainSubstring("contentType archive is not served")))

	// A DataVolume's spec is fixed once it is made; its labels are not.
	g.Expect(ctrltest.Update(ctx, env.Client, u, func() {
		g.Expect(unstructured.SetNestedField(u.Object, true, "spec", "preallocation")).To(Succeed())
	})).To(MatchError(ContainSubstring("Cannot update DataVolume Spec")))
	g.Expect(ctrltest.Update(ctx, env.Client, u, func() { u.SetLabels(map[string]string{"team": "blue"}) })).To(Succeed())
	g.Expect(ctrltest.Update(ctx, env.Client, u, func() {
		g.Expect(unstructured.SetNestedField(u.Object, "2Gi", "spec", "storage", "resources", "requests", "storage")).To(Succeed())
	})).To(MatchError(ContainSubstring("Cannot update DataVolume Spec")), "a larger size is a change")
	g.Expect(ctrltest.Update(ctx, env.Client, u, func() {
		g.Expect(unstructured.SetNestedField(u.Object, "1024Mi", "spec", "storage", "resources", "requests", "storage")).To(Succeed())
	})).To(Succeed(), "the same size written another way is none (a client writing back what it read)")

	// The upload PVC's data source is its staging image, which the PVC's upload fills.
	upload := pvc("upload", "")
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(upload), upload)).To(Succeed())
	ref, _, _ := unstructured.NestedStringMap(upload.Object, "spec", "dataSourceRef")
	g.Expect(ref).To(Equal(map[string]string{"apiGroup": "hypercloud.tmaxanc.com", "kind": "VirtualMachineImage", "name": cdiclaims.UploadPVCImage("upload")}))
	typed := &corev1.PersistentVolumeClaim{}
	g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(upload.Object, typed)).To(Succeed())
	g.Expect(cdiclaims.IsUploadPVC(typed)).To(BeTrue())
	imported := pvc("import", "")
	g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(imported), imported)).To(Succeed())
	typed = &corev1.PersistentVolumeClaim{}
	g.Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(imported.Object, typed)).To(Succeed())
	g.Expect(cdiclaims.IsImportPVC(typed)).To(BeTrue(), "its data source is its staging image: %+v", typed.Spec.DataSourceRef)

	// A PVC marked for an upload afterwards (virtctl image-upload pvc of a PVC that exists) is
	// refused: its bytes could be in use, and it may be bound already.
	plain := pvc("plain", "")
	g.Expect(ctrltest.Update(ctx, env.Client, plain, func() {
		plain.SetAnnotations(map[string]string{cdipolicy.AnnUploadTarget: ""})
	})).To(MatchError(ContainSubstring("an existing PVC cannot be marked for an upload")))
	g.Expect(ctrltest.Update(ctx, env.Client, plain, func() {
		plain.SetAnnotations(map[string]string{cdiclaims.AnnImportEndpoint: "https://images.example.com/disk.img"})
	})).To(MatchError(ContainSubstring("an existing PVC cannot be given an endpoint")))
	// Nor is an import's source changed once it is made; its other annotations may be.
	g.Expect(ctrltest.Update(ctx, env.Client, imported, func() {
		ann := imported.GetAnnotations()
		ann[cdiclaims.AnnImportSource] = "imageio"
		imported.SetAnnotations(ann)
	})).To(MatchError(ContainSubstring("are fixed once it is made")))
	g.Expect(ctrltest.Update(ctx, env.Client, imported, func() {
		ann := imported.GetAnnotations()
		ann["team"] = "blue"
		imported.SetAnnotations(ann)
	})).To(Succeed())

	// A CDIConfig's setting is refused when it is added; one that was there may stay while
	// another field changes.
	url := config("url", "{}")
	g.Expect(ctrltest.Update(ctx, env.Client, url, func() {
		g.Expect(unstructured.SetNestedField(url.Object, "http://user:secret@proxy:3128", "spec", "importProxy", "HTTPProxy")).To(Succeed())
	})).To(MatchError(ContainSubstring("no user name or password")))
	g.Expect(ctrltest.Update(ctx, env.Client, url, func() {
		g.Expect(unstructured.SetNestedField(url.Object, "http://proxy:3128", "spec", "importProxy", "HTTPProxy")).To(Succeed())
	})).To(Succeed())
	g.Expect(ctrltest.Update(ctx, env.Client, legacy, func() {
		g.Expect(unstructured.SetNestedField(legacy.Object, "https://upload.example.com", "spec", "uploadProxyURLOverride")).To(Succeed())
	})).To(Succeed())
	g.Expect(ctrltest.Update(ctx, env.Client, legacy, func() {
		g.Expect(unstructured.SetNestedField(legacy.Object, int64(60), "spec", "dataVolumeTTLSeconds")).To(Succeed())
	})).To(MatchError(ContainSubstring("CDIConfig spec.dataVolumeTTLSeconds is not served by diskpipe")))
	g.Expect(ctrltest.Update(ctx, env.Client, legacy, func() {
		g.Expect(unstructured.SetNestedField(legacy.Object, "0.7", "spec", "filesystemOverhead", "global")).To(Succeed())
	})).To(MatchError(ContainSubstring("CDIConfig spec.filesystemOverhead above 0.5 is not taken by diskpipe")))
	g.Expect(ctrltest.Update(ctx, env.Client, legacy, func() {
		g.Expect(unstructured.SetNestedField(legacy.Object, "0.2", "spec", "filesystemOverhead", "global")).To(Succeed())
	})).To(Succeed())
}
