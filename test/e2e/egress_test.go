package e2e

import (
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// Importers refuse to connect where a source must never lead, and a Secret's value shows in
// no status or event, however the import ends.
var _ = Describe("hostile sources", func() {
	It("refuses the cloud's metadata address, and shows no Secret's value in status or events", func() {
		ns := namespace()
		const canary = "canary-5e1f0c7d"
		kubectl(fmt.Sprintf(`apiVersion: v1
kind: Secret
metadata: {name: token}
stringData: {header: "X-Auth-Token: %s"}
---
apiVersion: v1
kind: Secret
metadata: {name: malformed}
stringData: {header: "%s"}
---
apiVersion: hypercloud.tmaxanc.com/v1alpha1
kind: VirtualMachineImage
metadata: {name: metadata-service}
spec:
  source:
    http: http://169.254.169.254/latest/meta-data/disk.img
    httpOptions: {secretExtraHeaders: [token]}
  resources: {requests: {storage: 64Mi}}
---
apiVersion: hypercloud.tmaxanc.com/v1alpha1
kind: VirtualMachineImage
metadata: {name: malformed-header}
spec:
  source:
    http: %s/disk.qcow2
    httpOptions: {secretExtraHeaders: [malformed]}
  resources: {requests: {storage: 64Mi}}
`, canary, canary, server), "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "vmimage", "metadata-service"), 2*time.Minute, time.Second).Should(Equal("Failed ForbiddenDestination"))
		Expect(kubectl("", "get", "vmimage", "metadata-service", "-n", ns, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].message}`)).To(
			ContainSubstring("refusing to connect to 169.254.169.254: it is a link-local address"))
		Eventually(phase(ns, "vmimage", "malformed-header"), 2*time.Minute, time.Second).Should(Equal("Failed InvalidArgument"))

		for _, what := range [][]string{{"get", "vmimage", "-n", ns, "-o", "yaml"}, {"get", "events", "-n", ns, "-o", "yaml"}} {
			out := kubectl("", what...)
			Expect(out).To(ContainSubstring("ForbiddenDestination"), "kubectl %s", strings.Join(what, " "))
			Expect(out).NotTo(ContainSubstring(canary), "kubectl %s shows a Secret's value", strings.Join(what, " "))
		}
	})
})
