package importer

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// The tests below run the importer command as its pod does, with the egress rule of its flags
// (transfer.Egress): without --allow-destination, every server here, on loopback, is refused.

// runEgress runs the importer command with exactly args (no loopback allowance) and returns
// its exit code, result, and log; it fails the test if the canary shows in either.
func runEgress(t *testing.T, canary string, args ...string) (int, *transfer.Result, string) {
	t.Helper()
	term := filepath.Join(t.TempDir(), "termination-log")
	var log bytes.Buffer
	code := Main(t.Context(), append([]string{"--termination-message-path", term, "--metrics-addr", "", "--retries", "2"}, args...), &log)
	msg, err := os.ReadFile(term)
	if err != nil {
		t.Fatalf("no termination message (exit %d): %v\n%s", code, err, log.String())
	}
	if canary != "" && (strings.Contains(string(msg), canary) || strings.Contains(log.String(), canary)) {
		t.Errorf("the secret's value shows in the result or the log:\n%s\n%s", msg, log.String())
	}
	res, err := transfer.ReadResult(string(msg))
	if err != nil {
		t.Fatal(err)
	}
	return code, res, log.String()
}

// serveOn serves h on ip (a loopback address of its own) and returns its base URL.
func serveOn(t *testing.T, ip string, h http.Handler) string {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &httptest.Server{Listener: l, Config: &http.Server{Handler: h}} //nolint:gosec // a test server
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

// recorder serves a raw disk and records each request's headers.
type recorder struct {
	disk string
	mu   sync.Mutex
	seen []http.Header
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	r.seen = append(r.seen, req.Header.Clone())
	r.mu.Unlock()
	http.ServeFile(w, req, r.disk)
}

func (r *recorder) requests() []http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]http.Header(nil), r.seen...)
}

func redirectTo(url string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, url, http.StatusFound) })
}

func wantForbidden(t *testing.T, code int, res *transfer.Result, log string, names ...string) {
	t.Helper()
	if code != 1 || res.Reason != transfer.ReasonForbiddenDestination || res.Transient {
		t.Fatalf("exit %d, reason %s, transient %v: %s\n%s", code, res.Reason, res.Transient, res.Message, log)
	}
	for _, n := range append(names, transfer.AllowedDestinationsValue) {
		if !strings.Contains(res.Message, n) {
			t.Errorf("the refusal does not name %q: %s", n, res.Message)
		}
	}
}

func TestEgressRefusesLoopbackByDefault(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	rec := &recorder{disk: raw}
	base := serveOn(t, "127.0.0.1", rec)
	target := filepath.Join(t.TempDir(), "disk.img")

	code, res, log := runEgress(t, "", "--url", base+"/disk.raw", "--target", target)
	wantForbidden(t, code, res, log, "127.0.0.1", "loopback")
	// A host name is checked on what it resolves to.
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(base, "http://"))
	code, res, log = runEgress(t, "", "--url", "http://localhost:"+port+"/disk.raw", "--target", target)
	wantForbidden(t, code, res, log, "localhost")
	// The probe and the check obey the same rule.
	code, res, log = runEgress(t, "", "--url", base+"/disk.raw", "--probe")
	wantForbidden(t, code, res, log, "127.0.0.1")
	code, res, log = runEgress(t, "", "--url", base+"/disk.raw", "--check")
	wantForbidden(t, code, res, log, "127.0.0.1")
	if n := len(rec.requests()); n != 0 {
		t.Errorf("the refused server got %d requests", n)
	}
	if _, err := os.Stat(target); err == nil {
		t.Error("a refused import left a disk")
	}

	// Allowed, by address or CIDR, the same server is imported from.
	code, res, log = runEgress(t, "", "--url", base+"/disk.raw", "--target", target, "--allow-destination", "127.0.0.1")
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, res.Message, log)
	}
	sameDisk(t, raw, target)
}

