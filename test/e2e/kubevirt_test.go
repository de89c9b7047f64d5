package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/diskpipe/diskpipe/test/bootdisk"
	"github.com/diskpipe/diskpipe/test/testenv"
)

// These specs run VMs under the real KubeVirt (the real node with DISKPIPE_KUBEVIRT=1): each
// boot is read from KubeVirt's own serial console log, the launcher pod's guest-console-log
// container, by the bootable disk's line.
var _ = Describe("real KubeVirt", afterKubeVirtRollout, func() {
	BeforeEach(requireKubeVirt)

	It("boots a VirtualMachine written by hand from the PVCs of a VirtualMachinePvc, a DiskVolume and a block DiskVolume, grown as asked, and again after it stopped", func() {
		ns := vmNamespace()
		importHTTP(ns, "golden", "disk.qcow2")
		kubectl(vmPvc("root", "golden", "1Gi")+"---\n"+diskOf("data", "", "Filesystem", "512Mi")+"---\n"+diskOf("raw", "", "Block", "256Mi"), "apply", "-n", ns, "-f", "-")
		for _, d := range []string{"vmpvc/root", "dvol/data", "dvol/raw"} {
			kind, name, _ := strings.Cut(d, "/")
			Eventually(phase(ns, kind, name), 2*time.Minute, time.Second).Should(Equal("Ready Made"), d)
		}
		start := time.Now()
		kubectl(kubeVirtVM("byhand", "Manual", "root", "data", "raw"), "apply", "-n", ns, "-f", "-")
		virtctl("start", "byhand", "-n", ns)
		lines := guestConsole(ns, "byhand", "")
		GinkgoWriter.Printf("from virtctl start to the guest's line: %.1f s\n", time.Since(start).Seconds())
		want := []string{
			fmt.Sprintf("DISKPIPE-BOOT disk=vda size=%d marker=%s", grown(1<<30), bootdisk.Marker),
			fmt.Sprintf("DISKPIPE-DISK disk=vda size=%d marker=%s", grown(1<<30), bootdisk.Marker),
			fmt.Sprintf("DISKPIPE-DISK disk=vdb size=%d marker=%s", grown(512<<20), bootdisk.Marker),
			fmt.Sprintf("DISKPIPE-DISK disk=vdc size=%d marker=%s", 256<<20, bootdisk.Marker), // a block volume is the disk
		}
		Expect(lines).To(Equal(want))

		// The guest powered itself off: the VM is stopped. Started again, it boots again, in a
		// new launcher pod, from the same disks.
		first := vmiUID(ns, "byhand")
		Eventually(func() string {
			return observe("get", "vm", "byhand", "-n", ns, "-o", "jsonpath={.status.printableStatus}")
		},
			2*time.Minute, time.Second).Should(Equal("Stopped"))
		virtctl("start", "byhand", "-n", ns)
		Eventually(func() string { return vmiUID(ns, "byhand") }, 2*time.Minute, time.Second).ShouldNot(Or(BeEmpty(), Equal(first)))
		Expect(guestConsole(ns, "byhand", first)).To(Equal(want))
	})

	It("starts no VM before its disk is whole, for each way diskpipe fills a disk and when its importer is deleted mid-way, and boots it once the disk is complete", func() {
		ns, images := vmNamespace(), namespace()
		// The host-assisted copies read an image of another namespace through a clone-source
		// pod there: a quota of no pods holds them mid-way, with their PVCs made.
		importHTTP(images, "golden", "disk.qcow2")
		kubectl(`apiVersion: v1
kind: ResourceQuota
metadata:
  name: hold
spec:
  hard: {pods: "0"}
`, "apply", "-n", images, "-f", "-")
		// The VirtualMachinePvc's and the populated claim's image imports slowly (about 25 s).
		kubectl(vmi("slow", fmt.Sprintf("    http: %s/disk.qcow2?rate=400000", server)), "apply", "-n", ns, "-f", "-")

		vms := map[string]string{"copy": "copy", "block": "block", "vmpvc": "vmpvc", "populated": "populated"}
		for vm, claim := range vms {
			kubectl(kubeVirtVM(vm, "Once", claim), "apply", "-n", ns, "-f", "-")
		}
		kubectl(diskOf("copy", images, "Filesystem", "512Mi")+"---\n"+diskOf("block", images, "Block", "256Mi")+"---\n"+
			vmPvc("vmpvc", "slow", "512Mi")+`---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: populated
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 512Mi}}
  dataSourceRef: {apiGroup: hypercloud.tmaxanc.com, kind: VirtualMachineImage, name: slow}
`, "apply", "-n", ns, "-f", "-")

		// The copies' PVCs exist, pre-bound to the volumes diskpipe fills, and stay Pending;
		// no VM starts while any disk is incomplete.
		Eventually(func() string {
			out, _, _ := cluster.Kubectl(context.Background(), nil, "get", "pvc", "copy", "block", "-n", ns, "-o", "jsonpath={.items[*].status.phase}")
			return out
		}, time.Minute, time.Second).Should(Equal("Pending Pending"))
		// The slow image's importer is deleted mid-way, as an eviction would: the import is made
		// again, and its VMs go on waiting for the whole disk.
		Eventually(phase(ns, "vmimage", "slow"), time.Minute, 200*time.Millisecond).Should(Equal("Importing Running"))
		time.Sleep(2 * time.Second) // part of the image is in
		kubectl("", "delete", "pod", "vmim-slow-import-0", "-n", ns, "--wait=false")
		deleted := time.Now()
		// For 20 s no VM runs and no claim is bound whose disk is incomplete: the copies', held
		// by the quota, and the slow image's VMs' until it is imported again (its import goes on
		// from where the deleted pod left it, so it may end within the 20 s). Each look reads the
		// VMs and claims first, then the image: an image not imported then was not before.
		imported := time.Duration(0)
		Consistently(func() []string {
			seen := kubectl("", "get", "vmi", "-n", ns, "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.phase} {end}`) +
				kubectl("", "get", "pvc", "copy", "block", "vmpvc", "populated", "-n", ns, "--ignore-not-found", "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.phase} {end}`)
			if imported == 0 && phase(ns, "vmimage", "slow")() == "Ready Imported" {
				imported = time.Since(deleted)
			}
			var early []string
			for _, s := range strings.Fields(seen) {
				name, state, _ := strings.Cut(s, "=")
				if imported > 0 && (name == "vmpvc" || name == "populated") {
					continue
				}
				if state == "Running" || state == "Succeeded" || state == "Bound" {
					early = append(early, s)
				}
			}
			return early
		}, 20*time.Second, time.Second).Should(BeEmpty(), "nothing runs on, and no claim is bound to, an incomplete disk")
		if imported > 0 {
			GinkgoWriter.Printf("the slow image was imported again %.1f s after its importer was deleted\n", imported.Seconds())
		}
		Expect(phase(ns, "dvol", "copy")()).To(Equal("Cloning WaitingForCloneSource"))

		released := time.Now()
		kubectl("", "delete", "resourcequota", "hold", "-n", images)
		sizes := map[string]int64{"copy": grown(512 << 20), "block": 256 << 20, "vmpvc": grown(512 << 20), "populated": grown(512 << 20)}
		for vm := range vms {
			Expect(guestConsole(ns, vm, "")[0]).To(Equal(fmt.Sprintf("DISKPIPE-BOOT disk=vda size=%d marker=%s", sizes[vm], bootdisk.Marker)), vm)
			GinkgoWriter.Printf("%s: booted %.1f s after the copies were let go\n", vm, time.Since(released).Seconds())
		}
	})

	// Once, under CI's load, its guest printed nothing in 4 minutes (the other VMs of the run
	// booted in 25 to 70 s; alone it boots in 30 s): retried once, and a guest that does not boot
	// shows its console's last lines.
	It("makes the seed's VirtualMachine a KubeVirt VM: KubeVirt's refusal of its hardware is its status, and, fixed, it runs and boots from its diskpipe disk", FlakeAttempts(2), func() {
		ns := vmNamespace()
		importHTTP(ns, "centos", "disk.qcow2")
		kubectl(strings.Replace(diskFromImage("disk1-from-image", "centos", "CSIClone"), "  cloneStrategy: CSIClone\n", "", 1), "apply", "-n", ns, "-f", "-")
		seed, err := os.ReadFile(filepath.Join("..", "fixtures", "seeds", "000-virtualmachine.yaml"))
		Expect(err).NotTo(HaveOccurred())
		kubectl(strings.Replace(string(seed), "namespace: test2", "namespace: "+ns, 1), "apply", "-n", ns, "-f", "-")
		// As written, the seed asks for a macvtap interface (a feature gate, and a Multus
		// network, this cluster has not): KubeVirt's webhook says so.
		Eventually(phase(ns, "ksvm", "vm1"), 2*time.Minute, time.Second).Should(Equal("Failed KubeVirtRefused"))
		msg := kubectl("", "get", "ksvm", "vm1", "-n", ns, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].message}`)
		Expect(msg).To(And(ContainSubstring("KubeVirt refused the VirtualMachine made of spec.hardware"),
			ContainSubstring(`admission webhook "virtualmachine-validator.kubevirt.io" denied the request: Macvtap feature gate is not enabled`)))
		Expect(phase(ns, "dvol", "disk0-vm-blank")()).To(Equal("Ready Made"), "its disks are made all the same")

		// The seed's CPU model, Westmere, is not one this machine's CPU offers (libvirt finds no
		// named model usable on it): KubeVirt could not schedule the VM. It goes with the
		// interface.
		kubectl("", "patch", "ksvm", "vm1", "-n", ns, "--type=json", "-p", `[
{"op": "remove", "path": "/spec/hardware/domain/devices/interfaces"},
{"op": "remove", "path": "/spec/hardware/domain/cpu/model"},
{"op": "add", "path": "/spec/hardware/domain/devices/autoattachPodInterface", "value": false}]`)
		Eventually(phase(ns, "ksvm", "vm1"), 2*time.Minute, time.Second).Should(Equal("Ready VirtualMachineCreated"))
		Eventually(func() string {
			return observe("get", "ksvm", "vm1", "-n", ns, "-o", "jsonpath={.status.printableStatus}")
		},
			3*time.Minute, 500*time.Millisecond).Should(Equal("Running"), "KubeVirt's printable status, mirrored")
		// disk1 (bootOrder 1) is the second disk, vdb; disk0-vm-blank, the blank 4Gi, is vda.
		lines := guestConsole(ns, "vm1", "")
		Expect(lines[0]).To(Equal(fmt.Sprintf("DISKPIPE-BOOT disk=vdb size=%d marker=%s", bootdisk.Size, bootdisk.Marker)))
		Expect(lines).To(ContainElement(fmt.Sprintf("DISKPIPE-DISK disk=vda size=%d marker=", grown(4<<30))))

		kubectl("", "delete", "ksvm", "vm1", "-n", ns, "--wait=true", "--timeout=60s")
		Eventually(func() string {
			return observe("get", "virtualmachines.kubevirt.io,vmi,diskvolumes,pvc", "-n", ns, "-o", "name")
		}, 2*time.Minute, time.Second).Should(Equal("diskvolume.diskvolume.kubesphere.io/disk1-from-image\n"+
			"persistentvolumeclaim/disk1-from-image\npersistentvolumeclaim/vmim-centos\n"),
			"the KubeVirt VM and its VMI, the VM's blank disk and its PVC are gone; the disk it only used stays")
	})

	It("snapshots a stopped VM on a diskpipe disk and a dataVolumeTemplates disk with KubeVirt's VirtualMachineSnapshot, restores it in place, and the restored disks hold the snapshot's bytes and boot", func() {
		ns := vmNamespace()
		importHTTP(ns, "golden", "disk.qcow2")
		kubectl(vmPvc("root", "golden", "512Mi"), "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "vmpvc", "root"), 2*time.Minute, time.Second).Should(Equal("Ready Made"))
		// Manual: virtctl start boots it once (a Halted VM it would turn to Always, and restart
		// each time the guest powers off). Its second disk is a DataVolume of its own, which
		// KubeVirt restores through CDI's API (a DataVolume marked pre-populated).
		vm := kubeVirtVM("snapped", "Manual", "root")
		vm = strings.Replace(vm, "  runStrategy: Manual\n", `  runStrategy: Manual
  dataVolumeTemplates:
  - metadata: {name: snapped-data}
    spec:
      storage: {resources: {requests: {storage: 64Mi}}}
      source: {blank: {}}
`, 1)
		vm = strings.Replace(vm, "        resources:", "          - name: data\n            disk: {bus: virtio}\n        resources:", 1)
		vm += "      - name: data\n        dataVolume: {name: snapped-data}\n"
		kubectl(vm, "apply", "-n", ns, "-f", "-")
		Eventually(func() string {
			return observe("get", "vm", "snapped", "-n", ns, "-o", "jsonpath={.status.printableStatus}") + " " +
				observe("get", "dv", "snapped-data", "-n", ns, "-o", "jsonpath={.status.phase}")
		}, 2*time.Minute, time.Second).Should(Equal("Stopped Succeeded"))

		kubectl(`apiVersion: snapshot.kubevirt.io/v1beta1
kind: VirtualMachineSnapshot
metadata:
  name: before
spec:
  source: {apiGroup: kubevirt.io, kind: VirtualMachine, name: snapped}
`, "apply", "-n", ns, "-f", "-")
		Eventually(func() string {
			return observe("get", "vmsnapshot", "before", "-n", ns, "-o", "jsonpath={.status.phase} {.status.readyToUse}")
		}, 2*time.Minute, time.Second).Should(Equal("Succeeded true"))
		Expect(kubectl("", "get", "volumesnapshot", "-n", ns, "-o", "jsonpath={.items[*].spec.source.persistentVolumeClaimName}")).To(And(ContainSubstring("root"), ContainSubstring("snapped-data")),
			"KubeVirt snapshotted both disks' PVCs by CSI")

		// After the snapshot the disks are changed (the boot disk's marker overwritten, bytes
		// written on the blank one), as a guest would change them; copies of what they held are
		// kept to compare the restored disks with.
		change := func(claim string, at int64, b []byte) string {
			before := filepath.Join(work, ns+"-"+claim+"-before.img")
			disk := filepath.Join(cluster.VolumePath(ns, claim), "disk.img")
			run("cp", "--sparse=always", disk, before)
			f, err := os.OpenFile(disk, os.O_WRONLY, 0)
			Expect(err).NotTo(HaveOccurred())
			_, err = f.WriteAt(b, at)
			Expect(err).NotTo(HaveOccurred())
			Expect(f.Close()).To(Succeed())
			Expect(exec.Command("qemu-img", "compare", "-f", "raw", "-F", "raw", before, disk).Run()).To(HaveOccurred(), "%s was changed", claim)
			return before
		}
		before := change("root", bootdisk.MarkerOffset, make([]byte, 512))
		dataBefore := change("snapped-data", 0, []byte("written after the snapshot"))

		kubectl(`apiVersion: snapshot.kubevirt.io/v1beta1
kind: VirtualMachineRestore
metadata:
  name: back
spec:
  target: {apiGroup: kubevirt.io, kind: VirtualMachine, name: snapped}
  virtualMachineSnapshotName: before
`, "apply", "-n", ns, "-f", "-")
		Eventually(func() string {
			return observe("get", "vmrestore", "back", "-n", ns, "-o", "jsonpath={.status.complete}")
		}, 3*time.Minute, time.Second).Should(Equal("true"), func() string {
			return kubectl("", "get", "vmrestore", "back", "-n", ns, "-o", "yaml") +
				kubectl("", "get", "dv,pvc,dvol", "-n", ns, "-o", "wide") +
				kubectl("", "get", "dv", "-n", ns, "-o", "yaml")
		})
		restored := kubectl("", "get", "vm", "snapped", "-n", ns, "-o", "jsonpath={.spec.template.spec.volumes[0].persistentVolumeClaim.claimName}")
		Expect(restored).NotTo(Equal("root"), "the VM now names the PVC KubeVirt restored from the snapshot")
		Eventually(func() string { return observe("get", "pvc", restored, "-n", ns, "-o", "jsonpath={.status.phase}") }, time.Minute, time.Second).Should(Equal("Bound"))
		got := filepath.Join(cluster.VolumePath(ns, restored), "disk.img")
		Expect(exec.Command("qemu-img", "compare", "-f", "raw", "-F", "raw", before, got).CombinedOutput()).To(ContainSubstring("Images are identical"))
		// The DataVolume: KubeVirt names a new one in the template, marked pre-populated on the
		// claim it restored; diskpipe takes it as whole, writing nothing.
		dv := kubectl("", "get", "vm", "snapped", "-n", ns, "-o", "jsonpath={.spec.dataVolumeTemplates[0].metadata.name}")
		Expect(dv).NotTo(Equal("snapped-data"), "the VM's template names the DataVolume KubeVirt restored")
		Eventually(func() string { return observe("get", "dv", dv, "-n", ns, "-o", "jsonpath={.status.phase}") }, 2*time.Minute, time.Second).Should(Equal("Succeeded"))
		Expect(exec.Command("qemu-img", "compare", "-f", "raw", "-F", "raw", dataBefore, filepath.Join(cluster.VolumePath(ns, dv), "disk.img")).CombinedOutput()).
			To(ContainSubstring("Images are identical"))

		virtctl("start", "snapped", "-n", ns)
		Expect(guestConsole(ns, "snapped", "")[0]).To(Equal(fmt.Sprintf("DISKPIPE-BOOT disk=vda size=%d marker=%s", grown(512<<20), bootdisk.Marker)))
	})

	// One run in three here, KubeVirt's launcher failed the attach itself ("SyncVMI failed:
	// LibvirtError(Code=55 ...): transient domains do not have any persistent config", its
	// AttachDeviceFlags with the live and config flags, under Debian 12's libvirt 9.0, the launcher
	// image's before Debian 13's); diskpipe's disk was Ready and its claim Bound. A second attempt, in a new namespace, is shown as such
	// in the report.
	It("hot-plugs a DiskVolume into a running VM with virtctl addvolume, and the guest sees it whole", FlakeAttempts(2), func() {
		ns := vmNamespace()
		importHTTP(ns, "golden", "disk.qcow2")
		kubectl(vmPvc("root", "golden", "256Mi")+"---\n"+diskOf("extra", "", "Filesystem", "512Mi"), "apply", "-n", ns, "-f", "-")
		for _, d := range []string{"vmpvc/root", "dvol/extra"} {
			kind, name, _ := strings.Cut(d, "/")
			Eventually(phase(ns, kind, name), 2*time.Minute, time.Second).Should(Equal("Ready Made"), d)
		}
		// The firmware's serial keeps the guest up, watching for new disks.
		vm := strings.Replace(kubeVirtVM("hot", "Always", "root"), "      domain:\n", "      domain:\n        firmware: {serial: "+bootdisk.HotplugSerial+"}\n", 1)
		kubectl(vm, "apply", "-n", ns, "-f", "-")
		DeferCleanup(func() { kubectl("", "delete", "vm", "hot", "-n", ns, "--wait=false") })
		Expect(guestConsole(ns, "hot", "")).To(Equal([]string{
			fmt.Sprintf("DISKPIPE-BOOT disk=vda size=%d marker=%s", grown(256<<20), bootdisk.Marker),
			fmt.Sprintf("DISKPIPE-DISK disk=vda size=%d marker=%s", grown(256<<20), bootdisk.Marker),
		}))
		pod, _ := launcherPod(ns, "hot", "")
		// Should the attach fail again, what libvirt said about the domain and its daemon.
		DeferCleanup(func() {
			if CurrentSpecReport().Failed() {
				out, _, _ := cluster.Kubectl(context.Background(), nil, "logs", "-n", ns, pod, "-c", "compute")
				var said []string
				for _, l := range strings.Split(out, "\n") {
					if strings.Contains(l, `"level":"error"`) || strings.Contains(l, "virtqemud") || strings.Contains(l, "ransient") {
						said = append(said, l)
					}
				}
				GinkgoWriter.Printf("the launcher's errors and libvirt's daemon:\n%s\n", strings.Join(said[max(0, len(said)-40):], "\n"))
			}
		})

		virtctl("addvolume", "hot", "--volume-name=extra", "--bus=virtio", "-n", ns)
		Eventually(func() []string { return consoleLines(ns, pod) }, 3*time.Minute, 2*time.Second).Should(
			ContainElement(fmt.Sprintf("DISKPIPE-DISK disk=vdb size=%d marker=%s", grown(512<<20), bootdisk.Marker)),
			"the hot-plugged disk, whole, in the guest")
		Expect(kubectl("", "get", "vmi", "hot", "-n", ns, "-o", `jsonpath={.status.volumeStatus[?(@.name=="extra")].phase}`)).To(Equal("Ready"))
	})

	// A measurement, not a story (each boot is proven by the specs above): make bench-kubevirt
	// runs it; CI's real node leaves it out.
	It("boots five VMs made at once from one golden image", benchmark, func() {
		ns := vmNamespace()
		importHTTP(ns, "golden", "disk.qcow2")
		var all strings.Builder
		for i := range 5 {
			fmt.Fprintf(&all, "%s---\n%s---\n", vmPvc(fmt.Sprintf("disk%d", i), "golden", "256Mi"),
				kubeVirtVM(fmt.Sprintf("vm%d", i), "Once", fmt.Sprintf("disk%d", i)))
		}
		start := time.Now()
		kubectl(all.String(), "apply", "-n", ns, "-f", "-")
		var wg sync.WaitGroup
		took := make([]time.Duration, 5)
		for i := range 5 {
			wg.Go(func() {
				defer GinkgoRecover()
				Expect(guestConsole(ns, fmt.Sprintf("vm%d", i), "")[0]).To(HavePrefix("DISKPIPE-BOOT disk=vda size=%d ", grown(256<<20)))
				took[i] = time.Since(start)
			})
		}
		wg.Wait()
		GinkgoWriter.Printf("five VMs from kubectl apply to each guest's line: %v\n", took)
		// Where each one's time went, from the objects' own timestamps (one-second resolution).
		for i := range 5 {
			since := func(stamp string) string {
				t, err := time.Parse(time.RFC3339, stamp)
				if err != nil {
					return "?"
				}
				return fmt.Sprintf("%.0fs", t.Sub(start.Truncate(time.Second)).Seconds())
			}
			ready := kubectl("", "get", "vmpvc", fmt.Sprintf("disk%d", i), "-n", ns, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].lastTransitionTime}`)
			var phases []string
			for _, p := range []string{"Scheduling", "Scheduled", "Running"} {
				stamp := kubectl("", "get", "vmi", fmt.Sprintf("vm%d", i), "-n", ns, "-o",
					fmt.Sprintf(`jsonpath={.status.phaseTransitionTimestamps[?(@.phase==%q)].phaseTransitionTimestamp}`, p))
				phases = append(phases, p+" "+since(stamp))
			}
			GinkgoWriter.Printf("vm%d: disk Ready %s, VMI %s, guest's line %.0fs\n", i, since(ready), strings.Join(phases, ", "), took[i].Seconds())
		}
	})
})

