// Command demo is `make demo`: it brings the local cluster up (or, with --cluster=real, a real
// single-node Kubernetes with diskpipe installed by helm: make demo CLUSTER=real) and walks
// the seed's stories with real tools — awscli into the bundled store, kubectl, curl and
// qemu-img — on a small image made here (no internet), then prints a summary. With --keep
// the cluster stays up.
package main

import (
	"context"
	"encoding/base64"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/diskpipe/diskpipe/test/bootdisk"
	"github.com/diskpipe/diskpipe/test/framework"
)

const ns = "demo"

type step struct {
	name string
	took time.Duration
	what string
}

var steps []step

func main() {
	keep := flag.Bool("keep", false, "keep the cluster running and print its KUBECONFIG")
	kind := flag.String("cluster", "local", "local: the local cluster (fast); real: a real single-node Kubernetes with diskpipe installed by helm from its image (as root; make demo CLUSTER=real)")
	flag.Parse()
	root, _ := filepath.Abs(".")
	dir, err := os.MkdirTemp("", "diskpipe-demo-")
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	start := time.Now()
	c, err := startCluster(ctx, *kind, dir)
	if err != nil {
		fail(err)
	}
	done(*kind+" cluster up", start, "KUBECONFIG="+c.KubeconfigFile())
	if err := run(ctx, c, dir); err != nil {
		fmt.Fprintf(os.Stderr, "\ndemo: %v\nlogs: %s\n", err, logs(c))
		if !*keep {
			consoleStop()
			c.Stop()
			os.Exit(1)
		}
	}
	summary(time.Since(start))
	if !*keep {
		consoleStop()
		c.Stop()
		_ = os.RemoveAll(dir)
		return
	}
	if *keep {
		fmt.Printf("\nThe cluster keeps running. In another shell:\n  export KUBECONFIG=%s\n  %s/kubectl get diskpipe -A\nCtrl-C stops it.\n",
			c.KubeconfigFile(), filepath.Join(root, "bin"))
		if tok, err := os.ReadFile(filepath.Join(dir, "console-token")); err == nil {
			fmt.Printf("The console's pages (headless machines: ssh -L the port): %s\n  token (namespace %s): %s\n", lastConsoleURL, ns, strings.TrimSpace(string(tok)))
		}
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		<-sig
		consoleStop()
		c.Stop()
	}
}

