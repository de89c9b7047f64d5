package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/diskpipe/diskpipe/test/testenv"
)

// The README's five-minute walk-through is run here exactly as it is written, so that a change
// that breaks it fails the suite: the shell block between its walkthrough markers, in a
// directory holding disk.qcow2, with the environment the README's prelude sets (the store's
// address and keys) and a kubeconfig whose namespace is the spec's.
var _ = Describe("the README's walk-through", afterKubeVirtRollout, func() {
	It("runs as written: upload, golden image, disk, KubeVirt VM, export and download", func(ctx SpecContext) {
		script := readmeWalkthrough()
		kubeVirt() // the walk-through's VM is KubeVirt's where KubeVirt runs
		ns := namespace()
		dir := GinkgoT().TempDir()
		run("cp", images["qcow2"], filepath.Join(dir, "disk.qcow2"))

		// kubectl from bin/, awscli as the tests install it (Debian's, by absolute path; a
		// pyenv one may come first on PATH), the rest from the system.
		tools := filepath.Join(dir, "tools")
		Expect(os.Mkdir(tools, 0o755)).To(Succeed())
		Expect(os.Symlink("/usr/bin/aws", filepath.Join(tools, "aws"))).To(Succeed())
		kubeconfig := filepath.Join(dir, "kubeconfig")
		b, err := os.ReadFile(cluster.KubeconfigFile())
		Expect(err).NotTo(HaveOccurred())
		Expect(os.WriteFile(kubeconfig, b, 0o600)).To(Succeed())
		kc := exec.CommandContext(ctx, testenv.Path("bin", "kubectl"), "--kubeconfig", kubeconfig, "config", "set-context", "--current", "--namespace", ns)
		out, err := kc.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "%s", out)

		// The store's address; its keys the commands get themselves, as a user of ns.
		endpoint, _, _, err := cluster.StoreAccess(ctx)
		Expect(err).NotTo(HaveOccurred())
		cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(),
			"PATH="+tools+":"+testenv.Path("bin")+":"+os.Getenv("PATH"), "KUBECONFIG="+kubeconfig, "HOME="+dir,
			"STORE="+endpoint, "AWS_DEFAULT_REGION=us-east-1",
			"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")
		start := time.Now()
		out, err = cmd.CombinedOutput()
		GinkgoWriter.Printf("the walk-through took %s:\n%s\n", time.Since(start).Round(time.Second), out)
		Expect(err).NotTo(HaveOccurred(), "the README's walk-through failed:\n%s", out)

		// What the commands made is what the README says they make.
		Expect(kubectl("", "get", "virtualmachines.kubevirt.io", "walkthrough", "-n", ns, "-o",
			"jsonpath={.spec.template.spec.volumes[0].persistentVolumeClaim.claimName}")).To(Equal("walkthrough-root"))
		Expect(filepath.Join(dir, "exported.qcow2")).To(BeAnExistingFile())

		// Leave the store as the other specs expect it.
		for _, obj := range []string{"vmve/walkthrough", "virtualmachines.kubevirt.io/walkthrough", "vmpvc/walkthrough-root", "vmimage/walkthrough"} {
			kubectl("", "delete", obj, "-n", ns, "--wait=false")
		}
		_, _ = cluster.AWS(context.Background(), "s3", "rb", "--force", "s3://images")
	}, SpecTimeout(10*time.Minute))
})

// readmeWalkthrough is the shell block between README.md's walkthrough markers.
func readmeWalkthrough() string {
	GinkgoHelper()
	b, err := os.ReadFile(testenv.Path("README.md"))
	Expect(err).NotTo(HaveOccurred())
	_, rest, ok := strings.Cut(string(b), "<!-- walkthrough:begin")
	Expect(ok).To(BeTrue(), "README.md has no walkthrough:begin marker")
	section, _, ok := strings.Cut(rest, "<!-- walkthrough:end -->")
	Expect(ok).To(BeTrue(), "README.md has no walkthrough:end marker")
	_, block, ok := strings.Cut(section, "```sh\n")
	Expect(ok).To(BeTrue(), "the walk-through has no sh block")
	block, _, ok = strings.Cut(block, "\n```")
	Expect(ok).To(BeTrue(), "the walk-through's sh block does not end")
	return block + "\n"
}