// Short names: kubectl expands a short name two APIs share to whichever it finds first (and
// warns), so none of diskpipe's or of the CDI API it serves may be one of KubeVirt's.
var _ = Describe("short names", afterKubeVirtRollout, func() {
	BeforeEach(requireKubeVirt)

	It("of diskpipe's kinds and of CDI's are none of the names the real KubeVirt serves", func() {
		cfg, err := clientcmd.BuildConfigFromFlags("", cluster.KubeconfigFile())
		Expect(err).NotTo(HaveOccurred())
		disc, err := discovery.NewDiscoveryClientForConfig(cfg)
		Expect(err).NotTo(HaveOccurred())
		lists, err := disc.ServerPreferredResources()
		if err != nil && !discovery.IsGroupDiscoveryFailedError(err) { // an aggregated API not up is no matter here
			Expect(err).NotTo(HaveOccurred())
		}
		ours := map[string]bool{"hypercloud.tmaxanc.com": true, "virtualmachine.kubesphere.io": true, "diskvolume.kubesphere.io": true,
			"cdi.kubevirt.io": true, "upload.cdi.kubevirt.io": true}
		owner, kubevirt := map[string]string{}, 0
		for _, l := range lists {
			gv, err := schema.ParseGroupVersion(l.GroupVersion)
			Expect(err).NotTo(HaveOccurred())
			for _, r := range l.APIResources {
				for _, n := range r.ShortNames {
					name := r.Name + "." + gv.Group
					if was, ok := owner[n]; ok && (ours[gv.Group] || ours[strings.SplitN(was, ".", 2)[1]]) {
						Fail(fmt.Sprintf("short name %q names both %s and %s", n, was, name))
					}
					owner[n] = name
					if gv.Group == "kubevirt.io" {
						kubevirt++
					}
				}
			}
		}
		Expect(kubevirt).To(BeNumerically(">", 3), "KubeVirt's kinds are served, with their short names")
		Expect(owner).To(HaveKeyWithValue("vmimage", "virtualmachineimages.hypercloud.tmaxanc.com"))
		Expect(owner).To(HaveKeyWithValue("vmim", "virtualmachineinstancemigrations.kubevirt.io"))
	})
})