func run(ctx context.Context, c framework.Cluster, dir string) error {
	// The bootable disk (make bootdisk): Debian's kernel and busybox behind syslinux.
	t := time.Now()
	image := filepath.Join(dir, "demo.qcow2")
	if err := tool("cp", filepath.Join("bin", "bootdisk", "disk.qcow2"), image); err != nil {
		return fmt.Errorf("%w (make bootdisk makes it)", err)
	}
	done("took the bootable disk (make bootdisk) as demo.qcow2", t, "64 MiB virtual: syslinux, Debian's kernel, a busybox initramfs")

	// Serve it over HTTP on this machine, and put it in the bundled store with awscli.
	l, err := net.Listen("tcp", net.JoinHostPort(c.HostAddress(), "0"))
	if err != nil {
		return err
	}
	go func() { _ = http.Serve(l, http.FileServer(http.Dir(dir))) }() //nolint:gosec // a demo server
	if err := c.EnsureNamespace(ctx, ns); err != nil {
		return err
	}
	if c.KubeVirt() {
		// KubeVirt's launcher pods are privileged: KubeVirt makes none in a namespace that
		// enforces a stricter Pod Security level ("it needs a privileged namespace to run").
		if _, stderr, err := c.Kubectl(ctx, nil, "label", "namespace", ns, "pod-security.kubernetes.io/enforce=privileged", "--overwrite"); err != nil {
			return fmt.Errorf("labelling namespace %s privileged for KubeVirt: %w: %s", ns, err, stderr)
		}
	}
	t = time.Now()
	if out, err := c.TenantAWS(ctx, ns, "s3", "mb", "s3://vmimage"); err != nil {
		return fmt.Errorf("aws s3 mb: %w: %s", err, out)
	}
	if out, err := c.TenantAWS(ctx, ns, "s3", "cp", image, "s3://vmimage/bionic-server-cloudimg-amd64.img"); err != nil {
		return fmt.Errorf("aws s3 cp: %w: %s", err, out)
	}
	done("aws s3 cp demo.qcow2 s3://vmimage/bionic-server-cloudimg-amd64.img, with namespace "+ns+"'s keys (an ObjectStoreKeysRequest)", t, storeEndpoint(ctx, c))

	t = time.Now()
	objectStoreImage, err := seed("003-virtualmachineimage-objectstore-fixed.yaml")
	if err != nil {
		return err
	}
	httpImage, err := seed("003-virtualmachineimage-http.yaml", "name: ubuntu18.04", "name: ubuntu-http",
		"https://cloud-images.ubuntu.com/bionic/current/bionic-server-cloudimg-amd64.img", fmt.Sprintf("http://%s/demo.qcow2", l.Addr()))
	if err != nil {
		return err
	}
	if err := apply(ctx, c, objectStoreImage+"---\n"+httpImage); err != nil {
		return err
	}
	if err := waitFor(ctx, c, "virtualmachineimage", []string{"ubuntu18.04", "ubuntu-http"}, true); err != nil {
		return err
	}
	done("the seed's two VirtualMachineImages imported (objectStore and http)", t, "golden PVCs vmim-ubuntu18.04, vmim-ubuntu-http")

	t = time.Now()
	vmpvc, err := seed("003-virtualmachinepvc-fixed.yaml")
	if err != nil {
		return err
	}
	if err := apply(ctx, c, vmpvc+"---\n"+diskForTheVM); err != nil {
		return err
	}
	if err := waitFor(ctx, c, "virtualmachinepvc", []string{"vmrootdisk"}, false); err != nil {
		return err
	}
	if err := waitFor(ctx, c, "diskvolume", []string{"disk1-from-image"}, false); err != nil {
		return err
	}
	show(ctx, c, "get", "virtualmachinepvc,diskvolume", "-n", ns, "-o", "wide")
	done("the seed's VirtualMachinePvc (restored from the image's golden snapshot, disk.img grown to 10Gi) and a DiskVolume", t, "PVCs vmrootdisk, disk1-from-image")

	t = time.Now()
	vm, err := seed("000-virtualmachine.yaml", "namespace: test2", "namespace: "+ns)
	if err != nil {
		return err
	}
	if err := apply(ctx, c, vm); err != nil {
		return err
	}
	if c.KubeVirt() {
		if err := fixForKubeVirt(ctx, c); err != nil {
			return err
		}
	}
	if err := waitFor(ctx, c, "virtualmachines.virtualmachine.kubesphere.io", []string{"vm1"}, false); err != nil {
		return err
	}
	show(ctx, c, "get", "virtualmachines.kubevirt.io", "-n", ns)
	out, _, err := c.Kubectl(ctx, nil, "get", "virtualmachines.kubevirt.io", "vm1", "-n", ns, "-o",
		"jsonpath={range .spec.template.spec.volumes[*]}{.name}={.persistentVolumeClaim.claimName} {end}")
	if err != nil {
		return err
	}
	done("the seed's VirtualMachine made a KubeVirt VirtualMachine", t, "volumes: "+strings.TrimSpace(out))

	if c.KubeVirt() {
		if err := bootUnderKubeVirt(ctx, c); err != nil {
			return err
		}
	} else if err := bootUnderQEMU(ctx, c); err != nil {
		return err
	}

	export, err := seed("003-virtualmachinevolumeexport-fixed.yaml", "pvcName: mydisk", "pvcName: vmrootdisk")
	if err != nil {
		return err
	}
	t = time.Now()
	if err := apply(ctx, c, export); err != nil {
		return err
	}
	if err := waitFor(ctx, c, "virtualmachinevolumeexport", []string{"export"}, false); err != nil {
		return err
	}
	// The link is a bearer credential: it is in a Secret the export names, which the
	// namespace's viewers cannot read.
	secret, _, err := c.Kubectl(ctx, nil, "get", "virtualmachinevolumeexport", "export", "-n", ns, "-o", "jsonpath={.status.downloadSecretName}")
	if err != nil {
		return err
	}
	enc, _, err := c.Kubectl(ctx, nil, "get", "secret", secret, "-n", ns, "-o", "jsonpath={.data.url}")
	if err != nil {
		return err
	}
	raw, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return fmt.Errorf("the download Secret %s: %w", secret, err)
	}
	url := string(raw)
	got := filepath.Join(dir, "downloaded.qcow2")
	if err := tool("curl", "-sSf", "-o", got, url); err != nil {
		return err
	}
	if err := tool("qemu-img", "compare", image, got); err != nil {
		return fmt.Errorf("the downloaded export differs from the original: %w", err)
	}
	done("the seed's export of vmrootdisk, downloaded with curl; qemu-img compare: identical", t, got)

	t = time.Now()
	g, err := boot(ctx, got, "qcow2")
	if err != nil {
		return err
	}
	done("booted the downloaded export under QEMU", t, fmt.Sprintf("the guest sees a %s disk, booted in %.1f s", gib(g.Size), g.Took.Seconds()))
	return console(ctx, c, dir)
}

