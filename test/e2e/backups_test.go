package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/diskpipe/diskpipe/test/bootdisk"
)

// backupExport is a VirtualMachineVolumeExport of the PVC pvc kept as backup name in the index
// backups/<pvc>/index.json of the bundled store.
func backupExport(name, pvc string) string {
	return fmt.Sprintf(`apiVersion: hypercloud.tmaxanc.com/v1alpha1
kind: VirtualMachineVolumeExport
metadata:
  name: %s
spec:
  pvcName: %s
  objectStore: {bucketName: backups, objectName: %s/index.json}
  backup: {}
`, name, pvc, pvc)
}

var _ = Describe("backups", afterKubeVirtRollout, func() {
	It("keeps a disk's backups in the bundled store, a full and then only what changed, and restores each point into a disk a VM boots from", realProves, func() {
		ns := namespace()
		if kubeVirt() {
			ns = vmNamespace()
		}
		importHTTP(ns, "golden", "disk.qcow2")
		kubectl(vmPvc("root", "golden", "1Gi"), "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "vmpvc", "root"), 2*time.Minute, time.Second).Should(Equal("Ready Made"))
		out, err := awsIn(context.Background(), ns, "s3", "mb", "s3://backups")
		Expect(err).NotTo(HaveOccurred(), out)
		disk := filepath.Join(cluster.VolumePath(ns, "root"), "disk.img")
		states := map[string]string{}
		keep := func(name string) int64 {
			GinkgoHelper()
			states[name] = filepath.Join(work, ns+"-"+name+".raw")
			run("cp", "--sparse=always", disk, states[name])
			kubectl(backupExport(name, "root"), "apply", "-n", ns, "-f", "-")
			Eventually(phase(ns, "vmve", name), 3*time.Minute, time.Second).Should(Equal("Ready Exported"))
			stored, err := resource.ParseQuantity(kubectl("", "get", "vmve", name, "-n", ns, "-o", "jsonpath={.status.storedSize}"))
			Expect(err).NotTo(HaveOccurred())
			return stored.Value()
		}
		full := keep("b1")
		// The disk changes as a guest would change it: a new marker line.
		f, err := os.OpenFile(disk, os.O_RDWR, 0)
		Expect(err).NotTo(HaveOccurred())
		_, err = f.WriteAt([]byte("diskpipe-backup-b2\n"), bootdisk.MarkerOffset)
		Expect(err).NotTo(HaveOccurred())
		Expect(f.Close()).To(Succeed())
		inc := keep("b2")
		GinkgoWriter.Printf("the full backup holds %d bytes, the incremental %d\n", full, inc)
		Expect(inc).To(BeNumerically("<", 4<<20), "the incremental holds the changed piece only")

		for _, point := range []string{"b1", "b2"} {
			kubectl(vmi("at-"+point, "    chain:\n      objectStore: {bucketName: backups, objectName: root/index.json}\n      point: "+point), "apply", "-n", ns, "-f", "-")
		}
		for _, point := range []string{"b1", "b2"} {
			Eventually(phase(ns, "vmimage", "at-"+point), 3*time.Minute, time.Second).Should(Equal("Ready Imported"))
			Expect(kubectl("", "get", "vmimage", "at-"+point, "-n", ns, "-o", "jsonpath={.status.sourceType} {.status.revision}")).To(Equal("chain " + point))
			run("qemu-img", "compare", "-f", "raw", "-F", "raw", states[point], golden(ns, "at-"+point))
		}
		// The restored point boots, and its guest reads the marker the disk had then.
		if !kubeVirt() {
			g, err := bootdisk.Boot(context.Background(), golden(ns, "at-b2"), "raw", 2*time.Minute)
			Expect(err).NotTo(HaveOccurred())
			Expect(g.Marker).To(Equal("diskpipe-backup-b2"))
			return
		}
		kubectl(vmPvc("restored", "at-b2", "1Gi"), "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "vmpvc", "restored"), 2*time.Minute, time.Second).Should(Equal("Ready Made"))
		kubectl(kubeVirtVM("restored", "Always", "restored"), "apply", "-n", ns, "-f", "-")
		Expect(guestConsole(ns, "restored", "")[0]).To(HavePrefix("DISKPIPE-BOOT disk=vda "))
		Expect(guestConsole(ns, "restored", "")[0]).To(HaveSuffix(" marker=diskpipe-backup-b2"))
	})
})