// requireKubeVirt skips a spec where no KubeVirt runs VMs.
func requireKubeVirt() {
	if !kubeVirt() {
		Skip("no KubeVirt runs VMs on this cluster: the real node with DISKPIPE_KUBEVIRT=1 (make kubevirt-images) runs these")
	}
}

// vmNamespace is a new namespace where KubeVirt may run VMs: its launcher pods are privileged,
// so the namespace enforces the privileged Pod Security level (KubeVirt refuses to make a
// launcher pod in a restricted one: "it needs a privileged namespace to run").
func vmNamespace() string {
	GinkgoHelper()
	ns := namespace()
	kubectl("", "label", "namespace", ns, "pod-security.kubernetes.io/enforce=privileged", "--overwrite")
	return ns
}

// kubeVirtVM is a KubeVirt VirtualMachine that boots from the PVCs claims (the first is vda):
// no network (its pod interface would need a tun device per VM), 128 MiB.
func kubeVirtVM(name, runStrategy string, claims ...string) string {
	var disks, volumes strings.Builder
	for _, c := range claims {
		fmt.Fprintf(&disks, "          - name: %s\n            disk: {bus: virtio}\n", c)
		fmt.Fprintf(&volumes, "      - name: %s\n        persistentVolumeClaim: {claimName: %s}\n", c, c)
	}
	return fmt.Sprintf(`apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: %s
spec:
  runStrategy: %s
  template:
    spec:
      domain:
        devices:
          autoattachPodInterface: false
          disks:
%s        resources: {requests: {memory: 128Mi}}
      volumes:
%s`, name, runStrategy, disks.String(), volumes.String())
}

