package importer

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/test/pki"
)

// asImporter makes the test binary run the importer command (TestMain): Go reads a process's
// proxy environment once, so the proxy tests start the importer as a process of its own, with
// the environment an importer pod gets (importpod.Config.Proxy).
const asImporter = "DISKPIPE_TEST_AS_IMPORTER"

func TestMain(m *testing.M) {
	if os.Getenv(asImporter) == "1" {
		os.Exit(Main(context.Background(), os.Args[1:], os.Stderr))
	}
	os.Exit(m.Run())
}

// runProcess runs the importer command as a process with env added to this one's, and
// returns its exit code and result.
func runProcess(t *testing.T, env []string, args ...string) (int, *transfer.Result, string) {
	t.Helper()
	term := filepath.Join(t.TempDir(), "termination-log")
	cmd := exec.CommandContext(t.Context(), os.Args[0], append([]string{"--termination-message-path", term, "--metrics-addr", "",
		"--retries", "1"}, args...)...)
	cmd.Env = append(os.Environ(), append([]string{asImporter + "=1"}, env...)...)
	out, _ := cmd.CombinedOutput()
	msg, err := os.ReadFile(term)
	if err != nil {
		t.Fatalf("no termination message (exit %d): %v\n%s", cmd.ProcessState.ExitCode(), err, out)
	}
	res, err := transfer.ReadResult(string(msg))
	if err != nil {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), res, string(out)
}

// forwardProxy is an HTTP proxy: CONNECT tunnels (https sources) and absolute-form requests
// (http sources), each recorded as "METHOD host".
type forwardProxy struct {
	mu   sync.Mutex
	seen []string
}

func (p *forwardProxy) requests() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.seen...)
}

func (p *forwardProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	p.seen = append(p.seen, r.Method+" "+r.Host)
	p.mu.Unlock()
	if r.Method != http.MethodConnect {
		r.RequestURI = ""
		resp, err := http.DefaultTransport.RoundTrip(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
		return
	}
	dst, err := net.Dial("tcp", r.Host)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer dst.Close()
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	_, _ = conn.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n"))
	go func() {
		_, _ = io.Copy(dst, buf)
		_ = dst.(*net.TCPConn).CloseWrite()
	}()
	_, _ = io.Copy(conn, dst)
}

// hostAddress is an address of this machine other than loopback: Go sends no request for a
// loopback host through a proxy.
func hostAddress(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	t.Fatal("this machine has no IPv4 address but loopback: the proxy tests need one")
	return ""
}

// TestImportThroughProxy imports as a pod given a proxy does: an https source reached through
// the proxy's tunnel and trusted by the proxy's CA alone (a proxy that re-signs what it relays),
// an http source sent to the proxy, a host in NO_PROXY reached directly, and the cloud's
// metadata address refused before the proxy is asked.
func TestImportThroughProxy(t *testing.T) {
	dir := t.TempDir()
	raw := makeRaw(t, dir)
	qcow := convertTo(t, raw, "qcow2")
	host := hostAddress(t)

	ca, err := pki.New(filepath.Join(dir, "pki"), "proxy-ca")
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err := ca.Issue("source", "source", nil, host)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(crt, key)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(ca.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	listen := func(t *testing.T, h http.Handler, tlsConfig *tls.Config) string {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: h, TLSConfig: tlsConfig}
		scheme := "http"
		if tlsConfig != nil {
			scheme = "https"
			go func() { _ = srv.ServeTLS(l, "", "") }()
		} else {
			go func() { _ = srv.Serve(l) }()
		}
		t.Cleanup(func() { _ = srv.Close() })
		return scheme + "://" + l.Addr().String()
	}
	httpsSource := listen(t, &fileServer{path: qcow}, &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12})
	httpSource := listen(t, &fileServer{path: qcow}, nil)
	proxy := &forwardProxy{}
	proxyURL := listen(t, proxy, nil)
	env := []string{"HTTP_PROXY=" + proxyURL, "HTTPS_PROXY=" + proxyURL, "NO_PROXY=.svc"}
	file := "/" + filepath.Base(qcow)

	target := filepath.Join(t.TempDir(), "disk.img")
	code, res, out := runProcess(t, append(env, transfer.ProxyCAEnv+"="+string(caPEM)), "--url", httpsSource+file, "--target", target)
	if code != transfer.ExitSucceeded || !res.Succeeded {
		t.Fatalf("https through the proxy: exit %d, result %+v\n%s", code, res, out)
	}
	sameDisk(t, raw, target)
	if got := proxy.requests(); len(got) != 1 || got[0] != "CONNECT "+strings.TrimPrefix(httpsSource, "https://") {
		t.Fatalf("the proxy saw %q, want one CONNECT to the source", got)
	}

	// Without the proxy's CA the source's certificate is not trusted: a clear failure.
	code, res, _ = runProcess(t, env, "--url", httpsSource+file, "--target", filepath.Join(t.TempDir(), "disk.img"))
	if code == transfer.ExitSucceeded || res.Succeeded || !strings.Contains(res.Message, "certificate") {
		t.Fatalf("https without the proxy's CA: exit %d, result %+v", code, res)
	}

	target = filepath.Join(t.TempDir(), "disk.img")
	code, res, out = runProcess(t, env, "--url", httpSource+file, "--target", target)
	if code != transfer.ExitSucceeded || !res.Succeeded {
		t.Fatalf("http through the proxy: exit %d, result %+v\n%s", code, res, out)
	}
	sameDisk(t, raw, target)
	seen := len(proxy.requests())
	if last := proxy.requests()[seen-1]; last != "GET "+strings.TrimPrefix(httpSource, "http://") {
		t.Fatalf("the proxy's last request is %q, want the http source's GET", last)
	}

	direct := []string{"HTTP_PROXY=" + proxyURL, "NO_PROXY=" + host}
	code, res, out = runProcess(t, direct, "--url", httpSource+file, "--target", filepath.Join(t.TempDir(), "disk.img"))
	if code != transfer.ExitSucceeded || !res.Succeeded {
		t.Fatalf("http in NO_PROXY: exit %d, result %+v\n%s", code, res, out)
	}
	if n := len(proxy.requests()); n != seen {
		t.Fatalf("a host in NO_PROXY went through the proxy: %q", proxy.requests()[seen:])
	}

	code, res, _ = runProcess(t, env, "--url", "http://169.254.169.254/latest/meta-data/disk.img", "--target", filepath.Join(t.TempDir(), "disk.img"))
	if code != transfer.ExitFailed || res.Reason != transfer.ReasonForbiddenDestination || !strings.Contains(res.Message, "169.254.169.254") {
		t.Fatalf("the metadata address through the proxy: exit %d, result %+v", code, res)
	}
	if n := len(proxy.requests()); n != seen {
		t.Fatalf("the proxy was asked for a refused address: %q", proxy.requests()[seen:])
	}
}
