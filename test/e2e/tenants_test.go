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
		Eventually(phase(a, "vmim", "own"), 2*time.Minute, time.Second).Should(Equal("Ready Imported"))

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
			Eventually(phase(b, "vmim", name), time.Minute, time.Second).Should(Equal("Failed SourceForbidden"), name)
			Expect(kubectl("", "get", "vmim", name, "-n", b, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].message}`)).To(ContainSubstring(refusal))
		}
		kubectl(vmi("mine", fmt.Sprintf("    http: %s/disk.qcow2", server)), "apply", "-n", b, "-f", "-")
		Eventually(phase(b, "vmim", "mine"), 2*time.Minute, time.Second).Should(Equal("Ready Imported"))
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
		aAccess, bAccess := objectstore.TenantAccess(a), objectstore.TenantAccess(b)
		out, err = awsIn(ctx, a, "s3api", "put-bucket-policy", "--bucket", bucket, "--policy", `{"Version":"2012-10-17","Statement":[`+
			`{"Effect":"Allow","Principal":{"AWS":["`+aAccess+`"]},"Action":["s3:*"],"Resource":["arn:aws:s3:::`+bucket+`","arn:aws:s3:::`+bucket+`/*"]},`+
			`{"Effect":"Allow","Principal":{"AWS":["`+bAccess+`"]},"Action":["s3:GetObject"],"Resource":["arn:aws:s3:::`+bucket+`/disk.qcow2"]}]}`)
		Expect(err).NotTo(HaveOccurred(), out)
		kubectl(vmi("shared", "    objectStore: {bucketName: "+bucket+", objectName: disk.qcow2}"), "apply", "-n", b, "-f", "-")
		Eventually(phase(b, "vmim", "shared"), 2*time.Minute, time.Second).Should(Equal("Ready Imported"))

		// Keys only for a user who may write the Secret they go to.
		uploaders(b)
		viewer := kubeconfigWith("kubeconfig-keys-viewer-"+b, b, &clientcmdapi.AuthInfo{Token: saToken(b, "viewer")})
		_, stderr, err := cluster.Kubectl(ctx, []byte("apiVersion: upload.diskpipe.io/v1alpha1\nkind: ObjectStoreKeysRequest\nmetadata: {name: keys}\n"),
			"--kubeconfig", viewer, "create", "-f", "-")
		Expect(err).To(HaveOccurred())
		Expect(stderr).To(ContainSubstring(fmt.Sprintf("system:serviceaccount:%s:viewer may not update the Secret %s/diskpipe-objectstore-keys", b, b)))
	})
})
