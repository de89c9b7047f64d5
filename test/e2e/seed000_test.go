package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/diskpipe/diskpipe/importer/registrytest"
)

// Seed 000's kinds as written: an ImageTemplate cloned from another namespace's template (which
// is imported here from a container disk in a real OCI registry), and a DiskVolume from it.
var _ = Describe("seed 000", Ordered, func() {
	BeforeAll(func() {
		for _, ns := range []string{"test", "test2"} {
			Expect(cluster.EnsureNamespace(GinkgoT().Context(), ns)).To(Succeed())
		}
	})

	It("imports an ImageTemplate from a container disk pushed to a real registry", realProves, func() {
		addr := registrytest.StartAt(GinkgoT(), cluster.HostAddress())
		img := registrytest.ContainerDisk(GinkgoT(), images["qcow2"], "amd64", "disk")
		registrytest.Push(GinkgoT(), addr, "containerdisks/centos", "7", img.Manifest, "application/vnd.oci.image.manifest.v1+json", img.Blobs)
		kubectl(fmt.Sprintf(`apiVersion: virtualmachine.kubesphere.io/v1alpha1
kind: ImageTemplate
metadata:
  name: centos
spec:
  source:
    registry:
      url: docker://%s/containerdisks/centos:7
      insecureSkipTLSVerify: true
  resources:
    requests:
      storage: 1Gi
  storageClassName: sc
`, addr), "apply", "-n", "test", "-f", "-")
		Eventually(phase("test", "imt", "centos"), 2*time.Minute, time.Second).Should(Equal("Ready Imported"))
		sameDisk(filepath.Join(cluster.VolumePath("test", "imt-centos"), "disk.img"))
	})

	It("clones it into another namespace with the seed's ImageTemplate (host-assisted, served across namespaces)", realProves, func() {
		seed, err := os.ReadFile(filepath.Join("..", "fixtures", "seeds", "000-imagetemplate.yaml"))
		Expect(err).NotTo(HaveOccurred())
		kubectl(string(seed), "apply", "-f", "-")
		Eventually(phase("test2", "imt", "image-centos-http"), 2*time.Minute, time.Second).Should(Equal("Ready Imported"))
		disk := filepath.Join(cluster.VolumePath("test2", "imt-image-centos-http"), "disk.img")
		sameDisk(disk)
		boots(disk)
		// The clone source in the other namespace is gone.
		Eventually(func() string { return observe("get", "pods", "-n", "test", "-o", "name") }, 30*time.Second).Should(BeEmpty())
	})

	It("makes the seed's DiskVolume from the template", realProves, func() {
		seed, err := os.ReadFile(filepath.Join("..", "fixtures", "seeds", "000-diskvolume.yaml"))
		Expect(err).NotTo(HaveOccurred())
		kubectl(string(seed), "apply", "-f", "-")
		Eventually(phase("test", "dvol", "disk1"), 2*time.Minute, time.Second).Should(Equal("Ready Made"))
		// Shared storage with a VolumeSnapshotClass: restored from the template's golden snapshot.
		Expect(kubectl("", "get", "dvol", "disk1", "-n", "test", "-o", "jsonpath={.status.cloneStrategy}")).To(Equal("Snapshot"))
		disk := filepath.Join(cluster.VolumePath("test", "disk1"), "disk.img")
		fi, err := os.Stat(disk)
		Expect(err).NotTo(HaveOccurred())
		Expect(fi.Size()).To(Equal(grown(4 << 30)))
		sameDisk(disk)
	})
})

var _ = Describe("a source that goes away", func() {
	It("fails with SourceUnavailable, after the importer's own retries, when the server is cut off", localProves, func() {
		ns := namespace()
		gone := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			hj, ok := w.(http.Hijacker)
			if !ok {
				return
			}
			if conn, _, err := hj.Hijack(); err == nil {
				conn.Close() // the connection is cut before any byte
			}
		}), ReadHeaderTimeout: time.Second}
		l := listen()
		go func() { _ = gone.Serve(l) }()
		DeferCleanup(gone.Close)
		kubectl(vmi("cutoff", "    http: http://"+l.Addr().String()+"/disk.qcow2")+"  resources:\n    requests:\n      storage: 128Mi\n  retry: 0\n",
			"apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "vmimage", "cutoff"), 3*time.Minute, time.Second).Should(Equal("Failed SourceUnavailable"))
		msg := kubectl("", "get", "vmimage", "cutoff", "-n", ns, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].message}`)
		Expect(strings.ToLower(msg)).To(Or(ContainSubstring("eof"), ContainSubstring("reset"), ContainSubstring("closed")))
	})
})