// vmPvc is a VirtualMachinePvc of size from the VirtualMachineImage image.
func vmPvc(name, image, size string) string {
	return fmt.Sprintf(`apiVersion: hypercloud.tmaxanc.com/v1alpha1
kind: VirtualMachinePvc
metadata:
  name: %s
spec:
  virtualMachineImageName: %s
  pvc:
    accessModes: [ReadWriteOnce]
    resources: {requests: {storage: %s}}
`, name, image, size)
}

// diskOf is a DiskVolume of the VirtualMachineImage golden of namespace imageNS ("": the
// disk's own), of volume mode and size.
func diskOf(name, imageNS, mode, size string) string {
	return fmt.Sprintf(`apiVersion: diskvolume.kubesphere.io/v1alpha1
kind: DiskVolume
metadata:
  name: %s
spec:
  source:
    image: {name: golden, namespace: "%s", kind: VirtualMachineImage}
  volumeMode: %s
  resources: {requests: {storage: %s}}
`, name, imageNS, mode, size)
}

// vmiUID is the UID of VM name's VirtualMachineInstance, "" when there is none.
func vmiUID(ns, name string) string {
	out, _, _ := cluster.Kubectl(context.Background(), nil, "get", "vmi", name, "-n", ns, "--ignore-not-found", "-o", "jsonpath={.metadata.uid}")
	return out
}

