package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/diskpipe/diskpipe/objectstore"
)

var _ = Describe("tenants of the bundled store", func() {
	It("keeps a namespace out of another's buckets, with awscli and through images, exports and schedules", localProves, func() {
		ctx := context.Background()
		a, b := namespace(), namespace()
		bucket := "tenant-" + a
		out, err := awsIn(ctx, a, "s3", "mb", "s3://"+bucket)
		Expect(err).NotTo(HaveOccurred(), out)
		out, err = awsIn(ctx, a, "s3", "cp", images["qcow2"], "s3://"+bucket+"/disk.qcow2")
		Expect(err).NotTo(HaveOccurred(), out)
		kubectl(vmi("own", "    objectStore: {bucketName: "+bucket+", objectName: disk.qcow2}"), "apply", "-n", a, "-f", "-")
		Eventually(phase(a, "vmimage", "own"), 2*time.Minute, time.Second).Should(Equal("Ready Imported"))

		// B with its own keys and awscli: nothing of A's.
		small := filepath.Join(work, "small-"+b)
		run("truncate", "-s", "4096", small)
		for _, c := range []struct{ what, args string }{
			{"list A's bucket", "s3 ls s3://" + bucket + "/"},
			{"read A's object", "s3 cp s3://" + bucket + "/disk.qcow2 " + filepath.Join(work, "stolen-"+b)},
			{"overwrite A's object", "s3 cp " + small + " s3://" + bucket + "/disk.qcow2"},
			{"delete A's object", "s3 rm s3://" + bucket + "/disk.qcow2"},
		} {
			out, err := awsIn(ctx, b, strings.Fields(c.args)...)
			Expect(err).To(HaveOccurred(), "tenant B could %s:\n%s", c.what, out)
			Expect(out).To(Or(ContainSubstring("AccessDenied"), ContainSubstring("Forbidden"), ContainSubstring("403")), c.what)
		}
		out, err = awsIn(ctx, b, "s3", "ls")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).NotTo(ContainSubstring(bucket))

		// B through diskpipe: an image, a scheduled image and an export naming A's bucket fail,
		// naming the namespace and the bucket.
		refusal := fmt.Sprintf("namespace %s may not read s3://%s/disk.qcow2 in the bundled object store", b, bucket)
		kubectl(vmi("stolen", "    objectStore: {bucketName: "+bucket+", objectName: disk.qcow2}"), "apply", "-n", b, "-f", "-")
		kubectl(vmi("stolen-nightly", "    objectStore: {bucketName: "+bucket+", objectName: disk.qcow2}")+"  schedule: {cron: \"@every 5s\", keep: 1}\n", "apply", "-n", b, "-f", "-")
		for _, name := range []string{"stolen", "stolen-nightly"} {
			Eventually(phase(b, "vmimage", name), time.Minute, time.Second).Should(Equal("Failed SourceForbidden"), name)
			Expect(kubectl("", "get", "vmimage", name, "-n", b, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].message}`)).To(ContainSubstring(refusal))
		}
		kubectl(vmi("mine", fmt.Sprintf("    http: %s/disk.qcow2", server)), "apply", "-n", b, "-f", "-")
		Eventually(phase(b, "vmimage", "mine"), 2*time.Minute, time.Second).Should(Equal("Ready Imported"))
		kubectl(fmt.Sprintf(`apiVersion: hypercloud.tmaxanc.com/v1alpha1
kind: VirtualMachineVolumeExport
metadata: {name: overwrite}
spec:
  pvcName: vmim-mine
  objectStore: {bucketName: %s, objectName: disk.qcow2}
`, bucket), "apply", "-n", b, "-f", "-")
		Eventually(phase(b, "vmve", "overwrite"), time.Minute, time.Second).Should(Equal("Failed TargetForbidden"))
		Expect(kubectl("", "get", "vmve", "overwrite", "-n", b, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].message}`)).
			To(ContainSubstring(fmt.Sprintf("namespace %s may not use bucket %s in the bundled object store", b, bucket)))
		viaA := filepath.Join(work, "via-a-"+a+".qcow2")
		out, err = awsIn(ctx, a, "s3", "cp", "s3://"+bucket+"/disk.qcow2", viaA)
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(sha256Of(viaA)).To(Equal(sha256Of(images["qcow2"])), "A's object is as A left it")

		// Shared by A in its bucket policy, the same image of B imports.
		// A namespace's account is named after its UID.
		aAccess := objectstore.TenantAccess(kubectl("", "get", "namespace", a, "-o", "jsonpath={.metadata.uid}"))
		bAccess := objectstore.TenantAccess(kubectl("", "get", "namespace", b, "-o", "jsonpath={.metadata.uid}"))
		out, err = awsIn(ctx, a, "s3api", "put-bucket-policy", "--bucket", bucket, "--policy", `{"Version":"2012-10-17","Statement":[`+
			`{"Effect":"Allow","Principal":{"AWS":["`+aAccess+`"]},"Action":["s3:*"],"Resource":["arn:aws:s3:::`+bucket+`","arn:aws:s3:::`+bucket+`/*"]},`+
			`{"Effect":"Allow","Principal":{"AWS":["`+bAccess+`"]},"Action":["s3:GetObject"],"Resource":["arn:aws:s3:::`+bucket+`/disk.qcow2"]}]}`)
		Expect(err).NotTo(HaveOccurred(), out)
		kubectl(vmi("shared", "    objectStore: {bucketName: "+bucket+", objectName: disk.qcow2}"), "apply", "-n", b, "-f", "-")
		Eventually(phase(b, "vmimage", "shared"), 2*time.Minute, time.Second).Should(Equal("Ready Imported"))

		// Keys only for a user who may write the Secret they go to.
		uploaders(b)
		viewer := kubeconfigWith("kubeconfig-keys-viewer-"+b, b, &clientcmdapi.AuthInfo{Token: saToken(b, "viewer")})
		_, stderr, err := cluster.Kubectl(ctx, []byte("apiVersion: upload.diskpipe.io/v1alpha1\nkind: ObjectStoreKeysRequest\nmetadata: {name: keys}\n"),
			"--kubeconfig", viewer, "create", "-f", "-")
		Expect(err).To(HaveOccurred())
		Expect(stderr).To(ContainSubstring(fmt.Sprintf("system:serviceaccount:%s:viewer may not update the Secret %s/diskpipe-objectstore-keys", b, b)))
	})
})

