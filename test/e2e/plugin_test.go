package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/diskpipe/diskpipe/internal/transfer"
	diskpipeplugin "github.com/diskpipe/diskpipe/plugin"
	"github.com/diskpipe/diskpipe/test/testenv"
)

// plugin runs `kubectl diskpipe ARGS` as a user would: the real kubectl, which finds
// kubectl-diskpipe on PATH (bin/), with the cluster's client-certificate kubeconfig. It
// returns stdout, stderr and the exit code.
func plugin(args ...string) (string, string, int) {
	GinkgoHelper()
	return pluginAs(cluster.KubeconfigFile(), args...)
}

// pluginCommand is `kubectl diskpipe ARGS` with kubeconfig, not yet started.
func pluginCommand(ctx context.Context, kubeconfig string, args ...string) *exec.Cmd {
	GinkgoHelper()
	bin := testenv.Path("bin")
	Expect(filepath.Join(bin, "kubectl-diskpipe")).To(BeAnExistingFile(), "make build builds it")
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "kubectl"), append([]string{"diskpipe"}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "KUBECONFIG="+kubeconfig)
	return cmd
}

// pluginAs runs `kubectl diskpipe ARGS` with kubeconfig's user.
func pluginAs(kubeconfig string, args ...string) (string, string, int) {
	GinkgoHelper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := pluginCommand(ctx, kubeconfig, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else {
		Expect(err).NotTo(HaveOccurred())
	}
	GinkgoWriter.Printf("$ kubectl diskpipe %s  (exit %d)\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return out.String(), errOut.String(), code
}

var _ = Describe("kubectl diskpipe", func() {
	It("waits for an image, showing its progress, then says it is Ready", localProves, func() {
		ns := namespace()
		kubectl(vmi("slow", fmt.Sprintf("    http: %s/disk.qcow2?rate=2000000", server)), "apply", "-n", ns, "-f", "-")
		out, errOut, code := plugin("wait", "vmimage/slow", "-n", ns, "--interval", "500ms")
		Expect(code).To(Equal(0), errOut)
		Expect(errOut).To(ContainSubstring("virtualmachineimage/slow: Importing"), "the progress, as plain lines into a pipe")
		Expect(out).To(Equal("virtualmachineimage/slow: Ready, Imported\n"))

		out, _, code = plugin("describe", "virtualmachineimage/slow", "-n", ns, "-o", "json")
		Expect(code).To(Equal(0))
		var s map[string]any
		Expect(json.Unmarshal([]byte(out), &s)).To(Succeed())
		Expect(s).To(HaveKeyWithValue("phase", "Ready"))
		Expect(s).To(HaveKeyWithValue("reason", "Imported"))
	})

	It("exits 1 for an image that failed for good, with its reason and what to do", localProves, func() {
		ns := namespace()
		kubectl(vmi("wrong", fmt.Sprintf("    http: %s/disk.qcow2\n    checksum: sha256:%s", server, strings.Repeat("0", 64))), "apply", "-n", ns, "-f", "-")
		_, errOut, code := plugin("wait", "vmimage/wrong", "-n", ns)
		Expect(code).To(Equal(1))
		Expect(errOut).To(ContainSubstring("VirtualMachineImage/wrong failed: ChecksumMismatch"))
		Expect(errOut).To(ContainSubstring("What to do: " + transfer.Advice("ChecksumMismatch")))

		_, errOut, code = plugin("wait", "pods/anything", "-n", ns)
		Expect(code).To(Equal(2))
		Expect(errOut).To(ContainSubstring("is not one of diskpipe's kinds"))
	})

	It("exports a PVC to a file that qemu-img reads back identical, verified, and leaves no export behind", localProves, func() {
		ns := namespace()
		importHTTP(ns, "source", "disk.qcow2")
		file := filepath.Join(work, "plugin-export.qcow2")
		out, errOut, code := plugin("export", "vmim-source", "-o", file, "-n", ns, "--compression", "zstd")
		Expect(code).To(Equal(0), errOut)
		Expect(out).To(MatchRegexp(`plugin-export\.qcow2: sha256:[0-9a-f]{64} verified`))
		Expect(file + ".part").NotTo(BeAnExistingFile())
		run("qemu-img", "check", file)
		run("qemu-img", "compare", "-F", "qcow2", raw, file)
		Eventually(func() string { return observe("get", "vmve", "-n", ns, "-o", "name") }, time.Minute).Should(BeEmpty())
		Eventually(func() string {
			ls, _ := cluster.AWS(context.Background(), "s3", "ls", "--recursive", "s3://"+diskpipeplugin.ExportBucket(ns)+"/"+ns+"/")
			return ls
		}, time.Minute, time.Second).Should(BeEmpty(), "the export's object went with it")
	})

	It("downloads a kept export, and renews its URL when it has expired", localProves, func() {
		ns := namespace()
		importHTTP(ns, "kept", "disk.qcow2")
		file := filepath.Join(work, "plugin-kept.raw")
		_, errOut, code := plugin("export", "vmim-kept", "-o", file, "-n", ns, "--format", "raw", "--keep")
		Expect(code).To(Equal(0), errOut)
		sameDisk(file)
		name := strings.TrimPrefix(kubectl("", "get", "vmve", "-n", ns, "-o", "name"), "virtualmachinevolumeexport.hypercloud.tmaxanc.com/")
		name = strings.TrimSpace(name)
		Expect(name).To(HavePrefix("vmim-kept-export-"))

		// A URL the store no longer honours: the plugin asks for a new one and goes on.
		expired := strings.Replace(downloadURL(ns, name), "X-Amz-Signature=", "X-Amz-Signature=0", 1)
		secret := kubectl("", "get", "vmve", name, "-n", ns, "-o", "jsonpath={.status.downloadSecretName}")
		kubectl("", "patch", "secret", secret, "-n", ns, "--type", "merge", "-p", fmt.Sprintf(`{"stringData":{"url":%q}}`, expired))
		again := filepath.Join(work, "plugin-again.raw")
		_, errOut, code = plugin("download", name, "-o", again, "-n", ns)
		Expect(code).To(Equal(0), errOut)
		Expect(errOut).To(ContainSubstring("the store refused the download URL (expired?); asking for a new one"))
		sameDisk(again)
	})
})
