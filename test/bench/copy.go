package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/diskpipe/diskpipe/test/pki"
)

// benchCopy measures a host-assisted copy between nodes as the pods run it: the clone-source
// pod's importer serving a disk (importer --serve, to the bearer of a token) and the writer's
// importer reading it over HTTPS into a new disk, against curl of the same served disk and
// qemu-img convert of the file. A fan-out runs many of these per node, so both sides' peak RSS
// is the figure that counts (target <= 64 MiB each).
func benchCopy(root, work string) error {
	raw, importer, err := fixture(root, work)
	if err != nil {
		return err
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	token := hex.EncodeToString(b)
	tokenFile := filepath.Join(work, "copy-token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		return err
	}
	defer os.Remove(tokenFile)
	// The clone source serves over TLS, as its pod does, with a certificate the reader trusts.
	tlsDir := filepath.Join(work, "copy-tls")
	defer os.RemoveAll(tlsDir)
	ca, err := pki.New(tlsDir, "bench-copy CA")
	if err != nil {
		return err
	}
	crt, key, err := ca.Issue("serve", serverName, nil, serverName, "127.0.0.1") // curl checks the address
	if err != nil {
		return err
	}
	tlsFiles := serveTLS{crt: crt, key: key}
	runs := benchRuns()
	size := fileSize(raw)
	fmt.Printf("bench-copy: %s, %.2f GiB virtual, %.2f GiB of data, served by importer --serve on loopback; median of %d cold runs\n",
		raw, float64(size)/(1<<30), float64(allocated(raw))/(1<<30), runs)

	out := filepath.Join(work, "copied.raw")
	ref := filepath.Join(work, "copy-qemu-img.raw")
	defer os.Remove(out)
	defer os.Remove(ref)
	var curl, qemu []measurement
	var ours, served [2][]measurement
	for range runs {
		srv, url, err := startServe(importer, raw, tokenFile, tlsFiles)
		if err != nil {
			return err
		}
		auth := "Authorization: Bearer " + token
		dropCaches()
		m, err := timed("curl -o /dev/null (the served disk)", size, "curl", "-sSf", "-H", auth, "--cacert", ca.CAFile, "-o", "/dev/null", url)
		if err != nil {
			_, _ = srv.stop()
			return err
		}
		curl = append(curl, m)
		_ = os.Remove(ref)
		dropCaches()
		if m, err = timed("qemu-img convert -O raw (local)", size, "qemu-img", "convert", "-t", "writeback", "-O", "raw", raw, ref); err != nil {
			_, _ = srv.stop()
			return err
		}
		qemu = append(qemu, m)
		_, _ = srv.stop()
		// Two copies, each from a server of its own (its peak and CPU are this copy's alone):
		// as the pods copy (the clone source's list of extents: only the data is sent), and of
		// the whole disk as from a server that lists none (every byte sent and hashed), the
		// one to set beside curl byte for byte.
		for i, list := range []bool{true, false} {
			_ = os.Remove(out)
			if srv, url, err = startServe(importer, raw, tokenFile, tlsFiles); err != nil {
				return err
			}
			args := []string{"--source", "http", "--url", url, "--header", auth, "--ca-file", ca.CAFile, "--tls-server-name", serverName,
				"--format", "raw", "--target", out, "--capacity", strconv.FormatInt(size*2, 10), "--allow-destination", "127.0.0.1",
				"--metrics-addr", "", "--termination-message-path", ""}
			name := "diskpipe copy, whole disk"
			if list {
				args = append(args, "--extents-url", strings.TrimSuffix(url, "/disk")+"/extents")
				name = "diskpipe copy, as pods (extents)"
			}
			dropCaches()
			m, err = timed(name, size, importer, append(args, profile(fmt.Sprintf("copy%d", i))...)...)
			sm, serr := srv.stop()
			if err != nil {
				return err
			}
			if serr != nil {
				return serr
			}
			ours[i], served[i] = append(ours[i], m), append(served[i], sm)
			if err := sh("qemu-img", "compare", "-f", "raw", "-F", "raw", raw, out); err != nil {
				return fmt.Errorf("the copy differs from its source: %w", err)
			}
		}
	}
	c, q := median(curl), median(qemu)
	floor := max(c.wall, q.wall)
	fmt.Println("  " + c.String())
	fmt.Println("  " + q.String())
	gib := float64(size) / (1 << 30)
	for i, what := range []string{"as pods copy", "whole disk"} {
		o, s := median(ours[i]), median(served[i])
		fmt.Println("  " + o.String())
		fmt.Printf("  %-34s %8.1f MiB peak RSS, %.2f s CPU\n", "  its clone source (--serve)", float64(s.peakRSS)/(1<<20), s.cpu.Seconds())
		fmt.Printf("  %s: wall / max(curl, qemu-img) = %.2f (target <= 1.2); CPU per GiB of disk: reader %.2f s, server %.2f s; peak RSS: reader %.0f MiB, server %.0f MiB (target <= 64 each)\n",
			what, o.wall.Seconds()/floor.Seconds(), o.cpu.Seconds()/gib, s.cpu.Seconds()/gib, float64(o.peakRSS)/(1<<20), float64(s.peakRSS)/(1<<20))
	}
	fmt.Println("  every copy identical to its source by qemu-img compare")
	return nil
}

// profile is the flag that makes an importer write its CPU profile into $BENCH_PROFILE (a
// directory) as name.pprof, for `go tool pprof`; none without it.
func profile(name string) []string {
	dir := os.Getenv("BENCH_PROFILE")
	if dir == "" {
		return nil
	}
	return []string{"--cpu-profile", filepath.Join(dir, name+".pprof")}
}

// serverName is the name the bench's clone source is reached by, resolved to loopback.
const serverName = "clone-source.bench.invalid"

// serveTLS is the clone source's certificate and key.
type serveTLS struct{ crt, key string }

// serveProc is an importer --serve process.
type serveProc struct {
	cmd *exec.Cmd
	hwm func() int64
}

// startServe starts importer --serve of disk on a free loopback port, over TLS, and waits
// until it answers; it returns the disk's URL.
func startServe(importer, disk, tokenFile string, tf serveTLS) (*serveProc, string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(importer, append([]string{"--serve", addr, "--path", disk, "--token-file", tokenFile, "--tls-cert-file", tf.crt, "--tls-key-file", tf.key,
		"--metrics-addr", "", "--termination-message-path", ""}, profile("serve")...)...)
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	for start := time.Now(); time.Since(start) < 10*time.Second; time.Sleep(50 * time.Millisecond) {
		if conn, err := net.Dial("tcp", addr); err == nil {
			conn.Close()
			return &serveProc{cmd: cmd, hwm: watchHWM(cmd.Process.Pid)}, "https://" + addr + "/disk", nil
		}
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	return nil, "", fmt.Errorf("importer --serve did not listen on %s: %s", addr, tail(log.String()))
}

// stop ends the server and returns its peak RSS and CPU.
func (p *serveProc) stop() (measurement, error) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.cmd.Wait() // ended by the signal
	m := measurement{name: "importer --serve", peakRSS: p.hwm()}
	ru, ok := p.cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		return m, fmt.Errorf("no resource usage of importer --serve")
	}
	m.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return m, nil
}
