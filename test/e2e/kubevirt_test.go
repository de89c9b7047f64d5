package e2e

import (
	"context"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// These specs run VMs under the real KubeVirt (the real node with DISKPIPE_KUBEVIRT=1): each
// boot is read from KubeVirt's own serial console log, the launcher pod's guest-console-log
// container, by the bootable disk's line.
var _ = Describe("real KubeVirt", func() {
	BeforeEach(func() {
		if !cluster.KubeVirt() {
			Skip("no KubeVirt runs VMs on this cluster: the real node with DISKPIPE_KUBEVIRT=1 (make kubevirt-images) runs these")
		}
	})

	It("boots a VirtualMachine written by hand from a VirtualMachinePvc's PVC, and the guest sees the disk grown", func() {
		ns := vmNamespace()
		importHTTP(ns, "golden", "disk.qcow2")
		kubectl(`apiVersion: hypercloud.tmaxanc.com/v1alpha1
kind: VirtualMachinePvc
metadata:
  name: root
spec:
  virtualMachineImageName: golden
  pvc:
    accessModes: [ReadWriteOnce]
    resources: {requests: {storage: 1Gi}}
`, "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "vmpvc", "root"), 2*time.Minute, time.Second).Should(Equal("Ready Made"))
		start := time.Now()
		kubectl(kubeVirtVM("byhand", "root"), "apply", "-n", ns, "-f", "-")
		line := guestLine(ns, "byhand")
		GinkgoWriter.Printf("from kubectl apply to the guest's line: %.1f s\n", time.Since(start).Seconds())
		Expect(line).To(Equal(fmt.Sprintf("DISKPIPE-BOOT disk=vda size=%d marker=diskpipe-bootdisk-v1", grown(1<<30))))
	})
})

// vmNamespace is a new namespace where KubeVirt may run VMs: its launcher pods are privileged,
// so the namespace enforces the privileged Pod Security level (KubeVirt refuses to make a
// launcher pod in a restricted one: "it needs a privileged namespace to run").
func vmNamespace() string {
	GinkgoHelper()
	ns := namespace()
	kubectl("", "label", "namespace", ns, "pod-security.kubernetes.io/enforce=privileged", "--overwrite")
	return ns
}

// kubeVirtVM is a KubeVirt VirtualMachine that boots once from the PVC claim: no network (its
// pod interface would need a tun device per VM), 128 MiB.
func kubeVirtVM(name, claim string) string {
	return fmt.Sprintf(`apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: %s
spec:
  runStrategy: Once
  template:
    spec:
      domain:
        devices:
          autoattachPodInterface: false
          disks:
          - name: root
            disk: {bus: virtio}
        resources: {requests: {memory: 128Mi}}
      volumes:
      - name: root
        persistentVolumeClaim: {claimName: %s}
`, name, claim)
}

// guestLine waits for the bootable disk's line on VM name's serial console, as KubeVirt logs
// it, and returns it.
func guestLine(ns, name string) string {
	GinkgoHelper()
	var line string
	Eventually(func() string {
		pod, _, _ := strings.Cut(kubectl("", "get", "pods", "-n", ns, "-l", "vm.kubevirt.io/name="+name, "-o", "jsonpath={.items[*].metadata.name}"), " ")
		if pod == "" {
			return "no launcher pod yet; the VM is " + kubectl("", "get", "vm", name, "-n", ns, "-o", "jsonpath={.status.printableStatus}")
		}
		out, _, _ := cluster.Kubectl(context.Background(), nil, "logs", "-n", ns, pod, "-c", "guest-console-log")
		for _, l := range strings.Split(out, "\n") {
			if i := strings.Index(l, "DISKPIPE-BOOT "); i >= 0 {
				line = strings.TrimSpace(l[i:])
			}
		}
		return line
	}, 4*time.Minute, 2*time.Second).Should(HavePrefix("DISKPIPE-BOOT "), "the guest's line on KubeVirt's serial console")
	return line
}