// virtctl runs KubeVirt's virtctl, built from the KubeVirt module, against the cluster.
func virtctl(args ...string) {
	GinkgoHelper()
	virtctlOutput(args...)
}

// virtctlOutput runs virtctl and returns what it printed on its standard output.
func virtctlOutput(args ...string) string {
	GinkgoHelper()
	var stderr strings.Builder
	cmd := exec.Command(testenv.Path("bin", "kubevirt", "virtctl"), append([]string{"--kubeconfig", cluster.KubeconfigFile()}, args...)...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	Expect(err).NotTo(HaveOccurred(), "virtctl %s: %s%s", strings.Join(args, " "), out, stderr.String())
	return string(out)
}

// guestConsole waits for the bootable disk's lines on VM name's serial console, as KubeVirt
// logs it (the launcher pod's guest-console-log container), and returns them: the boot line,
// then one per disk. A VMI of UID not is not the one looked for (a run before a restart).
func guestConsole(ns, name, not string) []string {
	GinkgoHelper()
	return guestConsoleWithin(ns, name, not, 4*time.Minute)
}

// guestConsoleWithin is guestConsole waiting up to limit.
func guestConsoleWithin(ns, name, not string, limit time.Duration) []string {
	GinkgoHelper()
	var lines []string
	last := ""
	Eventually(func() string {
		pod, why := launcherPod(ns, name, not)
		if pod == "" {
			return why
		}
		lines = consoleLines(ns, pod)
		if len(lines) == 0 || !strings.HasPrefix(lines[0], "DISKPIPE-BOOT ") {
			last = ""
			// What the guest said instead (its firmware's last lines), for a boot that never comes.
			return fmt.Sprintf("no boot line yet in the console of %s (its last lines: %q)", pod, consoleTail(ns, pod, 5))
		}
		// The disks' lines follow the boot line: the same lines twice are all of them.
		read := strings.Join(lines, "\n")
		if read != last {
			last = read
			return "reading the console of " + pod + " again"
		}
		return lines[0]
	}, limit, 2*time.Second).Should(HavePrefix("DISKPIPE-BOOT "), "the guest's line on KubeVirt's serial console")
	return lines
}

// launcherPod is the launcher pod of VM name's VirtualMachineInstance (not of UID not), or ""
// and what there is instead.
func launcherPod(ns, name, not string) (pod, why string) {
	uid := vmiUID(ns, name)
	if uid == "" || uid == not {
		return "", "no new VMI yet; the VM is " + observe("get", "vm", name, "-n", ns, "-o", "jsonpath={.status.printableStatus}")
	}
	pods, errOut, err := cluster.Kubectl(context.Background(), nil, "get", "pods", "-n", ns, "-l", "kubevirt.io/created-by="+uid, "-o", "jsonpath={.items[*].metadata.name}")
	if err != nil {
		return "", "the launcher pods cannot be listed: " + strings.TrimSpace(errOut)
	}
	if pod, _, _ = strings.Cut(pods, " "); pod == "" {
		return "", "no launcher pod yet; the VM is " + observe("get", "vm", name, "-n", ns, "-o", "jsonpath={.status.printableStatus}")
	}
	return pod, ""
}

// consoleLines are the bootable disk's lines in a launcher pod's serial console log.
// consoleTail is the last n lines of the serial console of launcher pod ns/pod that say
// something.
func consoleTail(ns, pod string, n int) []string {
	out, _, _ := cluster.Kubectl(context.Background(), nil, "logs", "-n", ns, pod, "-c", "guest-console-log", "--tail", "50")
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines[max(0, len(lines)-n):]
}

func consoleLines(ns, pod string) []string {
	out, _, _ := cluster.Kubectl(context.Background(), nil, "logs", "-n", ns, pod, "-c", "guest-console-log")
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if i := strings.Index(l, "DISKPIPE-"); i >= 0 && strings.Contains(l, " marker=") {
			lines = append(lines, strings.TrimSpace(l[i:]))
		}
	}
	return lines
}
