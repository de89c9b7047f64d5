package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/diskpipe/diskpipe/test/freeport"
)

// nginx is Debian's nginx serving a directory on 127.0.0.1 as a production mirror would:
// sendfile, tcp_nopush, Range, keep-alive. Its access log counts what each contender read.
type nginx struct {
	URL string
	cmd *exec.Cmd
	log string
	// seen is how many access-log lines earlier contenders used.
	seen int
}

func startNginx(dir string) (*nginx, error) {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/nginx"); serr != nil {
			return nil, fmt.Errorf("nginx is not installed (hack/setup.sh installs nginx-light): %w", err)
		}
		bin = "/usr/sbin/nginx"
	}
	addr, err := freeport.Addr("127.0.0.1")
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "bench-nginx-")
	if err != nil {
		return nil, err
	}
	user := ""
	if os.Geteuid() == 0 {
		user = "user root;" // the fixtures live in the project's bin/, which www-data may not read
	}
	conf := fmt.Sprintf(`%s
daemon off;
worker_processes auto;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log;
events { worker_connections 1024; }
http {
  default_type application/octet-stream;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 100000;
  client_body_temp_path %[2]s/body;
  proxy_temp_path %[2]s/proxy;
  fastcgi_temp_path %[2]s/fastcgi;
  uwsgi_temp_path %[2]s/uwsgi;
  scgi_temp_path %[2]s/scgi;
  log_format bench '$status $body_bytes_sent';
  access_log %[2]s/access.log bench;
  server {
    listen %[3]s;
    root %[4]s;
  }
}
`, user, tmp, addr, dir)
	if err := os.WriteFile(filepath.Join(tmp, "nginx.conf"), []byte(conf), 0o644); err != nil {
		return nil, err
	}
	n := &nginx{URL: "http://" + addr + "/", log: filepath.Join(tmp, "access.log")}
	n.cmd = exec.Command(bin, "-e", filepath.Join(tmp, "error.log"), "-p", tmp, "-c", filepath.Join(tmp, "nginx.conf"))
	n.cmd.Stderr = os.Stderr
	if err := n.cmd.Start(); err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return n, nil
		}
		if time.Now().After(deadline) {
			n.Stop()
			return nil, fmt.Errorf("nginx did not listen on %s: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Read returns the requests and body bytes served since the last call.
func (n *nginx) Read() (requests int, bytes int64) {
	f, err := os.Open(n.log)
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	line := 0
	for sc.Scan() {
		line++
		if line <= n.seen {
			continue
		}
		fields := strings.Fields(sc.Text())
		if len(fields) == 2 {
			b, _ := strconv.ParseInt(fields[1], 10, 64)
			requests++
			bytes += b
		}
	}
	n.seen = line
	return requests, bytes
}

// Stop shuts nginx down: SIGTERM makes the master stop its workers (a killed master would
// leave them running).
func (n *nginx) Stop() {
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	_ = n.cmd.Wait()
	_ = os.RemoveAll(filepath.Dir(n.log))
}
