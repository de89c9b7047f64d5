package image_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/internal/ctrltest"
	"github.com/diskpipe/diskpipe/importer"
	"github.com/diskpipe/diskpipe/internal/backup"
)

// TestChainSource restores a point of a disk's backups kept in the bundled store (uploaded
// with awscli, as the namespace): the manager reads the index as the namespace and presigns
// each layer of the point, and the importer pod gets only those URLs, never the store's keys.
// The pod's own arguments, run by the real importer with the Secret the pod mounts, make the
// disk qemu-img makes of the same layers; another namespace's index is refused by the store.
func TestChainSource(t *testing.T) {
	startManager(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "chain")
	g.Expect(err).NotTo(HaveOccurred())

	dir := t.TempDir()
	qemu := func(tool string, args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, tool, args...)
		cmd.Dir = dir // backing names are relative to the images' directory
		out, err := cmd.CombinedOutput()
		g.Expect(err).NotTo(HaveOccurred(), "%s %v: %s", tool, args, out)
	}
	qemu("qemu-img", "create", "-q", "-f", "qcow2", "full.qcow2", "32M")
	qemu("qemu-io", "-f", "qcow2", "-c", "write -P 0x11 0 4M", "-c", "write -P 0x12 10M 2M", "full.qcow2")
	qemu("qemu-img", "create", "-q", "-f", "qcow2", "-b", "full.qcow2", "-F", "qcow2", "inc1.qcow2")
	qemu("qemu-io", "-f", "qcow2", "-c", "write -P 0x21 1M 1M", "-c", "write -z 10M 1M", "inc1.qcow2")
	qemu("qemu-img", "create", "-q", "-f", "qcow2", "-b", "inc1.qcow2", "-F", "qcow2", "inc2.qcow2", "48M")
	qemu("qemu-io", "-f", "qcow2", "-c", "write -P 0x31 40M 1M", "inc2.qcow2")
	qemu("qemu-img", "convert", "-O", "raw", "inc1.qcow2", "want-cp2.raw")
	ix := backup.Index{Format: backup.Format, Disk: ns + "/vm-root"}
	for i, name := range []string{"full.qcow2", "inc1.qcow2", "inc2.qcow2"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		g.Expect(err).NotTo(HaveOccurred())
		l := backup.Layer{Checkpoint: fmt.Sprintf("cp%d", i+1), Object: "layers/" + name, Size: int64(len(b)),
			VirtualSize: map[bool]int64{true: 48 << 20, false: 32 << 20}[i == 2], SHA256: sha256Hex(b)}
		if i > 0 {
			l.Parent = fmt.Sprintf("cp%d", i)
		}
		ix.Layers = append(ix.Layers, l)
	}
	b, err := json.Marshal(ix)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(os.WriteFile(filepath.Join(dir, "index.json"), b, 0o600)).To(Succeed())

	tenant, err := store.ClientOf(env.Client).Tenant(ctx, ns)
	g.Expect(err).NotTo(HaveOccurred())
	access, secret := tenant.Keys()
	g.Expect(tenant.EnsureBucket(ctx, "backups")).To(Succeed())
	for _, f := range []string{"full.qcow2", "inc1.qcow2", "inc2.qcow2"} {
		out, err := store.AWSAs(ctx, access, secret, "s3", "cp", "--only-show-errors", filepath.Join(dir, f), "s3://backups/vm-root/layers/"+f)
		g.Expect(err).NotTo(HaveOccurred(), out)
	}
	out, err := store.AWSAs(ctx, access, secret, "s3", "cp", "--only-show-errors", filepath.Join(dir, "index.json"), "s3://backups/vm-root/index.json")
	g.Expect(err).NotTo(HaveOccurred(), out)

	vmi := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "restored", Namespace: ns},
		Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{Chain: &common.ChainSource{
			ObjectStore: &common.ObjectStoreSource{BucketName: "backups", ObjectName: "vm-root/index.json"}, Point: "cp2"}}}}
	vmi.Spec.Resources.Requests.Storage = ctrltest.Quantity("1Gi")
	g.Expect(env.Client.Create(ctx, vmi)).To(Succeed())
	pod := ctrltest.Pod(t, env, ns, "vmim-restored-import-0")
	args := pod.Spec.Containers[0].Args
	joined := strings.Join(args, " ")
	g.Expect(joined).To(HavePrefix("--source http --url-file /var/run/diskpipe/url/url "))
	g.Expect(joined).To(ContainSubstring("--chain-point cp2"))
	g.Expect(joined).To(ContainSubstring("--layer-url-dir /var/run/diskpipe/url"))
	g.Expect(joined).NotTo(ContainSubstring(store.AccessKey))
	g.Eventually(status(t, vmi, &vmi.Status), 20*time.Second).Should(WithTransform(func(st *common.ImageStatus) string { return st.SourceType }, Equal("chain")))

	// The Secret holds the index's URL and the point's two layers', nothing of cp3.
	sec := &corev1.Secret{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: pod.Name}, sec)).To(Succeed())
	g.Expect(metav1.IsControlledBy(sec, vmi)).To(BeTrue())
	keys := []string{}
	for k := range sec.Data {
		keys = append(keys, k)
	}
	g.Expect(keys).To(ConsistOf("url", "layer-cp1", "layer-cp2"))
	for _, v := range sec.Data {
		g.Expect(string(v)).NotTo(ContainSubstring(secret))
	}

	// The pod's arguments, as its container runs them, with the Secret where the pod mounts it.
	mounted := filepath.Join(t.TempDir(), "url")
	g.Expect(os.MkdirAll(mounted, 0o700)).To(Succeed())
	for k, v := range sec.Data {
		g.Expect(os.WriteFile(filepath.Join(mounted, k), v, 0o600)).To(Succeed())
	}
	target := filepath.Join(t.TempDir(), "disk.img")
	run := podArgs(args, map[string]string{"/var/run/diskpipe/url": mounted}, target)
	code := importer.Main(ctx, append(run, "--metrics-addr", "", "--termination-message-path", "", "--allow-destination", "127.0.0.1"), io.Discard)
	g.Expect(code).To(Equal(0), "importer %v", run)
	cmp := exec.CommandContext(ctx, "qemu-img", "compare", "-f", "raw", "-F", "raw", filepath.Join(dir, "want-cp2.raw"), target)
	out2, err := cmp.CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), "qemu-img compare: %s", out2)

	// Another namespace naming the index is refused by the store before any pod runs.
	other, err := env.CreateNamespace(ctx, "chain-other")
	g.Expect(err).NotTo(HaveOccurred())
	stolen := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "stolen", Namespace: other},
		Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{Chain: &common.ChainSource{
			ObjectStore: &common.ObjectStoreSource{BucketName: "backups", ObjectName: "vm-root/index.json"}}}}}
	stolen.Spec.Resources.Requests.Storage = ctrltest.Quantity("1Gi")
	g.Expect(env.Client.Create(ctx, stolen)).To(Succeed())
	g.Eventually(status(t, stolen, &stolen.Status), 20*time.Second).Should(WithTransform(phaseReasonMessage,
		HavePrefix("Failed SourceForbidden: namespace "+other+" may not read s3://backups/vm-root/index.json in the bundled object store")))
	pods := &corev1.PodList{}
	g.Expect(env.Client.List(ctx, pods, client.InNamespace(other))).To(Succeed())
	g.Expect(pods.Items).To(BeEmpty(), "no importer runs for a refused index")

	// A checksum beside a chain is refused by the API server: the index holds each layer's.
	bad := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "summed", Namespace: ns},
		Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{Checksum: common.Checksum("sha256:" + strings.Repeat("0", 64)),
			Chain: &common.ChainSource{ObjectStore: &common.ObjectStoreSource{BucketName: "backups", ObjectName: "vm-root/index.json"}}}}}
	g.Expect(env.Client.Create(ctx, bad)).To(MatchError(ContainSubstring("checksum does not apply to a pvc, snapshot or chain source")))
}

// podArgs is a pod's importer arguments as a test runs them: the mounted directories moved to
// where the test put their files, and the target replaced.
func podArgs(args []string, dirs map[string]string, target string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--target" && i+1 < len(args) {
			out = append(out, a, target)
			i++
			continue
		}
		for from, to := range dirs {
			if a == from || strings.HasPrefix(a, from+"/") {
				a = to + strings.TrimPrefix(a, from)
			}
		}
		out = append(out, a)
	}
	return out
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
