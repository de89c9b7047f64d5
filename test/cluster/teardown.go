package cluster

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// killContainers kills every container containerd runs for the cluster, and their shims.
func killContainers(dir string, log io.Writer) {
	socks, _ := filepath.Glob(filepath.Join(dir, "node[0-9]*", "containerd", "containerd.sock"))
	for _, sock := range append([]string{filepath.Join(dir, "containerd", "containerd.sock")}, socks...) {
		if _, err := os.Stat(sock); err != nil {
			continue
		}
		killTasks(sock)
	}
	// The shims outlive containerd: they are found by the address they were given.
	killMatching(log, func(cmdline string) bool {
		return strings.Contains(cmdline, "containerd-shim") && strings.Contains(cmdline, dir)
	})
}

// killTasks SIGKILLs the containers of the containerd at sock.
func killTasks(sock string) {
	out, _ := exec.Command("ctr", "--address", sock, "-n", "k8s.io", "tasks", "ls", "-q").Output()
	for _, id := range strings.Fields(string(out)) {
		_ = exec.Command("ctr", "--address", sock, "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", id).Run()
	}
}

// killMatching SIGKILLs every process whose command line matches.
func killMatching(log io.Writer, match func(string) bool) {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if s := string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})); match(s) {
			fmt.Fprintf(log, "cluster: killing %d %.80s\n", pid, s)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// teardown removes what a cluster in dir left on the machine; it is safe to run when nothing
// is left. Dir/logs stays.
func teardown(dir string, log io.Writer) {
	killContainers(dir, log)
	// Processes of ours still running (a previous run that was killed): they name dir.
	killMatching(log, func(cmdline string) bool {
		return strings.Contains(cmdline, dir) && !strings.Contains(cmdline, "go test") && !strings.Contains(cmdline, ".test ")
	})
	for _, m := range mountsUnder(dir) {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			fmt.Fprintf(log, "cluster: unmount %s: %v\n", m, err)
		}
	}
	// Loop devices attached to the CSI driver's block volumes.
	if out, err := exec.Command("losetup", "-a").Output(); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			dev, rest, _ := strings.Cut(sc.Text(), ":")
			if strings.Contains(rest, dir) {
				_ = exec.Command("losetup", "-d", dev).Run()
			}
		}
	}
	// Network namespaces containerd made for pods and those of the nodes past the first, the
	// nodes' veth pairs (their routes go with them), the bridge and its route.
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 0 && (strings.HasPrefix(f[0], "cni-") || strings.HasPrefix(f[0], "dpnode-")) {
				_ = exec.Command("ip", "netns", "delete", f[0]).Run()
			}
		}
	}
	for i := 2; i <= MaxNodes; i++ {
		link, _, _ := newNode(i).veth()
		_ = exec.Command("ip", "link", "del", link).Run()
	}
	_ = exec.Command("ip", "route", "del", ServiceCIDR, "dev", Bridge).Run()
	_ = exec.Command("ip", "link", "del", Bridge).Run()
	dropChains(log, "", "KUBE-", "CNI-")
	dropSets(log, "", "KUBE-") // kube-router's, once no rule names them
	removeCgroups("kubepods")
	for i := 2; i <= MaxNodes; i++ {
		removeCgroups(newNode(i).name)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if e.Name() != "logs" {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				fmt.Fprintf(log, "cluster: removing %s: %v\n", e.Name(), err)
			}
		}
	}
}

// mountsUnder lists the mount points under dir, deepest first.
func mountsUnder(dir string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var ms []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			if p := unescapeMount(f[4]); strings.HasPrefix(p, dir+"/") {
				ms = append(ms, p)
			}
		}
	}
	sort.Slice(ms, func(i, j int) bool { return len(ms[i]) > len(ms[j]) })
	return ms
}

// inNetns is the command name and args run in network namespace netns ("": this one).
func inNetns(netns, name string, args ...string) *exec.Cmd {
	if netns == "" {
		return exec.Command(name, args...) //nolint:gosec // the cluster's own tools
	}
	return exec.Command("ip", append([]string{"netns", "exec", netns, name}, args...)...) //nolint:gosec // the cluster's own tools
}

// dropChains removes the iptables chains (and every rule that jumps to them) of network
// namespace netns ("": the machine's) whose names start with one of prefixes: those
// kube-proxy, the kubelet, the CNI plugins and kube-router made.
func dropChains(log io.Writer, netns string, prefixes ...string) {
	for _, tool := range []string{"iptables", "ip6tables"} {
		saved, err := inNetns(netns, tool+"-save").Output()
		if err != nil {
			continue
		}
		ours := func(s string) bool {
			for _, p := range prefixes {
				if strings.HasPrefix(s, p) {
					return true
				}
			}
			return false
		}
		var kept bytes.Buffer
		changed := false
		for _, line := range strings.Split(string(saved), "\n") {
			f := strings.Fields(line)
			drop := len(f) > 0 && strings.HasPrefix(f[0], ":") && ours(f[0][1:])
			for i := 0; i+1 < len(f) && !drop; i++ {
				drop = (f[i] == "-A" || f[i] == "-j" || f[i] == "-g") && ours(f[i+1])
			}
			if drop {
				changed = true
				continue
			}
			kept.WriteString(line + "\n")
		}
		if !changed {
			continue
		}
		cmd := inNetns(netns, tool+"-restore")
		cmd.Stdin = &kept
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(log, "cluster: %s-restore: %v: %s\n", tool, err, out)
		}
	}
}

// removeCgroups removes the kubelet's cgroup trees (cgroup v1: one per controller).
func removeCgroups(name string) {
	controllers, _ := os.ReadDir("/sys/fs/cgroup")
	for _, c := range controllers {
		root := filepath.Join("/sys/fs/cgroup", c.Name(), name)
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = os.Remove(dirs[i])
		}
	}
}

// dropSets destroys the ipsets of network namespace netns whose names start with prefix
// (kube-router's).
func dropSets(log io.Writer, netns, prefix string) {
	out, err := inNetns(netns, "ipset", "list", "-n").Output()
	if err != nil {
		return
	}
	for _, name := range strings.Fields(string(out)) {
		if strings.HasPrefix(name, prefix) {
			if err := inNetns(netns, "ipset", "destroy", name).Run(); err == nil {
				fmt.Fprintf(log, "destroyed the ipset %s\n", name)
			}
		}
	}
}