func TestEgressRedirects(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	inside := &recorder{disk: raw}
	insideURL := serveOn(t, "127.0.0.1", inside) // stands for the metadata service or a Service
	mirror := &recorder{disk: raw}
	mirrorURL := serveOn(t, "127.0.0.3", mirror)
	const canary = "canary-d1f0e5"
	secrets := t.TempDir()
	writeFile(t, filepath.Join(secrets, "header"), []byte("X-Auth-Token: "+canary))
	writeFile(t, filepath.Join(secrets, "username"), []byte("alice"))
	writeFile(t, filepath.Join(secrets, "password"), []byte(canary))
	creds := []string{"--header-file", filepath.Join(secrets, "header"), "--auth-dir", secrets, "--header", "X-Plain: kept"}

	t.Run("to a refused address", func(t *testing.T) {
		front := serveOn(t, "127.0.0.2", redirectTo(insideURL+"/disk.raw"))
		code, res, log := runEgress(t, canary, append([]string{"--url", front + "/disk.raw", "--target", filepath.Join(t.TempDir(), "disk.img"),
			"--allow-destination", "127.0.0.2"}, creds...)...)
		wantForbidden(t, code, res, log, "127.0.0.1")
		if n := len(inside.requests()); n != 0 {
			t.Errorf("the redirect's refused target got %d requests", n)
		}
	})
	t.Run("credentials stay with the host the user named", func(t *testing.T) {
		front := serveOn(t, "127.0.0.2", redirectTo(mirrorURL+"/disk.raw"))
		target := filepath.Join(t.TempDir(), "disk.img")
		code, res, log := runEgress(t, canary, append([]string{"--url", front + "/disk.raw", "--target", target, "--format", "raw",
			"--allow-destination", "127.0.0.2", "--allow-destination", "127.0.0.3/32"}, creds...)...)
		if code != 0 {
			t.Fatalf("exit %d: %s\n%s", code, res.Message, log)
		}
		sameDisk(t, raw, target)
		reqs := mirror.requests()
		if len(reqs) == 0 {
			t.Fatal("the mirror got no request")
		}
		for _, h := range reqs {
			if h.Get("X-Auth-Token") != "" || h.Get("Authorization") != "" {
				t.Errorf("a Secret's header reached the host a redirect named: %v", h)
			}
			if h.Get("X-Plain") != "kept" {
				t.Errorf("a plain header was dropped: %v", h)
			}
		}
	})
	t.Run("credentials follow a redirect on the same host", func(t *testing.T) {
		mux := http.NewServeMux()
		same := &recorder{disk: raw}
		mux.Handle("/moved", redirectTo("/disk.raw"))
		mux.Handle("/disk.raw", same)
		base := serveOn(t, "127.0.0.4", mux)
		code, res, log := runEgress(t, canary, append([]string{"--url", base + "/moved", "--target", filepath.Join(t.TempDir(), "disk.img"),
			"--allow-destination", "127.0.0.4"}, creds...)...)
		if code != 0 {
			t.Fatalf("exit %d: %s\n%s", code, res.Message, log)
		}
		for _, h := range same.requests() {
			if h.Get("X-Auth-Token") != canary || h.Get("Authorization") == "" {
				t.Errorf("the named host did not get its credentials: %v", h)
			}
		}
	})
	t.Run("to file:", func(t *testing.T) {
		front := serveOn(t, "127.0.0.2", redirectTo("file:///etc/passwd"))
		code, res, log := runEgress(t, canary, "--url", front+"/disk.raw", "--target", filepath.Join(t.TempDir(), "disk.img"), "--allow-destination", "127.0.0.2")
		if code != 1 || res.Reason != transfer.ReasonForbiddenDestination || !strings.Contains(res.Message, "file:") {
			t.Fatalf("exit %d, reason %s: %s\n%s", code, res.Reason, res.Message, log)
		}
	})
	t.Run("without end", func(t *testing.T) {
		front := serveOn(t, "127.0.0.2", redirectTo("/again"))
		code, res, log := runEgress(t, canary, "--url", front+"/disk.raw", "--target", filepath.Join(t.TempDir(), "disk.img"), "--allow-destination", "127.0.0.2")
		if code != 1 || res.Transient || !strings.Contains(res.Message, "redirects") {
			t.Fatalf("exit %d, reason %s: %s\n%s", code, res.Reason, res.Message, log)
		}
	})
}

// A header Secret that is not "Name: value" is refused by its file's name, never echoed.
func TestMalformedHeaderSecretNotEchoed(t *testing.T) {
	const canary = "canary-7ab31c-no-colon"
	f := filepath.Join(t.TempDir(), "header")
	writeFile(t, f, []byte(canary))
	code, res, _ := runEgress(t, canary, "--url", "http://example.invalid/disk.raw", "--target", filepath.Join(t.TempDir(), "disk.img"), "--header-file", f)
	if code != 1 || res.Reason != transfer.ReasonInvalidArgument || !strings.Contains(res.Message, f) {
		t.Fatalf("exit %d, reason %s: %s", code, res.Reason, res.Message)
	}
}

func TestEgressOtherSources(t *testing.T) {
	t.Run("s3", func(t *testing.T) {
		base := serveOn(t, "127.0.0.1", http.NotFoundHandler())
		code, res, log := runEgress(t, "", "--source", "s3", "--endpoint", base, "--bucket", "images", "--object", "disk.raw",
			"--target", filepath.Join(t.TempDir(), "disk.img"))
		wantForbidden(t, code, res, log, "127.0.0.1")
	})
	t.Run("registry", func(t *testing.T) {
		addr := registry(t)
		code, res, log := runEgress(t, "", "--source", "registry", "--url", "docker://"+addr+"/containerdisks/test:latest", "--insecure",
			"--target", filepath.Join(t.TempDir(), "disk.img"))
		wantForbidden(t, code, res, log, "127.0.0.1")
	})
	t.Run("registry allowed", func(t *testing.T) {
		dir := t.TempDir()
		raw := makeRaw(t, dir)
		img := containerDisk(t, raw, "amd64", "disk")
		addr := registry(t)
		push(t, addr, "containerdisks/ok", "latest", img.Manifest, "application/vnd.oci.image.manifest.v1+json", img.Blobs)
		target := filepath.Join(t.TempDir(), "disk.img")
		code, res, log := runEgress(t, "", "--source", "registry", "--url", "docker://"+addr+"/containerdisks/ok:latest", "--insecure",
			"--target", target, "--allow-destination", "127.0.0.0/8")
		if code != 0 {
			t.Fatalf("exit %d: %s\n%s", code, res.Message, log)
		}
		sameDisk(t, raw, target)
	})
}

// An oci-archive: source would be a file of the importer's own pod, unpacked into scratch
// space it does not have: refused for good, saying what to do instead.
func TestOCIArchiveRefused(t *testing.T) {
	code, res, log := runEgress(t, "", "--source", "registry", "--url", "oci-archive:/etc/passwd", "--target", filepath.Join(t.TempDir(), "disk.img"))
	if code != 1 || res.Reason != transfer.ReasonInvalidArgument || res.Transient || !strings.Contains(res.Message, "must start with docker://") {
		t.Fatalf("exit %d, reason %s: %s\n%s", code, res.Reason, res.Message, log)
	}
}
