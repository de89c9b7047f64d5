package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// appliance is an OVF descriptor for a blank data disk, then the system disk of capacity MiB.
const appliance = `<?xml version="1.0" encoding="UTF-8"?>
<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1" xmlns:ovf="http://schemas.dmtf.org/ovf/envelope/1">
  <References>
    <File ovf:id="file1" ovf:href="data.vmdk"/>
    <File ovf:id="file2" ovf:href="system.vmdk"/>
  </References>
  <DiskSection>
    <Info>Virtual disks</Info>
    <Disk ovf:diskId="data" ovf:fileRef="file1" ovf:capacity="16" ovf:capacityAllocationUnits="byte * 2^20"/>
    <Disk ovf:diskId="system" ovf:fileRef="file2" ovf:capacity="%d" ovf:capacityAllocationUnits="byte * 2^20"/>
  </DiskSection>
  <VirtualSystem ovf:id="appliance"><Info>An appliance</Info></VirtualSystem>
</Envelope>
`

var _ = Describe("any format from any stream", func() {
	It("imports the chosen disk of an xz-compressed OVA from a server without Range, at the OVF's capacity, and it boots", localProves, func() {
		ns := namespace()
		dir := filepath.Join(work, "ova-"+ns)
		Expect(os.Mkdir(dir, 0o755)).To(Succeed())
		capacity := fileSize(raw)>>20 + 64 // MiB: the system disk is larger than its image
		Expect(os.WriteFile(filepath.Join(dir, "appliance.ovf"), fmt.Appendf(nil, appliance, capacity), 0o644)).To(Succeed())
		run("qemu-img", "create", "-f", "vmdk", "-o", "subformat=streamOptimized", filepath.Join(dir, "data.vmdk"), "16M")
		run("cp", images["vmdk"], filepath.Join(dir, "system.vmdk")) // qemu-img's streamOptimized vmdk
		ova := filepath.Join(work, "appliance-"+ns+".ova")
		run("tar", "-cf", ova, "-C", dir, "--format=ustar", "appliance.ovf", "data.vmdk", "system.vmdk")
		run("xz", "-T2", ova)

		kubectl(vmi("appliance", fmt.Sprintf("    http: %s/%s.xz?norange=1\n    ovaDisk: system", server, filepath.Base(ova))), "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "vmimage", "appliance"), 3*time.Minute, time.Second).Should(Equal("Ready Imported"))
		Expect(kubectl("", "get", "vmimage", "appliance", "-n", ns, "-o", "jsonpath={.status.format} {.status.virtualSize}")).
			To(Equal(fmt.Sprintf("ova %dMi", capacity)))
		disk := golden(ns, "appliance")
		Expect(fileSize(disk)).To(Equal(capacity << 20))
		sameDisk(disk) // qemu-img compare: the image's bytes, then zeros
		boots(disk)
	})

	It("refuses a vhdx from a server without Range for good, naming the ways out", localProves, func() {
		ns := namespace()
		vhdx := filepath.Join(work, "disk-"+ns+".vhdx")
		run("qemu-img", "convert", "-f", "raw", "-O", "vhdx", raw, vhdx)
		kubectl(vmi("hyperv", fmt.Sprintf("    http: %s/%s?norange=1", server, filepath.Base(vhdx))), "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "vmimage", "hyperv"), 2*time.Minute, time.Second).Should(Equal("Failed NeedsRandomAccess"))
		Expect(kubectl("", "get", "vmimage", "hyperv", "-n", ns, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].message}`)).
			To(And(ContainSubstring("server that supports Range"), ContainSubstring("qemu-img convert -O qcow2")))
		Expect(golden(ns, "hyperv")).NotTo(BeAnExistingFile())
	})
})
