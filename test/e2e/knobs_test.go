package e2e

import (
	"fmt"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// thickClass is a StorageClass both clusters make, to which the installation gives a
// filesystem overhead of 20 % (filesystemOverhead.storageClasses).
const thickClass, thickOverhead = "thick", 0.2

// allocated is the bytes a file holds on its volume, holes excluded.
func allocated(path string) int64 {
	GinkgoHelper()
	var st syscall.Stat_t
	Expect(syscall.Stat(path, &st)).To(Succeed())
	return st.Blocks * 512
}

var _ = Describe("volume knobs", func() {
	It("sizes a golden PVC by its StorageClass's filesystem overhead, and preallocates the golden disk and a disk grown from it", localProves, func() {
		ns := namespace()
		kubectl(fmt.Sprintf(`apiVersion: hypercloud.tmaxanc.com/v1alpha1
kind: VirtualMachineImage
metadata:
  name: thick
spec:
  storageClassName: %s
  preallocation: true
  source:
    http: %s/disk.qcow2
`, thickClass, server), "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "vmimage", "thick"), 3*time.Minute, time.Second).Should(Equal("Ready Imported"))
		vsize := fileSize(raw)
		want := transfer.VolumeSizeFor(vsize, thickOverhead)
		Expect(kubectl("", "get", "pvc", "vmim-thick", "-n", ns, "-o", "jsonpath={.spec.resources.requests.storage}")).
			To(Equal(fmt.Sprintf("%dMi", want>>20)), "the golden PVC holds the image and 20 %% for the filesystem")
		disk := golden(ns, "thick")
		sameDisk(disk)
		Expect(allocated(disk)).To(BeNumerically(">=", vsize), "the golden disk is preallocated")

		// A larger disk from it: the storage clones the volume, the importer grows disk.img to
		// 80 % of it and allocates it whole.
		kubectl(fmt.Sprintf(`apiVersion: diskvolume.kubesphere.io/v1alpha1
kind: DiskVolume
metadata:
  name: thick-disk
spec:
  source:
    image: {name: thick, kind: VirtualMachineImage}
  storageClassName: %s
  preallocation: true
  resources:
    requests: {storage: 160Mi}
`, thickClass), "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "dvol", "thick-disk"), 3*time.Minute, time.Second).Should(Equal("Ready Made"))
		made := cluster.VolumePath(ns, "thick-disk") + "/disk.img"
		grown := int64(float64(160<<20)*(1-thickOverhead)) &^ (1<<20 - 1)
		Expect(fileSize(made)).To(Equal(grown))
		Expect(allocated(made)).To(BeNumerically(">=", grown), "the grown disk is preallocated")
		sameDisk(made)
		boots(made)
	})
})