// consoleStop ends what reaching the console needed (kubectl proxy on the real cluster), when
// the demo ends.
var (
	consoleStop    = func() {}
	lastConsoleURL string
)

// console makes a user who administers the demo's namespace, and checks that the console
// answers them: its page, and who they are. It prints where to open it and their token.
func console(ctx context.Context, c framework.Cluster, dir string) error {
	t := time.Now()
	if err := apply(ctx, c, `apiVersion: v1
kind: ServiceAccount
metadata: {name: console-user}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: console-user}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: admin}
subjects: [{kind: ServiceAccount, name: console-user}]
---
# diskpipe's kinds, which admin holds where ClusterRoles are aggregated (not on the local cluster)
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: console-user-diskpipe}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: diskpipe-user}
subjects: [{kind: ServiceAccount, name: console-user}]
`); err != nil {
		return err
	}
	token, errOut, err := c.Kubectl(ctx, nil, "create", "token", "console-user", "-n", ns, "--duration=8h")
	if err != nil {
		return fmt.Errorf("a token for the console's user: %w: %s", err, errOut)
	}
	token = strings.TrimSpace(token)
	tokenFile := filepath.Join(dir, "console-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		return err
	}
	url, stop, err := c.ConsoleURL(ctx)
	if err != nil {
		return err
	}
	consoleStop, lastConsoleURL = stop, url
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"kapis/virtualization.kubesphere.io/v1beta1/whoami", nil)
	req.Header.Set("X-Diskpipe-Token", token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("the console's gateway: %w", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "console-user") {
		return fmt.Errorf("the console's gateway answered %d: %s", resp.StatusCode, body)
	}
	done("the console answers a user of namespace "+ns+" (whoami through its gateway)", t,
		fmt.Sprintf("open %s and sign in with the token in %s (namespace %s)", url, tokenFile, ns))
	return nil
}

func apply(ctx context.Context, c framework.Cluster, yaml string) error {
	out, errOut, err := c.Kubectl(ctx, []byte(yaml), "apply", "-n", ns, "-f", "-")
	fmt.Print(indent(out))
	if err != nil {
		return fmt.Errorf("kubectl apply: %w: %s", err, errOut)
	}
	return nil
}

func show(ctx context.Context, c framework.Cluster, args ...string) {
	out, errOut, _ := c.Kubectl(ctx, nil, args...)
	fmt.Print(indent(out + errOut))
}

