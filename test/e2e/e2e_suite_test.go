// Package e2e runs diskpipe's user stories end to end, on the local cluster (the default) or
// on the real single-node cluster (DISKPIPE_E2E_CLUSTER=real, make test-cluster): real
// processes, real bytes, each result checked with qemu-img, awscli or curl.
package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/diskpipe/diskpipe/test/bootdisk"
	"github.com/diskpipe/diskpipe/test/testenv"
)

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "diskpipe end to end")
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
