package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/diskpipe/diskpipe/importer/registrytest"
	"github.com/diskpipe/diskpipe/test/bootdisk"
	realcluster "github.com/diskpipe/diskpipe/test/cluster"
	"github.com/diskpipe/diskpipe/test/pki"
	"github.com/diskpipe/diskpipe/test/testenv"
)

// importBytes is what diskpipe's pods wrote into volumes for imports from source (a kind:
// http, pvc, ...) in ns.
func importBytes(ns, source string) int64 { return operationBytes(ns, "import", source) }

// operationBytes is what diskpipe's pods wrote for operation (import, clone, ...) from source
// in ns: the sum of the managers' diskpipe_operation_bytes_total for the namespace (the leader
// counts them), read from each manager pod's metrics port.
func operationBytes(ns, operation, source string) int64 {
	texts, err := node().ManagerMetrics(context.Background())
	Expect(err).NotTo(HaveOccurred())
	var sum float64
	for _, text := range texts {
		for _, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, "diskpipe_operation_bytes_total{") && strings.Contains(line, `namespace="`+ns+`"`) &&
				strings.Contains(line, `operation="`+operation+`"`) && strings.Contains(line, `source="`+source+`"`) {
				v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
				Expect(err).NotTo(HaveOccurred(), line)
				sum += v
			}
		}
	}
	return int64(sum)
}