// waitFor polls `kubectl get` until every named object's phase is Ready; progress shows the
// table while it waits.
func waitFor(ctx context.Context, c framework.Cluster, resource string, names []string, progress bool) error {
	const want, limit = "Ready", 3 * time.Minute
	deadline := time.Now().Add(limit)
	last := ""
	for {
		out, errOut, err := c.Kubectl(ctx, nil, "get", resource, "-n", ns, "-o", "custom-columns=NAME:.metadata.name,PHASE:.status.phase,PROGRESS:.status.progress,REASON:.status.conditions[?(@.type=='Ready')].reason")
		if err != nil {
			return fmt.Errorf("kubectl get %s: %w: %s", resource, err, errOut)
		}
		if progress && out != last {
			fmt.Print(indent("$ kubectl get " + resource + "\n" + out))
			last = out
		}
		ready := 0
		for _, line := range strings.Split(out, "\n") {
			fields := strings.Fields(line)
			for _, n := range names {
				if len(fields) >= 2 && fields[0] == n && fields[1] == want {
					ready++
				}
				if len(fields) >= 2 && fields[0] == n && fields[1] == "Failed" {
					return fmt.Errorf("%s %s failed:\n%s", resource, n, out)
				}
			}
		}
		if ready == len(names) {
			if !progress {
				fmt.Print(indent("$ kubectl get " + resource + "\n" + out))
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not %s after %s:\n%s", resource, want, limit, out)
		}
		time.Sleep(time.Second)
	}
}

func tool(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

func say(format string, args ...any) { fmt.Printf("\n==> "+format+"\n", args...) }

func done(name string, since time.Time, what string) {
	steps = append(steps, step{name, time.Since(since), what})
	fmt.Printf("==> %s (%.1f s): %s\n", name, time.Since(since).Seconds(), what)
}

func summary(total time.Duration) {
	fmt.Printf("\n%s\ndiskpipe demo: %d steps in %.0f s\n", strings.Repeat("=", 78), len(steps), total.Seconds())
	for i, s := range steps {
		fmt.Printf("%2d. %-72s %6.1f s\n    %s\n", i+1, s.name, s.took.Seconds(), s.what)
	}
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "demo:", err)
	os.Exit(1)
}

// boot boots a disk under QEMU (TCG, -snapshot) and shows what its serial console said.
func boot(ctx context.Context, disk, format string) (*bootdisk.Guest, error) {
	fi, err := os.Stat(disk)
	if err != nil {
		return nil, err
	}
	size := fi.Size()
	if format == "qcow2" {
		size = 0 // the guest sees the virtual size, read from the console's line
	}
	say("qemu-system-x86_64 -snapshot -drive file=%s,format=%s,if=virtio: the guest's serial console", disk, format)
	g, err := bootdisk.Boot(ctx, disk, format, 2*time.Minute)
	if g != nil {
		for _, l := range strings.Split(g.Serial, "\n") {
			if strings.Contains(l, "SYSLINUX") || strings.Contains(l, "Loading") || strings.Contains(l, "Linux version") ||
				strings.Contains(l, "virtio_blk") || strings.Contains(l, "DISKPIPE-BOOT") || strings.Contains(l, "Power down") {
				fmt.Print(indent(strings.TrimRight(l, "\r")))
			}
		}
	}
	if err != nil {
		return nil, err
	}
	if size != 0 && g.Size != size || g.Marker != bootdisk.Marker {
		return nil, fmt.Errorf("%s booted but the guest saw size %d and marker %q, want %d and %q", disk, g.Size, g.Marker, size, bootdisk.Marker)
	}
	return g, nil
}

func gib(n int64) string { return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30)) }

// bootUnderQEMU boots the VM's root disk (its bootOrder 1 disk's PVC) as KubeVirt would, under
// QEMU: the local cluster runs no KubeVirt.
func bootUnderQEMU(ctx context.Context, c framework.Cluster) error {
	t := time.Now()

	root, _, err := c.Kubectl(ctx, nil, "get", "virtualmachines.kubevirt.io", "vm1", "-n", ns, "-o",
		`jsonpath={.spec.template.spec.domain.devices.disks[?(@.bootOrder==1)].name}`)
	if err != nil {
		return err
	}
	claim, _, err := c.Kubectl(ctx, nil, "get", "virtualmachines.kubevirt.io", "vm1", "-n", ns, "-o",
		fmt.Sprintf(`jsonpath={.spec.template.spec.volumes[?(@.name==%q)].persistentVolumeClaim.claimName}`, root))
	if err != nil {
		return err
	}
	g, err := boot(ctx, filepath.Join(c.VolumePath(ns, claim), "disk.img"), "raw")
	if err != nil {
		return err
	}
	done(fmt.Sprintf("booted the VM's root disk (%s, PVC %s) under QEMU", root, claim), t,
		fmt.Sprintf("the guest sees a %s disk and the image's marker, booted in %.1f s", gib(g.Size), g.Took.Seconds()))
	return nil
}

