package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("scheduled golden images", func() {
	It("imports each new revision of a file served over HTTP, makes new disks from the newest, keeps the disks already made, and prunes old revisions", localProves, func() {
		ns := namespace()
		// The source: the test disk as qcow2, later the same disk 16 MiB larger (a new release
		// that qemu-img compare still finds the same disk, and a guest still boots), then 32.
		source := filepath.Join(work, "nightly-"+ns+".qcow2")
		start := time.Now().Truncate(time.Second)
		release(source, "", start.Add(-time.Hour))
		kubectl(fmt.Sprintf(`apiVersion: hypercloud.tmaxanc.com/v1alpha1
kind: VirtualMachineImage
metadata:
  name: nightly
spec:
  source:
    http: %s/%s
  schedule:
    cron: "@every 3s"
    keep: 2
`, server, filepath.Base(source)), "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "vmimage", "nightly"), 3*time.Minute, time.Second).Should(Equal("Ready Current"))
		field := func(path string) func() string {
			return func() string { return observe("get", "vmimage", "nightly", "-n", ns, "-o", "jsonpath="+path) }
		}
		first := field("{.status.schedule.current}")()
		Expect(field("{.status.revision}")()).To(Equal("last-modified " + start.Add(-time.Hour).UTC().Format(http1123)))
		Expect(first).To(HavePrefix("nightly-"))
		sameDisk(golden(ns, first))

		// kubectl get shows the revision, how long ago the last check was, and when the next
		// one is (a time: a date column can only tell the past).
		table := kubectl("", "get", "vmimage", "nightly", "-n", ns)
		Expect(table).To(ContainSubstring("LAST CHECK"))
		Expect(table).To(ContainSubstring("NEXT CHECK"))
		Expect(table).To(ContainSubstring("last-modified"))
		Expect(table).To(MatchRegexp(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`))
		GinkgoWriter.Print(table)

		disk := func(name string) string {
			GinkgoHelper()
			kubectl(fmt.Sprintf(`apiVersion: diskvolume.kubesphere.io/v1alpha1
kind: DiskVolume
metadata:
  name: %s
spec:
  source:
    image: {name: nightly, kind: VirtualMachineImage}
`, name), "apply", "-n", ns, "-f", "-")
			Eventually(phase(ns, "dvol", name), 3*time.Minute, time.Second).Should(Equal("Ready Made"))
			return cluster.VolumePath(ns, name) + "/disk.img"
		}
		before := disk("before")
		sameDisk(before)
		size := fileSize(before)

		// Unchanged checks import nothing.
		checks := field("{.status.schedule.checks}")
		n := checks()
		Eventually(checks, time.Minute, time.Second).ShouldNot(Equal(n))
		Expect(field("{.status.conditions[?(@.type==\"UpToDate\")].reason}")()).To(Equal("Unchanged"))
		Expect(field("{.status.schedule.revisions[*].image}")()).To(Equal(first))

		// A check that fails keeps the current image and says why.
		Expect(os.Rename(source, source+".away")).To(Succeed())
		Eventually(field("{.status.conditions[?(@.type==\"UpToDate\")].reason}"), time.Minute, time.Second).Should(Equal("SourceNotFound"))
		Expect(phase(ns, "vmimage", "nightly")()).To(Equal("Ready Current"))
		Expect(os.Rename(source+".away", source)).To(Succeed())

		// A new release: imported, and new disks get it; the disk made before keeps its bytes.
		release(source, "+16M", start)
		Eventually(field("{.status.schedule.current}"), 3*time.Minute, time.Second).ShouldNot(Equal(first))
		second := field("{.status.schedule.current}")()
		Expect(field("{.status.conditions[?(@.type==\"UpToDate\")].reason}")()).To(BeElementOf("Updated", "Unchanged"))
		after := disk("after")
		Expect(fileSize(after)).To(Equal(size + 16<<20))
		sameDisk(after)
		boots(after)
		Expect(fileSize(before)).To(Equal(size), "a disk made before the update keeps the old revision")
		sameDisk(before)

		// A third: keep is 2, so the first revision's image and its golden PVC go.
		release(source, "+32M", start.Add(time.Hour))
		Eventually(field("{.status.schedule.revisions[*].image}"), 3*time.Minute, time.Second).Should(
			SatisfyAll(HaveSuffix(" "+second), Not(ContainSubstring(first))))
		Eventually(func() string {
			out, _, _ := cluster.Kubectl(context.Background(), nil, "get", "vmimage,pvc", "-n", ns, "-o", "name")
			return out
		}, time.Minute, time.Second).ShouldNot(ContainSubstring(first))
		third := field("{.status.schedule.current}")()
		Expect(fileSize(golden(ns, third))).To(BeNumerically(">=", size+32<<20))

		// Deleting the scheduled image deletes its revisions.
		kubectl("", "delete", "vmimage", "nightly", "-n", ns, "--wait=true", "--timeout=2m")
		Expect(strings.TrimSpace(kubectl("", "get", "vmimage", "-n", ns, "-o", "name"))).To(BeEmpty())
		Expect(fileSize(after)).To(Equal(size+16<<20), "disks made from a deleted image stay")
	})
})

// http1123 is how HTTP spells dates (Last-Modified).
const http1123 = "Mon, 02 Jan 2006 15:04:05 GMT"

// release publishes a new revision of the test disk at source, as a web server's file: the
// qcow2, grown by grow when not "" (qemu-img resize), dated at (its Last-Modified), put in
// place whole by a rename so the server never serves half of it.
func release(source, grow string, at time.Time) {
	GinkgoHelper()
	next := source + ".next"
	run("cp", images["qcow2"], next)
	if grow != "" {
		run("qemu-img", "resize", "-f", "qcow2", next, grow)
	}
	Expect(os.Chtimes(next, at, at)).To(Succeed())
	Expect(os.Rename(next, source)).To(Succeed())
}