// These specs are KubeVirt's own use of CDI's API, served by diskpipe (cdi.compatibility.enabled,
// which the real node's install sets where KubeVirt runs): VMs whose disks are
// dataVolumeTemplates, as KubeVirt users and its instance types write them.
var _ = Describe("CDI's API under the real KubeVirt", afterKubeVirtRollout, func() {
	BeforeEach(requireKubeVirt)

	It("boots VMs whose dataVolumeTemplates import by http and clone a VolumeSnapshot DataSource and a PVC of another namespace; a failed import is the VM's DataVolumeError; deleting a VM deletes its DataVolumes and PVCs", func() {
		ns, golden := vmNamespace(), namespace()
		// The golden disk of a DataSource, in a namespace of its own, as KubeVirt's common
		// instance types name them (kubevirt-os-images); the DataSource names its snapshot, as
		// DataImportCrons keep them on Ceph RBD.
		importHTTP(golden, "golden", "disk.qcow2")
		kubectl(diskOf("fedora", "", "Filesystem", "512Mi"), "apply", "-n", golden, "-f", "-")
		// A bootable volume of block mode, whose disk is the whole device, made into a VM at
		// its own size (what "create a VM from a bootable volume" writes): its copy into a
		// filesystem volume needs the filesystem's share besides, as CDI sizes the claim.
		kubectl(diskOf("fedora-block", "", "Block", "512Mi")+`---
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataSource
metadata:
  name: fedora-block
spec:
  source:
    pvc: {name: fedora-block, namespace: `+golden+`}
`, "apply", "-n", golden, "-f", "-")
		Eventually(phase(golden, "dvol", "fedora"), 2*time.Minute, time.Second).Should(Equal("Ready Made"))
		Eventually(phase(golden, "dvol", "fedora-block"), 2*time.Minute, time.Second).Should(Equal("Ready Made"))
		kubectl(volumeSnapshot("fedora", "fedora")+`---
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataSource
metadata:
  name: fedora
spec:
  source:
    snapshot: {name: fedora, namespace: `+golden+`}
`, "apply", "-n", golden, "-f", "-")
		Eventually(func() string {
			return observe("get", "datasource", "fedora", "-n", golden, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		}, 2*time.Minute, time.Second).Should(Equal("True"))
		grantCloneSource(golden, ns)

		start := time.Now()
		// The http import's disk is on a class that binds at the first consumer, as most local
		// storage does: the staging image's volume and the disk's are bound by the pods that
		// write them.
		lazy := strings.Replace(dvVM("fromhttp", fmt.Sprintf("source:\n        http: {url: %q}", server+"/disk.qcow2")),
			"storage:\n", "storage:\n        storageClassName: "+realcluster.WFFCClass+"\n", 1)
		kubectl(lazy+"---\n"+
			dvVM("fromref", "sourceRef: {kind: DataSource, name: fedora, namespace: "+golden+"}")+"---\n"+
			dvVM("fromblock", "sourceRef: {kind: DataSource, name: fedora-block, namespace: "+golden+"}")+"---\n"+
			dvVM("fromotherns", "source:\n        pvc: {namespace: "+golden+", name: fedora}")+"---\n"+
			dvVM("broken", fmt.Sprintf("source:\n        http: {url: %q}", server+"/no-such-disk.qcow2")), "apply", "-n", ns, "-f", "-")

		// The import that cannot succeed: KubeVirt shows it as the VM's status, with diskpipe's
		// reason in the DataVolume's.
		Eventually(func() string {
			return observe("get", "vm", "broken", "-n", ns, "-o", "jsonpath={.status.printableStatus}")
		}, 3*time.Minute, time.Second).Should(Equal("DataVolumeError"))
		Expect(kubectl("", "get", "dv", "broken-root", "-n", ns, "-o", `jsonpath={.status.phase} {.status.conditions[?(@.type=="Running")].reason}`)).
			To(Equal("Failed Error"))
		Expect(kubectl("", "get", "dv", "broken-root", "-n", ns, "-o", `jsonpath={.status.conditions[?(@.type=="Running")].message}`)).
			To(ContainSubstring("404"))
		// KubeVirt's event on the VM (its conditions hold only its own sync errors).
		Eventually(func() string {
			return observe("get", "events", "-n", ns, "--field-selector", "involvedObject.kind=VirtualMachine,involvedObject.name=broken,reason=FailedDataVolumeImport",
				"-o", "jsonpath={range .items[*]}{.message}{end}")
		}, time.Minute, time.Second).Should(ContainSubstring("DataVolume broken-root failed to import disk image"))

		var wg sync.WaitGroup
		for _, vm := range []string{"fromhttp", "fromref", "fromblock", "fromotherns"} {
			wg.Go(func() {
				defer GinkgoRecover()
				line := guestConsole(ns, vm, "")[0]
				GinkgoWriter.Printf("%s: from kubectl apply to the guest's line: %.1f s\n", vm, time.Since(start).Seconds())
				Expect(line).To(HavePrefix("DISKPIPE-BOOT disk=vda size="), vm)
				Expect(line).To(HaveSuffix(" marker="+bootdisk.Marker), vm)
				size, err := strconv.ParseInt(strings.Fields(strings.TrimPrefix(line, "DISKPIPE-BOOT disk=vda size="))[0], 10, 64)
				Expect(err).NotTo(HaveOccurred())
				Expect(size).To(BeNumerically(">=", 512<<20), "%s: the guest sees at least the size the template asks for", vm)
			})
		}
		wg.Wait()
		Expect(kubectl("", "get", "dv", "-n", ns, "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.phase} {.status.progress};{end}`)).
			To(Equal("broken-root=Failed N/A;fromblock-root=Succeeded 100.0%;fromhttp-root=Succeeded 100.0%;fromotherns-root=Succeeded 100.0%;fromref-root=Succeeded 100.0%;"))

		// What the http import wrote: the importer writes the disk's data once, into the staging
		// image's volume, with no scratch copy (the manager counts it); the DataVolume's claim is
		// a clone of it that the storage makes (here a sparse copy).
		written := importBytes(ns, "http")
		var disk syscall.Stat_t
		Expect(syscall.Stat(filepath.Join(cluster.VolumePath(ns, "fromhttp-root"), "disk.img"), &disk)).To(Succeed())
		source, err := os.Stat(images["qcow2"])
		Expect(err).NotTo(HaveOccurred())
		GinkgoWriter.Printf("http dataVolumeTemplates: the source is %d bytes (qcow2), the disk %d bytes (virtual); "+
			"diskpipe's importers wrote %d bytes for the http import, and the VM's disk takes %d bytes on the node's storage\n",
			source.Size(), disk.Size, written, disk.Blocks*512)
		Expect(written).To(BeNumerically(">", 0), "the manager counted the import's bytes")
		Expect(written).To(BeNumerically("<=", disk.Size), "one copy of the data at most: nothing staged twice")
		Eventually(func() string { return observe("get", "vmimage", "-n", ns, "-o", "name") }, time.Minute, time.Second).
			Should(Equal("virtualmachineimage.hypercloud.tmaxanc.com/dv-broken-root\n"), "the staging golden of the imports that succeeded are gone")
		Eventually(func() string {
			return observe("get", "pvc,pods", "-n", golden, "-l", "diskpipe.io/clone-for", "-o", "name")
		}, time.Minute, time.Second).
			Should(BeEmpty(), "the snapshot's volume restored for the copy is gone")

		kubectl("", "delete", "vm", "fromhttp", "fromref", "fromblock", "fromotherns", "broken", "-n", ns, "--wait=true", "--timeout=120s")
		Eventually(func() string {
			return observe("get", "dv,pvc,diskvolumes,vmimage", "-n", ns, "-o", "name")
		}, 2*time.Minute, time.Second).Should(BeEmpty(), "the VMs' DataVolumes, and what made them, are gone")
	})

	It("boots VMs whose dataVolumeTemplates pull a registry's container disk (its CA in certConfigMap) with a blank disk beside it, and clone a PVC of the VM's namespace", func() {
		ns := vmNamespace()
		// The registry serves TLS with a CA of the test's own, which the DataVolume names.
		ca, err := pki.New(filepath.Join(work, "registry-pki-"+ns), "registry-ca")
		Expect(err).NotTo(HaveOccurred())
		crt, key, err := ca.Issue("registry", "registry", nil, cluster.HostAddress())
		Expect(err).NotTo(HaveOccurred())
		caPEM, err := os.ReadFile(ca.CAFile)
		Expect(err).NotTo(HaveOccurred())
		pool := x509.NewCertPool()
		Expect(pool.AppendCertsFromPEM(caPEM)).To(BeTrue())
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
		addr := registrytest.StartAtWith(GinkgoT(), cluster.HostAddress(), fmt.Sprintf("  tls:\n    certificate: %s\n    key: %s\n", crt, key), client)
		img := registrytest.ContainerDisk(GinkgoT(), images["qcow2"], "amd64", "disk")
		registrytest.PushWith(GinkgoT(), client, "https://"+addr, "", "", "containerdisks/boot", "1", img.Manifest,
			"application/vnd.oci.image.manifest.v1+json", img.Blobs)

		// A PVC of the VM's namespace that holds the disk, to clone.
		importHTTP(ns, "golden", "disk.qcow2")
		kubectl(diskOf("base", "", "Filesystem", "512Mi"), "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "dvol", "base"), 3*time.Minute, time.Second).Should(HavePrefix("Ready"))
		grantCloneSource(ns, ns)

		kubectl(fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata: {name: registry-ca}
data: {ca.pem: %q}
---
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: fromregistry
spec:
  runStrategy: Once
  dataVolumeTemplates:
  - metadata: {name: fromregistry-root}
    spec:
      storage: {resources: {requests: {storage: 512Mi}}}
      source:
        registry: {url: "docker://%s/containerdisks/boot:1", certConfigMap: registry-ca}
  - metadata: {name: fromregistry-data}
    spec:
      storage: {resources: {requests: {storage: 128Mi}}}
      source: {blank: {}}
  template:
    spec:
      domain:
        devices:
          autoattachPodInterface: false
          disks:
          - {name: root, disk: {bus: virtio}}
          - {name: data, disk: {bus: virtio}}
        resources: {requests: {memory: 128Mi}}
      volumes:
      - {name: root, dataVolume: {name: fromregistry-root}}
      - {name: data, dataVolume: {name: fromregistry-data}}
---
`, caPEM, addr)+dvVM("frompvc", "source:\n        pvc: {namespace: "+ns+", name: base}"), "apply", "-n", ns, "-f", "-")

		lines := guestConsole(ns, "fromregistry", "")
		Expect(lines[0]).To(And(HavePrefix("DISKPIPE-BOOT disk=vda size="), HaveSuffix(" marker="+bootdisk.Marker)), "booted from the registry's disk")
		Expect(lines).To(ContainElement(And(HavePrefix("DISKPIPE-DISK disk=vdb size="), Not(ContainSubstring(bootdisk.Marker)))),
			"the blank disk: %q", lines)
		Expect(guestConsole(ns, "frompvc", "")[0]).To(And(HavePrefix("DISKPIPE-BOOT disk=vda size="), HaveSuffix(" marker="+bootdisk.Marker)),
			"booted from the clone of the namespace's PVC")
		Expect(kubectl("", "get", "dv", "-n", ns, "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.phase};{end}`)).
			To(Equal("frompvc-root=Succeeded;fromregistry-data=Succeeded;fromregistry-root=Succeeded;"))

		// pullMethod node: the node's containerd pulls the container disk from the registry it
		// pulls diskpipe's image from, which a pod cannot reach (its address is the node's
		// loopback): the import succeeds only as the node's pull.
		ref := node().Registry + "/containerdisks/node-pulled:1"
		archive := filepath.Join(work, "node-pulled-"+ns+".tar")
		for _, args := range [][]string{
			{"build", "--out", archive, "--ref", ref, "--arch", "amd64", "disk/disk.qcow2=" + images["qcow2"]},
			{"push", "--archive", archive, ref},
		} {
			out, err := exec.Command(testenv.Path("bin", "image"), args...).CombinedOutput()
			Expect(err).NotTo(HaveOccurred(), "image %s: %s", args[0], out)
		}
		kubectl(`apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {name: nodepulled}
spec:
  storage: {resources: {requests: {storage: 512Mi}}}
  source:
    registry: {url: "docker://`+ref+`", pullMethod: node}
`, "apply", "-n", ns, "-f", "-")
		Eventually(func() string {
			return observe("get", "dv", "nodepulled", "-n", ns, "-o", "jsonpath={.status.phase}")
		}, 3*time.Minute, time.Second).Should(Equal("Succeeded"))
		run("qemu-img", "compare", "-f", "raw", "-F", "qcow2", filepath.Join(cluster.VolumePath(ns, "nodepulled"), "disk.img"), images["qcow2"])
	})

	It("keeps a DataImportCron's DataSource on the newest revision: a VM made from it after an update by virtctl create vm boots the new one with the instancetype its labels name, and the old import is collected", func() {
		ns := vmNamespace()
		// The VM defaults a boot source names, as common-instancetypes ships them.
		kubectl(`apiVersion: instancetype.kubevirt.io/v1beta1
kind: VirtualMachineClusterInstancetype
metadata: {name: diskpipe.tiny}
spec:
  cpu: {guest: 1}
  memory: {guest: 128Mi}
---
apiVersion: instancetype.kubevirt.io/v1beta1
kind: VirtualMachineClusterPreference
metadata: {name: diskpipe.virtio}
spec:
  devices: {preferredDiskBus: virtio}
`, "apply", "-f", "-")
		// The source: the test disk as qcow2, then the same disk 64 MiB larger (a new release).
		source := filepath.Join(work, "cron-"+ns+".qcow2")
		start := time.Now().Truncate(time.Second)
		release(source, "", start.Add(-time.Hour))
		kubectl(fmt.Sprintf(`apiVersion: cdi.kubevirt.io/v1beta1
kind: DataImportCron
metadata:
  name: os
  labels:
    instancetype.kubevirt.io/default-instancetype: diskpipe.tiny
    instancetype.kubevirt.io/default-preference: diskpipe.virtio
spec:
  schedule: "@every 5s"
  managedDataSource: os
  importsToKeep: 1
  template:
    spec:
      source:
        http: {url: %q}
      storage: {}
`, server+"/"+filepath.Base(source)), "apply", "-n", ns, "-f", "-")
		imported := func() string {
			return observe("get", "dataimportcron", "os", "-n", ns, "-o", `jsonpath={.status.conditions[?(@.type=="UpToDate")].status} {.status.lastImportedPVC.name}`)
		}
		Eventually(imported, 3*time.Minute, time.Second).Should(HavePrefix("True vmim-"))
		first := strings.Fields(imported())[1]
		Eventually(func() string {
			return observe("get", "datasource", "os", "-n", ns, "-o", `jsonpath={.spec.source.pvc.name} {.status.conditions[?(@.type=="Ready")].status}`)
		}, time.Minute, time.Second).Should(Equal(first + " True"))
		grantCloneSource(ns, ns)

		// A new release: the next checks find it, import it, and the DataSource moves to it.
		release(source, "+64M", start)
		Eventually(imported, 3*time.Minute, time.Second).Should(And(HavePrefix("True vmim-"), Not(HaveSuffix(" "+first))))
		second := strings.Fields(imported())[1]
		Eventually(func() string {
			return observe("get", "datasource", "os", "-n", ns, "-o", "jsonpath={.spec.source.pvc.name}")
		}, time.Minute, time.Second).Should(Equal(second))
		// "Create a VM from this boot volume": KubeVirt infers the instancetype and preference
		// from the labels the DataImportCron passed to its DataSource.
		vm := virtctlOutput("create", "vm", "--name", "after", "--volume-import", "type:ds,src:"+ns+"/os,size:512Mi")
		vm = strings.Replace(vm, "devices: {}", "devices: {autoattachPodInterface: false}", 1) // no pod network here
		kubectl(vm, "apply", "-n", ns, "-f", "-")
		Expect(kubectl("", "get", "vm", "after", "-n", ns, "-o", "jsonpath={.spec.instancetype.name} {.spec.preference.name}")).
			To(Equal("diskpipe.tiny diskpipe.virtio"), "the instancetype and preference the DataSource's labels name")
		Expect(guestConsole(ns, "after", "")[0]).To(HavePrefix("DISKPIPE-BOOT disk=vda "))
		root := kubectl("", "get", "vm", "after", "-n", ns, "-o", "jsonpath={.spec.dataVolumeTemplates[0].metadata.name}")
		Expect("vmim-"+kubectl("", "get", "dvol", root, "-n", ns, "-o", "jsonpath={.spec.source.image.name}")).To(Equal(second),
			"the VM made after the update is cloned from the new revision's image")
		// importsToKeep 1: the first revision's image and golden PVC go.
		Eventually(func() string { return observe("get", "pvc", first, "-n", ns, "--ignore-not-found", "-o", "name") }, 2*time.Minute, time.Second).
			Should(BeEmpty())
	})

	It("uploads with the unmodified virtctl image-upload dv and pvc, and a VM boots both uploaded disks; a dataVolumeTemplates upload is filled by virtctl, then boots", func() {
		ns := vmNamespace()
		ip := kubectl("", "get", "service", "diskpipe-uploadproxy", "-n", "diskpipe-system", "-o", "jsonpath={.spec.clusterIP}:{.spec.ports[0].port}")
		upload := func(args ...string) (string, error) {
			start := time.Now()
			out, err := exec.Command(testenv.Path("bin", "kubevirt", "virtctl"), append([]string{"--kubeconfig", cluster.KubeconfigFile(), "image-upload"},
				append(args, "-n", ns, "--image-path="+images["qcow2"], "--uploadproxy-url=https://"+ip, "--insecure")...)...).CombinedOutput()
			GinkgoWriter.Printf("virtctl image-upload %s (%.1f s):\n%s\n", strings.Join(args, " "), time.Since(start).Seconds(), out)
			return string(out), err
		}
		out, err := upload("dv", "uploaded", "--size=512Mi")
		Expect(err).NotTo(HaveOccurred(), "virtctl image-upload dv: %s", out)
		Expect(out).To(ContainSubstring("Processing completed successfully"))
		proxyLog := kubectl("", "logs", "-n", "diskpipe-system", "-l", "app.kubernetes.io/component=uploadproxy", "--tail=-1")
		Expect(proxyLog).To(MatchRegexp(`"msg":"Upload stored; the disk is being made","namespace":"%s"`, ns),
			"virtctl took the asynchronous path, answered once the upload was stored, then waited on the claim's annotation")
		Expect(kubectl("", "get", "dv", "uploaded", "-n", ns, "-o", "jsonpath={.status.phase}")).To(Equal("Succeeded"))
		Expect(kubectl("", "get", "pvc", "uploaded", "-n", ns, "-o", "jsonpath={.status.phase}")).To(Equal("Bound"))

		// Into a PVC virtctl makes: it is Pending (its data source is its staging image) until
		// the populator has written the upload into it, and virtctl waits for that.
		out, err = upload("pvc", "bare", "--size=512Mi")
		Expect(err).NotTo(HaveOccurred(), "virtctl image-upload pvc: %s", out)
		Expect(out).To(ContainSubstring("Processing completed successfully"))
		Expect(kubectl("", "get", "pvc", "bare", "-n", ns, "-o", "jsonpath={.status.phase} {.spec.dataSourceRef.kind}/{.spec.dataSourceRef.name}")).
			To(Equal("Bound VirtualMachineImage/pvc-bare"))
		Eventually(func() string {
			return observe("get", "vmimage", "pvc-bare", "-n", ns, "--ignore-not-found", "-o", "name")
		}, time.Minute, time.Second).Should(BeEmpty(), "the staging image goes once the PVC holds the upload")

		// An existing PVC is not marked for an upload: virtctl says why.
		kubectl(`apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: existing
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 512Mi}}
`, "apply", "-n", ns, "-f", "-")
		// Once the storage has bound it: virtctl updates the claim without retrying, and the
		// binding's own updates of a new claim would be a conflict.
		Eventually(func() string {
			return observe("get", "pvc", "existing", "-n", ns, "-o", "jsonpath={.status.phase}")
		}, time.Minute, time.Second).Should(Equal("Bound"))
		out, err = upload("pvc", "existing", "--no-create")
		Expect(err).To(HaveOccurred())
		Expect(out).To(ContainSubstring("an existing PVC cannot be marked for an upload"))

		kubectl(strings.Replace(kubeVirtVM("booted", "Once", "uploaded", "bare"), "persistentVolumeClaim: {claimName: uploaded}", "dataVolume: {name: uploaded}", 1),
			"apply", "-n", ns, "-f", "-")
		lines := guestConsole(ns, "booted", "")
		Expect(lines[0]).To(HavePrefix("DISKPIPE-BOOT disk=vda size="))
		Expect(lines).To(ContainElement(And(HavePrefix("DISKPIPE-DISK disk=vdb size="), HaveSuffix(" marker="+bootdisk.Marker))),
			"the disk uploaded into a PVC")

		// A dataVolumeTemplates entry with an upload source: KubeVirt makes the DataVolume, whose
		// claim is there at once, Pending; virtctl fills it, and the VM starts once it is whole.
		kubectl(dvVM("toupload", "source: {upload: {}}"), "apply", "-n", ns, "-f", "-")
		Eventually(func() string {
			return observe("get", "dv", "toupload-root", "-n", ns, "--ignore-not-found", "-o", "jsonpath={.status.phase}")
		}, 2*time.Minute, time.Second).Should(Equal("UploadReady"))
		Expect(kubectl("", "get", "pvc", "toupload-root", "-n", ns, "-o", "jsonpath={.status.phase}")).To(Equal("Pending"))
		out, err = upload("dv", "toupload-root", "--no-create")
		Expect(err).NotTo(HaveOccurred(), "virtctl image-upload dv --no-create: %s", out)
		Expect(out).To(ContainSubstring("Processing completed successfully"))
		Expect(guestConsole(ns, "toupload", "")[0]).To(HavePrefix("DISKPIPE-BOOT disk=vda "))
	})
	It("exports a stopped VM's dataVolumeTemplates disk with KubeVirt's VirtualMachineExport as kubevirt content (raw and gzip, each whole), and its manifests, applied in another namespace, import through diskpipe and boot", func() {
		ns, other := vmNamespace(), vmNamespace()
		kubectl(strings.Replace(dvVM("exported", fmt.Sprintf("source:\n        http: {url: %q}", server+"/disk.qcow2")), "runStrategy: Once", "runStrategy: Halted", 1), "apply", "-n", ns, "-f", "-")
		Eventually(func() string {
			return observe("get", "dv", "exported-root", "-n", ns, "-o", "jsonpath={.status.phase}")
		}, 3*time.Minute, time.Second).Should(Equal("Succeeded"))
		token := "tok" + strconv.FormatInt(time.Now().UnixNano(), 36)
		kubectl("", "create", "secret", "generic", "export-token", "-n", ns, "--from-literal=token="+token)
		kubectl(`apiVersion: export.kubevirt.io/v1beta1
kind: VirtualMachineExport
metadata:
  name: exported
spec:
  tokenSecretRef: export-token
  source: {apiGroup: kubevirt.io, kind: VirtualMachine, name: exported}
`, "apply", "-n", ns, "-f", "-")
		Eventually(func() string {
			return observe("get", "vmexport", "exported", "-n", ns, "-o", `jsonpath={.status.phase} {.status.conditions[?(@.type=="Ready")].message}`)
		}, 4*time.Minute, 2*time.Second).Should(HavePrefix("Ready"))
		// KubeVirt serves the DataVolume's disk as kubevirt content, which it learns from the
		// claim diskpipe made for it (its content type, its DataVolume owner).
		Expect(kubectl("", "get", "vmexport", "exported", "-n", ns, "-o", `jsonpath={.status.links.internal.volumes[0].name}:{range .status.links.internal.volumes[0].formats[*]}{.format} {end}`)).
			To(Equal("exported-root:raw gzip "))
		get := exportClient(ns, "exported", token)
		disk := filepath.Join(cluster.VolumePath(ns, "exported-root"), "disk.img")
		for _, format := range []string{"raw", "gzip"} {
			u := kubectl("", "get", "vmexport", "exported", "-n", ns, "-o", `jsonpath={.status.links.internal.volumes[0].formats[?(@.format=="`+format+`")].url}`)
			got := filepath.Join(GinkgoT().TempDir(), "disk.img")
			body := get(u, "")
			if format == "gzip" {
				r, err := gzip.NewReader(bytes.NewReader(body))
				Expect(err).NotTo(HaveOccurred())
				body, err = io.ReadAll(r)
				Expect(err).NotTo(HaveOccurred())
			}
			Expect(os.WriteFile(got, body, 0o600)).To(Succeed())
			Expect(exec.Command("qemu-img", "compare", "-f", "raw", "-F", "raw", got, disk).CombinedOutput()).To(ContainSubstring("Images are identical"), format)
		}

		// The manifests KubeVirt gives to make the VM again: its CA's ConfigMap, the VM, whose
		// dataVolumeTemplates now import from the export server, and the token's header Secret.
		// Applied in another namespace (the VM's own namespace changed, as KubeVirt's docs say),
		// diskpipe reads the export server at its pod, which its egress rule refuses otherwise.
		manifests := string(get(exportLink(ns, "exported", "all"), "application/yaml")) + "\n---\n" + string(get(exportLink(ns, "exported", "auth-header-secret"), "application/yaml"))
		Expect(manifests).To(ContainSubstring("https://virt-export-exported." + ns + ".svc/volumes/exported-root/disk.img.gz"))
		manifests = strings.ReplaceAll(manifests, "namespace: "+ns+"\n", "namespace: "+other+"\n")
		manifests = strings.Replace(manifests, "runStrategy: Halted", "runStrategy: Once", 1)
		kubectl(manifests, "apply", "-n", other, "-f", "-")
		line := guestConsole(other, "exported", "")[0]
		Expect(line).To(HaveSuffix(" marker=" + bootdisk.Marker))
		Expect(kubectl("", "get", "dv", "exported-root", "-n", other, "-o", "jsonpath={.status.phase}")).To(Equal("Succeeded"))
		Expect(exec.Command("qemu-img", "compare", "-f", "raw", "-F", "raw", disk, filepath.Join(cluster.VolumePath(other, "exported-root"), "disk.img")).CombinedOutput()).
			To(ContainSubstring("Images are identical"), "the disk made again from the export holds the exported bytes")
		kubectl("", "delete", "vm", "exported", "-n", other, "--wait=true", "--timeout=120s")
		kubectl("", "delete", "vmexport", "exported", "-n", ns, "--wait=true", "--timeout=60s")
	})
})

// volumeSnapshot is a VolumeSnapshot name of the claim claim, of the harness's snapshot class.
func volumeSnapshot(name, claim string) string {
	return fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata:
  name: %s
spec:
  volumeSnapshotClassName: %s
  source: {persistentVolumeClaimName: %s}
`, name, realcluster.SnapshotClass, claim)
}

// exportLink is the internal link of VirtualMachineExport ns/name's manifests of type what.
func exportLink(ns, name, what string) string {
	GinkgoHelper()
	return kubectl("", "get", "vmexport", name, "-n", ns, "-o", `jsonpath={.status.links.internal.manifests[?(@.type=="`+what+`")].url}`)
}

// exportClient returns a GET of a URL of VirtualMachineExport ns/name's server, as a client in
// the cluster reads it: TLS for the Service's name, checked with the export's CA, and the
// token in KubeVirt's header; from the node, it connects to the server's pod. accept, when set,
// is the Accept header.
func exportClient(ns, name, token string) func(url, accept string) []byte {
	GinkgoHelper()
	roots := x509.NewCertPool()
	Expect(roots.AppendCertsFromPEM([]byte(kubectl("", "get", "vmexport", name, "-n", ns, "-o", "jsonpath={.status.links.internal.cert}")))).To(BeTrue())
	ip := kubectl("", "get", "pod", "virt-export-"+name, "-n", ns, "-o", "jsonpath={.status.podIP}")
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, net.JoinHostPort(ip, "8443"))
		}}
	c := &http.Client{Transport: tr, Timeout: 5 * time.Minute}
	return func(url, accept string) []byte {
		GinkgoHelper()
		req, err := http.NewRequest(http.MethodGet, url, nil)
		Expect(err).NotTo(HaveOccurred())
		req.Header.Set("x-kubevirt-export-token", token)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := c.Do(req)
		Expect(err).NotTo(HaveOccurred())
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.StatusCode).To(Equal(http.StatusOK), "%s: %s", url, body)
		return body
	}
}

func grantCloneSource(sourceNS, vmNS string) {
	GinkgoHelper()
	kubectl(fmt.Sprintf(`apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: clone-source-%[1]s
rules:
- apiGroups: [cdi.kubevirt.io]
  resources: [datavolumes/source]
  verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: clone-source-%[1]s
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: clone-source-%[1]s}
subjects:
- {kind: ServiceAccount, name: default, namespace: %[1]s}
`, vmNS), "apply", "-n", sourceNS, "-f", "-")
}

// dvVM is a KubeVirt VirtualMachine (runStrategy Once) whose only disk, vda, is the
// dataVolumeTemplates entry NAME-root of 512Mi made from source (YAML under spec:).
func dvVM(name, source string) string {
	return fmt.Sprintf(`apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: %[1]s
spec:
  runStrategy: Once
  dataVolumeTemplates:
  - metadata:
      name: %[1]s-root
    spec:
      storage:
        resources: {requests: {storage: 512Mi}}
      %[2]s
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
        dataVolume: {name: %[1]s-root}
`, name, source)
}