// fixForKubeVirt waits for the real KubeVirt's word on the seed's VM: as written the seed asks
// for a macvtap interface, which needs a feature gate and a Multus network this cluster has
// not, so KubeVirt refuses it, and the VM's status says so. The demo then fixes the hardware
// as a user would, and drops the seed's CPU model (Westmere), which libvirt finds unusable on
// this machine's CPU, so that KubeVirt can schedule the VM.
func fixForKubeVirt(ctx context.Context, c framework.Cluster) error {
	t := time.Now()
	deadline := time.Now().Add(3 * time.Minute)
	msg := ""
	for !strings.HasPrefix(msg, "KubeVirtRefused") {
		if time.Now().After(deadline) {
			return fmt.Errorf("the seed's VM is not refused by KubeVirt after 3 minutes: %s", msg)
		}
		time.Sleep(time.Second)
		var err error
		if msg, _, err = c.Kubectl(ctx, nil, "get", "virtualmachines.virtualmachine.kubesphere.io", "vm1", "-n", ns, "-o",
			`jsonpath={.status.conditions[?(@.type=="Ready")].reason}: {.status.conditions[?(@.type=="Ready")].message}`); err != nil {
			return err
		}
	}
	fmt.Print(indent(msg + "\n"))
	if _, errOut, err := c.Kubectl(ctx, nil, "patch", "virtualmachines.virtualmachine.kubesphere.io", "vm1", "-n", ns, "--type=json", "-p", `[
{"op": "remove", "path": "/spec/hardware/domain/devices/interfaces"},
{"op": "remove", "path": "/spec/hardware/domain/cpu/model"},
{"op": "add", "path": "/spec/hardware/domain/devices/autoattachPodInterface", "value": false}]`); err != nil {
		return fmt.Errorf("kubectl patch: %w: %s", err, errOut)
	}
	done("KubeVirt refused the seed's hardware (the VM's status above); patched: no macvtap interface, no CPU model (this machine offers KubeVirt no named one)", t, "kubectl patch virtualmachine vm1")
	return nil
}

// bootUnderKubeVirt waits for the real KubeVirt to run the seed's VM and shows its serial
// console. The bootable disk powers the guest off once it has printed its lines, and KubeVirt
// starts it again (runStrategy Always) in a new launcher pod: every launcher pod is read,
// since the one that printed may already be ending.
func bootUnderKubeVirt(ctx context.Context, c framework.Cluster) error {
	t := time.Now()
	const wait = 6 * time.Minute
	deadline := time.Now().Add(wait)
	for {
		// The launcher pods of the namespace's one VM (the seed's template sets its own
		// vm.kubevirt.io/name label, so that one does not name the VM).
		pods, _, _ := c.Kubectl(ctx, nil, "get", "pods", "-n", ns, "-l", "kubevirt.io=virt-launcher", "-o", "jsonpath={.items[*].metadata.name}")
		for _, pod := range strings.Fields(pods) {
			log, _, _ := c.Kubectl(ctx, nil, "logs", "-n", ns, pod, "-c", "guest-console-log")
			_, boot, found := strings.Cut(log, "DISKPIPE-BOOT ")
			if !found {
				continue
			}
			show(ctx, c, "get", "virtualmachines.kubevirt.io,virtualmachineinstances.kubevirt.io", "-n", ns)
			fmt.Println("  The VM's serial console (kubectl logs " + pod + " -c guest-console-log), its last lines:")
			fmt.Print(indent(lastLines(log, 6)))
			done("KubeVirt ran the seed's VM; it booted from its diskpipe disk", t, "DISKPIPE-BOOT "+strings.TrimSpace(firstLine(boot)))
			// Left running, it would boot and power off again and again (runStrategy Always).
			_, _, _ = c.Kubectl(ctx, nil, "patch", "virtualmachines.virtualmachine.kubesphere.io", "vm1", "-n", ns, "--type=merge", "-p", `{"spec":{"runStrategy":"Halted"}}`)
			return nil
		}
		if time.Now().After(deadline) {
			show(ctx, c, "get", "virtualmachineinstances.kubevirt.io,pods", "-n", ns)
			return fmt.Errorf("the seed's VM said nothing on its serial console within %s; kubectl get vmi -n %s and kubectl get events -n %s say why", wait, ns, ns)
		}
		time.Sleep(time.Second)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n") + "\n"
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
