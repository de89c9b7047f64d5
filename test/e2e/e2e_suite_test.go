// Package e2e runs diskpipe's user stories end to end, on the local cluster (the default) or
// on the real single-node cluster (DISKPIPE_E2E_CLUSTER=real, make test-cluster): real
// processes, real bytes, each result checked with qemu-img, awscli or curl.
package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"

	"github.com/diskpipe/diskpipe/test/bootdisk"
	realcluster "github.com/diskpipe/diskpipe/test/cluster"
	"github.com/diskpipe/diskpipe/test/testenv"
)

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	suite, reporter := GinkgoConfiguration()
	// make test runs this package beside the others, so it cannot pass Ginkgo's flags: it
	// gives the label filter here (E2E_LOCAL_LABELS), and -ginkgo.label-filter wins.
	if labels := os.Getenv("DISKPIPE_E2E_LABELS"); suite.LabelFilter == "" && labels != "" {
		suite.LabelFilter = labels
	}
	RunSpecs(t, "diskpipe end to end", suite, reporter)
}

var (
	cluster Cluster
	work    string
	// raw is the disk every image here is made from; images holds it in formats.
	raw    string
	images = map[string]string{}
	server string
)

var _ = BeforeSuite(func() {
	bin := testenv.Path("bin")
	for _, b := range []string{"manager", "importer", "exporter", "uploadproxy"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil && !real() {
			Fail(fmt.Sprintf("bin/%s is missing: `make test` builds it (make build)", b))
		}
	}
	var err error
	work, err = os.MkdirTemp("", "diskpipe-e2e-")
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { _ = os.RemoveAll(work) })
	cluster, err = startCluster(work)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(cluster.Stop)
	DeferCleanup(func() { GinkgoWriter.Println(health()) })

	// Every image here is the bootable disk (make bootdisk), so that each disk made from one
	// can be booted: sameDisk compares bytes, boots says a machine starts from them.
	raw = filepath.Join(work, "disk.raw")
	if _, err := os.Stat(testenv.Path("bin", "bootdisk", "disk.raw")); err != nil {
		Fail("bin/bootdisk/disk.raw is missing: `make test` makes it (make bootdisk)")
	}
	run("cp", "--sparse=always", testenv.Path("bin", "bootdisk", "disk.raw"), raw)
	images["qcow2"] = filepath.Join(work, "disk.qcow2")
	run("qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, images["qcow2"])
	images["vmdk"] = filepath.Join(work, "disk.vmdk")
	run("qemu-img", "convert", "-f", "raw", "-O", "vmdk", "-o", "subformat=streamOptimized", raw, images["vmdk"])

	l, err := net.Listen("tcp", net.JoinHostPort(cluster.HostAddress(), "0"))
	Expect(err).NotTo(HaveOccurred())
	server = "http://" + l.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(serveFile), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	DeferCleanup(srv.Close)
})

// A failed spec prints what the cluster was going through, so that a run's log says whether
// a timeout was diskpipe's or the machine's.
var _ = AfterEach(func() {
	if CurrentSpecReport().Failed() {
		GinkgoWriter.Println(health())
		out, errOut, _ := cluster.Kubectl(context.Background(), nil, "get", "events", "-A", "--field-selector", "type=Warning", "--sort-by", ".lastTimestamp")
		lines := strings.Split(strings.TrimSpace(out+errOut), "\n")
		GinkgoWriter.Printf("the last warnings:\n%s\n", strings.Join(lines[max(0, len(lines)-25):], "\n"))
	}
})