var _ = Describe("a viewer of a namespace", func() {
	It("reads its exports, their pods and events, and no link that downloads a disk", localProves, func() {
		ns := namespace()
		importHTTP(ns, "golden", "disk.qcow2")
		kubectl(`apiVersion: hypercloud.tmaxanc.com/v1alpha1
kind: VirtualMachineVolumeExport
metadata: {name: backup}
spec:
  pvcName: vmim-golden
  objectStore: {bucketName: viewer-test, objectName: disk.qcow2}
`, "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "vmve", "backup"), 2*time.Minute, time.Second).Should(Equal("Ready Exported"))

		// view, as Kubernetes and diskpipe aggregate it (bound directly: envtest-like clusters
		// aggregate no roles).
		eve := "eve-" + ns
		for _, role := range []string{"view", "system:aggregate-to-view", "diskpipe-viewer"} {
			kubectl("", "create", "rolebinding", strings.ReplaceAll(role, ":", "-")+"-"+eve, "-n", ns, "--clusterrole", role, "--user", eve)
		}
		var seen string
		Eventually(func() error { // RBAC learns a new binding a moment after it is made
			out, err := asUser(eve, "", "get", "vmve,pods,events", "-n", ns, "-o", "json")
			seen = out
			return err
		}, 30*time.Second, time.Second).Should(Succeed())
		Expect(seen).To(ContainSubstring(`"name": "backup"`), "the viewer reads the export")
		Expect(seen).NotTo(ContainSubstring("X-Amz-Signature"), "the viewer reads a signed URL")
		secret := kubectl("", "get", "vmve", "backup", "-n", ns, "-o", "jsonpath={.status.downloadSecretName}")
		out, err := asUser(eve, "", "get", "secret", secret, "-n", ns, "-o", "jsonpath={.data.url}")
		Expect(err).To(HaveOccurred(), "the viewer read the download Secret: %s", out)
		Expect(out).To(ContainSubstring("Forbidden"))

		// Whoever may read the namespace's Secrets downloads the disk with it.
		got := filepath.Join(work, "viewer-"+ns+".qcow2")
		run("curl", "-sSf", "-o", got, downloadURL(ns, "backup"))
		run("qemu-img", "compare", images["qcow2"], got)
	})
})

// asUser runs kubectl as user (impersonated, so the apiserver's RBAC decides) and returns its
// output and error.
func asUser(user, stdin string, args ...string) (string, error) {
	out, errOut, err := cluster.Kubectl(context.Background(), []byte(stdin), append(args, "--as", user)...)
	return out + errOut, err
}

var _ = Describe("a hostile tenant", func() {
	It("with edit in its own namespace only, takes no other namespace's volume, bucket or disk", func() {
		ctx := context.Background()
		victim, own := namespace(), namespace()
		importHTTP(victim, "golden", "disk.qcow2")
		sameDisk(golden(victim, "golden"))
		pv := kubectl("", "get", "pvc", "vmim-golden", "-n", victim, "-o", "jsonpath={.spec.volumeName}")
		claim := kubectl("", "get", "pv", pv, "-o", "jsonpath={.spec.claimRef.namespace}/{.spec.claimRef.name}/{.spec.claimRef.uid}")

		// mallory may do in her namespace what edit allows, nothing elsewhere.
		mallory := tenant("mallory", own)
		as := func(stdin string, args ...string) {
			GinkgoHelper()
			asTenant(mallory, stdin, args...)
		}

		// 1. Her disk waits for an image she has not made yet; meanwhile she makes its prime
		// PVC herself, controlled by the disk, marked filled, pre-bound to the victim's volume.
		as(diskFromImage("loot", "later", "HostAssisted"), "apply", "-n", own, "-f", "-")
		uid := kubectl("", "get", "dvol", "loot", "-n", own, "-o", "jsonpath={.metadata.uid}")
		as(fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: prime-%s
  annotations: {diskpipe.io/filled: "copied in 1 s"}
  ownerReferences:
  - {apiVersion: diskvolume.kubesphere.io/v1alpha1, kind: DiskVolume, name: loot, uid: %s, controller: true, blockOwnerDeletion: true}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: cephrbd
  volumeName: %s
  resources: {requests: {storage: 64Mi}}
`, uid, uid, pv), "apply", "-n", own, "-f", "-")
		as(vmi("later", fmt.Sprintf("    http: %s/disk.qcow2", server)), "apply", "-n", own, "-f", "-")
		Eventually(phase(own, "vmimage", "later"), 3*time.Minute, time.Second).Should(Equal("Ready Imported"))
		Eventually(phase(own, "dvol", "loot"), time.Minute, time.Second).Should(Equal("Failed NameTaken"))
		Expect(kubectl("", "get", "dvol", "loot", "-n", own, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].message}`)).To(
			Equal("a PersistentVolumeClaim named prime-" + uid + " already exists and was not made by diskpipe for this object; delete it and diskpipe makes it again"))
		Consistently(func() string {
			return observe("get", "pv", pv, "-o", "jsonpath={.spec.claimRef.namespace}/{.spec.claimRef.name}/{.spec.claimRef.uid}")
		}, 5*time.Second, time.Second).Should(Equal(claim), "the victim's volume is still the victim's")
		Expect(kubectl("", "get", "pvc", "vmim-golden", "-n", victim, "-o", "jsonpath={.status.phase}")).To(Equal("Bound"))

		// 2. The bucket every upload goes to cannot be hers first, under any name diskpipe keeps.
		for _, bucket := range []string{"diskpipe-uploads", "diskpipe-exports"} {
			out, err := awsIn(ctx, own, "s3", "mb", "s3://"+bucket)
			Expect(err).To(HaveOccurred(), out)
			Expect(out).To(ContainSubstring("reserved for diskpipe"))
		}

		// 3. Reading another namespace (Kubernetes' and diskpipe's parts of the view role) is not
		// owning it: no copy of its image.
		kubectl("", "create", "rolebinding", "view-parts-"+mallory, "-n", victim, "--clusterrole", "system:aggregate-to-view", "--user", mallory)
		kubectl("", "create", "rolebinding", "viewer-"+mallory, "-n", victim, "--clusterrole", "diskpipe-viewer", "--user", mallory)
		Eventually(func() error { _, err := asUser(mallory, "", "get", "vmimage", "golden", "-n", victim); return err }, 30*time.Second, time.Second).Should(Succeed())
		out, err := asUser(mallory, diskOf("copy", victim, "Filesystem", "64Mi"), "apply", "-n", own, "-f", "-")
		Expect(err).To(HaveOccurred(), out)
		Expect(out).To(ContainSubstring(fmt.Sprintf("%s may not copy the VirtualMachineImage %s/golden into namespace %s: copying another namespace's data needs its owner's consent",
			mallory, victim, own)))

		sameDisk(golden(victim, "golden"))
	})
})
