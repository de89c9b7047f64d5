package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// timed runs a command and measures its wall time and peak RSS.
func timed(name string, bytes int64, cmd string, args ...string) (measurement, error) {
	return timedEnv(name, bytes, nil, cmd, args...)
}

// timedEnv is timed with extra environment variables.
func timedEnv(name string, bytes int64, env []string, cmd string, args ...string) (measurement, error) {
	c := exec.Command(cmd, args...)
	c.Env = append(os.Environ(), env...)
	var out strings.Builder
	c.Stdout, c.Stderr = &out, &out
	start := time.Now()
	if err := c.Start(); err != nil {
		return measurement{}, err
	}
	hwm := watchHWM(c.Process.Pid)
	err := c.Wait()
	m := measurement{name: name, wall: time.Since(start), bytes: bytes, peakRSS: hwm()}
	if err != nil {
		return m, fmt.Errorf("%s %s: %w\n%s", cmd, strings.Join(args, " "), err, tail(out.String()))
	}
	if ru, ok := c.ProcessState.SysUsage().(*syscall.Rusage); ok {
		m.written = ru.Oublock * 512
		m.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return m, nil
}

// watchHWM reads process pid's peak RSS (VmHWM) every 20 ms until the returned function is
// called (once the process ended), which returns the last one read. A child's ru_maxrss is no
// measure of a small process: it counts what the child shared with this one between fork and
// exec (this process's own RSS, some 50 MiB).
func watchHWM(pid int) func() int64 {
	var peak atomic.Int64
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			if v, err := peakRSS(pid); err == nil && v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() int64 {
		close(done)
		<-stopped
		return peak.Load()
	}
}

func tail(s string) string {
	if len(s) > 2000 {
		return "..." + s[len(s)-2000:]
	}
	return s
}

func sh(cmd string, args ...string) error {
	out, err := exec.Command(cmd, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", cmd, strings.Join(args, " "), err, tail(string(out)))
	}
	return nil
}

// dropCaches makes each contender start from a cold page cache, where the kernel allows it.
func dropCaches() {
	_ = exec.Command("sync").Run()
	_ = os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200)
}

// fsImage makes (once, cached in work) a raw disk of 4 GiB holding an ext4 filesystem made
// with mkfs.ext4 -d from real directory trees of this machine: over 1 GiB of binaries, text
// and libraries, the mix a VM's root disk holds.
func fsImage(work string) (string, error) {
	raw := filepath.Join(work, "rootfs.raw")
	if _, err := os.Stat(raw); err == nil {
		return raw, nil
	}
	tree := filepath.Join(work, "tree")
	_ = os.RemoveAll(tree)
	if err := os.MkdirAll(tree, 0o755); err != nil {
		return "", err
	}
	fmt.Println("bench: building the fixture (once): copying /usr/local/go, /usr/share, /usr/lib/x86_64-linux-gnu")
	for _, src := range []string{"/usr/local/go", "/usr/share", "/usr/lib/x86_64-linux-gnu"} {
		if err := sh("cp", "-a", src, tree+"/"); err != nil {
			return "", err
		}
	}
	tmp := raw + ".tmp"
	if err := sh("mkfs.ext4", "-q", "-F", "-d", tree, tmp, "4G"); err != nil {
		return "", err
	}
	_ = os.RemoveAll(tree)
	return raw, os.Rename(tmp, raw)
}

// convertOnce makes dst from raw with qemu-img convert unless it exists.
func convertOnce(raw, dst string, args ...string) error {
	if _, err := os.Stat(dst); err == nil {
		return nil
	}
	tmp := dst + ".tmp"
	if err := sh("qemu-img", append(append([]string{"convert", "-f", "raw"}, args...), raw, tmp)...); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

func fileSize(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// allocated is the bytes a file holds on disk.
func allocated(p string) int64 {
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		return 0
	}
	return st.Blocks * 512
}
