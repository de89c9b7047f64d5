package e2e

import (
	"fmt"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/diskpipe/diskpipe/importer/registrytest"
)

// signedTemplate is an ImageTemplate of a container disk that must be signed by the key in the
// Secret cosign-key.
func signedTemplate(name, url string) string {
	return fmt.Sprintf(`apiVersion: virtualmachine.kubesphere.io/v1alpha1
kind: ImageTemplate
metadata:
  name: %s
spec:
  source:
    registry:
      url: %s
      insecureSkipTLSVerify: true
      signature:
        publicKeySecretRef: cosign-key
  resources:
    requests:
      storage: 1Gi
`, name, url)
}

var _ = Describe("signed container disks", func() {
	It("imports a container disk signed by the key in a Secret, and fails an unsigned one for good, leaving no disk", func() {
		ns := namespace()
		addr := registrytest.StartAt(GinkgoT(), cluster.HostAddress())
		img := registrytest.ContainerDisk(GinkgoT(), images["qcow2"], "amd64", "disk")
		const mt = "application/vnd.oci.image.manifest.v1+json"
		registrytest.Push(GinkgoT(), addr, "containerdisks/signed", "1", img.Manifest, mt, img.Blobs)
		registrytest.Push(GinkgoT(), addr, "containerdisks/unsigned", "1", img.Manifest, mt, img.Blobs)
		signer := registrytest.NewSigner(GinkgoT())
		signer.Sign(GinkgoT(), addr, "containerdisks/signed", img.Manifest.Digest)
		kubectl("", "create", "secret", "generic", "cosign-key", "-n", ns, "--from-literal=cosign.pub="+string(signer.PublicKey))

		kubectl(signedTemplate("signed", "docker://"+addr+"/containerdisks/signed:1"), "apply", "-n", ns, "-f", "-")
		kubectl(signedTemplate("unsigned", "docker://"+addr+"/containerdisks/unsigned:1"), "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "imt", "signed"), 2*time.Minute, time.Second).Should(Equal("Ready Imported"))
		sameDisk(filepath.Join(cluster.VolumePath(ns, "imt-signed"), "disk.img"))
		Eventually(phase(ns, "imt", "unsigned"), 2*time.Minute, time.Second).Should(Equal("Failed Unsigned"))
		Expect(kubectl("", "get", "imt", "unsigned", "-n", ns, "-o", "jsonpath={.status.retries}")).To(Equal(""))
		Expect(filepath.Join(cluster.VolumePath(ns, "imt-unsigned"), "disk.img")).NotTo(BeAnExistingFile())
	})
})