// A run with DISKPIPE_E2E_FAILURES set appends each failed spec's name, place and first lines
// of failure to that file, which .ci/run prints last: the end of a long log then says why.
var _ = ReportAfterSuite("failures digest", func(r Report) {
	path := os.Getenv("DISKPIPE_E2E_FAILURES")
	if path == "" {
		return
	}
	var b strings.Builder
	for _, s := range r.SpecReports {
		if !s.Failed() {
			continue
		}
		msg := strings.Split(strings.TrimSpace(s.Failure.Message), "\n")
		fmt.Fprintf(&b, "FAILED %s\n  at %s\n  %s\n", s.FullText(), s.Failure.Location, strings.Join(msg[:min(len(msg), 12)], "\n  "))
	}
	if b.Len() == 0 {
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	Expect(err).NotTo(HaveOccurred())
	defer f.Close()
	_, err = f.WriteString(b.String())
	Expect(err).NotTo(HaveOccurred())
})

// health is a line on the cluster: node conditions other than Ready that hold, pods the
// kubelet evicted, and the restarts of diskpipe's pods.
func health() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := cluster.APIClient()
	var notes []string
	nodes := &corev1.NodeList{}
	if err := c.List(ctx, nodes); err != nil {
		return "cluster health: " + err.Error()
	}
	for _, n := range nodes.Items {
		for _, cond := range n.Status.Conditions {
			if cond.Type != corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				notes = append(notes, fmt.Sprintf("node %s %s since %s", n.Name, cond.Type, cond.LastTransitionTime.Format(time.TimeOnly)))
			}
		}
	}
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods); err != nil {
		return "cluster health: " + err.Error()
	}
	evicted := map[string]int{}
	for _, p := range pods.Items {
		if p.Status.Reason == "Evicted" {
			evicted[p.Namespace]++
		}
		for _, st := range p.Status.ContainerStatuses {
			if st.RestartCount > 0 && p.Namespace == realcluster.ReleaseNamespace {
				notes = append(notes, fmt.Sprintf("%s/%s restarted %d times", p.Name, st.Name, st.RestartCount))
			}
		}
	}
	for ns, n := range evicted {
		notes = append(notes, fmt.Sprintf("%d pods evicted in %s", n, ns))
	}
	if len(notes) == 0 {
		return "cluster health: no node pressure, no evictions, no restarts"
	}
	slices.Sort(notes)
	return "cluster health: " + strings.Join(notes, "; ")
}

// serveFile serves the work directory with Range support; ?rate=N limits it to N bytes a
// second, so an import can be interrupted on purpose; ?norange=1 answers as a server without
// Range support does, with the whole file.
func serveFile(w http.ResponseWriter, r *http.Request) {
	f, err := os.Open(filepath.Join(work, filepath.Base(r.URL.Path)))
	if err != nil {
		http.NotFound(w, r)
		return
	}
	defer f.Close()
	w = &counted{ResponseWriter: w, n: servedCounter(filepath.Base(r.URL.Path))}
	fi, _ := f.Stat()
	if r.URL.Query().Get("norange") != "" {
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
		_, _ = io.Copy(w, f)
		return
	}
	var rate int64
	_, _ = fmt.Sscan(r.URL.Query().Get("rate"), &rate)
	if rate > 0 {
		w = &throttled{ResponseWriter: w, rate: rate}
	}
	http.ServeContent(w, r, fi.Name(), fi.ModTime(), f)
}

// served counts the bytes the server sent of each file, by name.
var served sync.Map // string -> *atomic.Int64

func servedCounter(name string) *atomic.Int64 {
	n, _ := served.LoadOrStore(name, new(atomic.Int64))
	return n.(*atomic.Int64)
}

// servedBytes is how many bytes of file name the server has sent.
func servedBytes(name string) int64 { return servedCounter(name).Load() }

type counted struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c *counted) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n.Add(int64(n))
	return n, err
}

type throttled struct {
	http.ResponseWriter
	rate int64
}

func (t *throttled) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), 64<<10)]
		m, err := t.ResponseWriter.Write(chunk)
		n += m
		if err != nil {
			return n, err
		}
		p = p[m:]
		time.Sleep(time.Duration(int64(m) * int64(time.Second) / t.rate))
	}
	return n, nil
}

func run(name string, args ...string) {
	GinkgoHelper()
	out, err := exec.Command(name, args...).CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "%s %s: %s", name, strings.Join(args, " "), out)
}

func sha256Of(path string) string {
	GinkgoHelper()
	f, err := os.Open(path)
	Expect(err).NotTo(HaveOccurred())
	defer f.Close()
	h := sha256.New()
	_, err = io.Copy(h, f)
	Expect(err).NotTo(HaveOccurred())
	return hex.EncodeToString(h.Sum(nil))
}

// kubectl runs bin/kubectl against the cluster.
func kubectl(stdin string, args ...string) string {
	GinkgoHelper()
	out, errOut, err := cluster.Kubectl(context.Background(), []byte(stdin), args...)
	Expect(err).NotTo(HaveOccurred(), "kubectl %s: %s", strings.Join(args, " "), errOut)
	return out
}

// downloadURL reads an export's download URL from the Secret its status names, as its
// namespace's editors may.
func downloadURL(ns, export string) string {
	GinkgoHelper()
	secret := kubectl("", "get", "vmve", export, "-n", ns, "-o", "jsonpath={.status.downloadSecretName}")
	Expect(secret).NotTo(BeEmpty(), "the export %s/%s names no download Secret", ns, export)
	enc := kubectl("", "get", "secret", secret, "-n", ns, "-o", "jsonpath={.data.url}")
	u, err := base64.StdEncoding.DecodeString(enc)
	Expect(err).NotTo(HaveOccurred())
	return string(u)
}

// observe is kubectl's output for a read that Eventually polls: an error (the object not made
// yet by its controller, the API server busy) comes back as text, which Eventually retries and
// shows if it lasts, where kubectl would fail the spec at the first look.
func observe(args ...string) string {
	out, errOut, err := cluster.Kubectl(context.Background(), nil, args...)
	if err != nil {
		return fmt.Sprintf("(kubectl %s: %v: %s)", strings.Join(args, " "), err, strings.TrimSpace(errOut))
	}
	return out
}

// phase reads an object's status.phase and Ready reason with kubectl.
func phase(ns, resource, name string) func() string {
	return func() string {
		out, _, _ := cluster.Kubectl(context.Background(), nil, "get", resource, name, "-n", ns, "-o",
			`jsonpath={.status.phase} {.status.conditions[?(@.type=="Ready")].reason}|{.status.conditions[?(@.type=="Ready")].message}`)
		p, msg, _ := strings.Cut(strings.TrimSpace(out), "|")
		if strings.HasPrefix(p, "Failed ") {
			GinkgoWriter.Printf("%s %s/%s failed: %s\n", resource, ns, name, msg)
		}
		return strings.TrimSpace(p)
	}
}

// sameDisk checks with qemu-img compare that got holds the test disk.
func sameDisk(got string) {
	GinkgoHelper()
	run("qemu-img", "compare", "-f", "raw", raw, got)
}

func namespace() string {
	GinkgoHelper()
	ns := fmt.Sprintf("e2e-%d", time.Now().UnixNano()%1_000_000_000)
	Expect(cluster.EnsureNamespace(context.Background(), ns)).To(Succeed())
	return ns
}

func listen() net.Listener {
	GinkgoHelper()
	l, err := net.Listen("tcp", net.JoinHostPort(cluster.HostAddress(), "0"))
	Expect(err).NotTo(HaveOccurred())
	return l
}

// boots boots a VM disk's bytes (a PVC's disk.img or block.img) under QEMU and checks that the
// guest starts and sees the whole disk, grown or not, and the image's marker.
func boots(disk string) {
	GinkgoHelper()
	g, err := bootdisk.Check(context.Background(), disk, "raw", fileSize(disk))
	Expect(err).NotTo(HaveOccurred())
	GinkgoWriter.Printf("%s booted in %.1f s: disk=%s size=%d marker=%s\n", disk, g.Took.Seconds(), g.Disk, g.Size, g.Marker)
}
