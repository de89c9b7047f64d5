package importer

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/test/freeport"
)

// loopback is where the tests' servers listen, which the importer refuses unless allowed.
const loopback = "127.0.0.0/8"

// runMain runs the importer command and returns its exit code, result and log.
func runMain(t *testing.T, args ...string) (int, *transfer.Result, string) {
	t.Helper()
	term := filepath.Join(t.TempDir(), "termination-log")
	var log bytes.Buffer
	code := Main(t.Context(), append([]string{"--termination-message-path", term, "--metrics-addr", "",
		"--retries", "2", "--allow-destination", loopback}, args...), &log)
	msg, err := os.ReadFile(term)
	if err != nil {
		t.Fatalf("no termination message (exit %d): %v\n%s", code, err, log.String())
	}
	if len(msg) > 4096 {
		t.Errorf("termination message of %d bytes exceeds the kubelet's 4096", len(msg))
	}
	res, err := transfer.ReadResult(string(msg))
	if err != nil {
		t.Fatal(err)
	}
	return code, res, log.String()
}

// TestCommand checks the command's contract: exit codes and the JSON result.
func TestCommand(t *testing.T) {
	dir := t.TempDir()
	raw := makeRaw(t, dir)
	qcow := convertTo(t, raw, "qcow2")
	url := serve(t, &fileServer{path: qcow})

	target := filepath.Join(t.TempDir(), "disk.img")
	code, res, log := runMain(t, "--url", url, "--target", target, "--checksum", sha256File(t, qcow))
	if code != transfer.ExitSucceeded || !res.Succeeded {
		t.Fatalf("exit %d, result %+v\n%s", code, res, log)
	}
	sameDisk(t, raw, target)
	if res.Format != "qcow2" || res.VirtualSize != fixtureSize || res.Digest != sha256File(t, qcow) ||
		res.BytesRead == 0 || res.BytesWritten == 0 || res.DurationSeconds <= 0 {
		t.Errorf("incomplete result: %+v", res)
	}

	code, res, _ = runMain(t, "--url", serve(t, &fileServer{path: "x", status: 404}), "--target", filepath.Join(t.TempDir(), "disk.img"))
	if code != transfer.ExitFailed || res.Reason != transfer.ReasonSourceNotFound || res.Transient || res.Message == "" {
		t.Errorf("404: exit %d, result %+v", code, res)
	}
	code, res, _ = runMain(t, "--url", serve(t, &fileServer{path: "x", fail503: 100}), "--target", filepath.Join(t.TempDir(), "disk.img"))
	if code != transfer.ExitTransient || res.Reason != transfer.ReasonSourceUnavailable || !res.Transient {
		t.Errorf("503: exit %d, result %+v", code, res)
	}
	code, res, _ = runMain(t, "--source", "blank", "--blank-size", "1048576", "--target", filepath.Join(t.TempDir(), "disk.img"))
	if code != 0 || res.VirtualSize != 1<<20 {
		t.Errorf("blank: exit %d, result %+v", code, res)
	}
	code, res, _ = runMain(t, "--source", "carrier-pigeon", "--target", "x")
	if code != transfer.ExitFailed || res.Reason != transfer.ReasonInvalidArgument {
		t.Errorf("unknown source: exit %d, result %+v", code, res)
	}
	if code := Main(t.Context(), []string{"--no-such-flag"}, io.Discard); code != transfer.ExitUsage {
		t.Errorf("bad flag: exit %d, want %d", code, transfer.ExitUsage)
	}
}

// TestCommandCredentials sends basic auth and headers read from mounted Secret files.
func TestCommandCredentials(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	files := &fileServer{path: raw}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, pass, ok := r.BasicAuth()
		if !ok || user != "alice" || pass != "s3cret" || r.Header.Get("X-Token") != "abc" || r.Header.Get("X-Tenant") != "blue" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		files.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)

	secrets := t.TempDir()
	writeFile(t, filepath.Join(secrets, "username"), []byte("alice\n"))
	writeFile(t, filepath.Join(secrets, "password"), []byte("s3cret"))
	writeFile(t, filepath.Join(secrets, "tenant"), []byte("X-Tenant: blue"))
	target := filepath.Join(t.TempDir(), "disk.img")
	code, res, log := runMain(t, "--url", srv.URL+"/disk.raw", "--target", target, "--auth-dir", secrets,
		"--header", "X-Token: abc", "--header-file", filepath.Join(secrets, "tenant"))
	if code != 0 {
		t.Fatalf("exit %d, result %+v\n%s", code, res, log)
	}
	sameDisk(t, raw, target)

	// CDI's forms, as its users' Secrets hold them and a pod mounts them: basic auth under
	// accessKeyId and secretKey; a header Secret mounted whole, each key a header; the
	// volume's own dot-entries are not keys.
	cdi, headers := t.TempDir(), t.TempDir()
	writeFile(t, filepath.Join(cdi, "accessKeyId"), []byte("alice"))
	writeFile(t, filepath.Join(cdi, "secretKey"), []byte("s3cret\n"))
	writeFile(t, filepath.Join(headers, "token"), []byte("X-Token: abc"))
	writeFile(t, filepath.Join(headers, "tenant"), []byte("X-Tenant: blue"))
	if err := os.Mkdir(filepath.Join(headers, "..data"), 0o755); err != nil {
		t.Fatal(err)
	}
	target = filepath.Join(t.TempDir(), "disk.img")
	code, res, log = runMain(t, "--url", srv.URL+"/disk.raw", "--target", target, "--auth-dir", cdi, "--header-file", headers)
	if code != 0 {
		t.Fatalf("CDI's Secrets: exit %d, result %+v\n%s", code, res, log)
	}
	sameDisk(t, raw, target)
	code, res, _ = runMain(t, "--url", srv.URL+"/disk.raw", "--target", target, "--auth-dir", headers)
	if code != transfer.ExitFailed || !strings.Contains(res.Message, "neither password nor secretKey") {
		t.Errorf("a Secret without credentials: exit %d, result %+v", code, res)
	}

	code, res, _ = runMain(t, "--url", srv.URL+"/disk.raw", "--target", target)
	if code != transfer.ExitFailed || res.Reason != transfer.ReasonSourceForbidden {
		t.Errorf("without credentials: exit %d, result %+v", code, res)
	}
	code, res, _ = runMain(t, "--url", srv.URL+"/disk.raw", "--target", target, "--header", "X-Token abc")
	if code != transfer.ExitFailed || !strings.Contains(res.Message, `must be written "Name: value"`) {
		t.Errorf("malformed header: exit %d, result %+v", code, res)
	}
}

// TestCommandUserAgent: --user-agent is the User-Agent of every request; without it, Go's.
func TestCommandUserAgent(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	files := &fileServer{path: raw}
	var mu sync.Mutex
	agents := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		agents[r.UserAgent()]++
		mu.Unlock()
		if r.UserAgent() != "mirror-friendly/1.0" {
			http.Error(w, "not for you", http.StatusForbidden)
			return
		}
		files.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	target := filepath.Join(t.TempDir(), "disk.img")
	if code, res, log := runMain(t, "--url", srv.URL+"/disk.raw", "--target", target, "--user-agent", "mirror-friendly/1.0"); code != 0 {
		t.Fatalf("exit %d, result %+v\n%s", code, res, log)
	}
	sameDisk(t, raw, target)
	if code, res, _ := runMain(t, "--url", srv.URL+"/disk.raw", "--target", filepath.Join(t.TempDir(), "disk.img")); code != transfer.ExitFailed || res.Reason != transfer.ReasonSourceForbidden {
		t.Errorf("without --user-agent: exit %d, result %+v", code, res)
	}
	mu.Lock()
	defer mu.Unlock()
	for agent := range agents {
		if agent != "mirror-friendly/1.0" && !strings.HasPrefix(agent, "Go-http-client/") {
			t.Errorf("a request with User-Agent %q", agent)
		}
	}
	if len(agents) != 2 {
		t.Errorf("user agents seen: %v; want the one given, then Go's", agents)
	}
}

// TestCommandMetrics reads the progress metrics while a slow import runs.
func TestCommandMetrics(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	url := serve(t, &fileServer{path: raw, slow: 5 * time.Millisecond}) // about 5 s for 64 MiB
	addr, err := freeport.Addr("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}

	done := make(chan int, 1)
	go func() {
		done <- Main(t.Context(), []string{"--url", url, "--allow-destination", loopback, "--target", filepath.Join(t.TempDir(), "disk.img"),
			"--metrics-addr", addr, "--termination-message-path", "", "--progress-interval", "100ms"}, io.Discard)
	}()
	var body string
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + addr + "/metrics") //nolint:gosec // loopback
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			if strings.Contains(body, "diskpipe_transfer_bytes_total 6.7108864e+07") &&
				!strings.Contains(body, "diskpipe_transfer_bytes_done 0\n") {
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, want := range []string{"diskpipe_transfer_bytes_total 6.7108864e+07", "diskpipe_transfer_bytes_done", "diskpipe_transfer_bytes_per_second"} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	if code := <-done; code != 0 {
		t.Errorf("exit %d", code)
	}
}

// TestCommandStopped checks that an importer stopped mid-way (its context ends, as SIGTERM
// ends it when the pod is deleted, evicted or its node drained) reports a transient failure,
// whatever the cut stream looked like: a real node found a deleted pod's qcow2 import
// reported as a malformed image, failed for good.
func TestCommandStopped(t *testing.T) {
	dir := t.TempDir()
	raw := makeRaw(t, dir)
	for _, format := range []string{"raw", "qcow2", "vmdk"} {
		t.Run(format, func(t *testing.T) {
			path := raw
			if format != "raw" {
				path = convertTo(t, raw, format)
			}
			srv := &fileServer{path: path, slow: 2 * time.Millisecond}
			url := serve(t, srv)
			ctx, stop := context.WithCancel(t.Context())
			go func() {
				for srv.sent.Load() < 2<<20 {
					time.Sleep(10 * time.Millisecond)
				}
				stop() // what signal.NotifyContext does on SIGTERM
			}()
			term := filepath.Join(t.TempDir(), "termination-log")
			var log bytes.Buffer
			code := Main(ctx, []string{"--termination-message-path", term, "--metrics-addr", "", "--url", url, "--allow-destination", loopback,
				"--target", filepath.Join(t.TempDir(), "disk.img")}, &log)
			msg, err := os.ReadFile(term)
			if err != nil {
				t.Fatal(err)
			}
			res, err := transfer.ReadResult(string(msg))
			if err != nil {
				t.Fatal(err)
			}
			if code != transfer.ExitTransient || !res.Transient || res.Reason != transfer.ReasonCancelled {
				t.Errorf("exit %d, result %+v; want a transient Cancelled failure\n%s", code, res, log.String())
			}
			if !strings.Contains(res.Message, "stopped before it finished") {
				t.Errorf("message %q does not say the importer was stopped", res.Message)
			}
		})
	}
}

// TestCommandContainerDisk: a container disk the node pulled is read from the one file of its
// /disk, in whatever format; an image with no disk, or several, fails for good saying so; and
// --install copies the importer for the init container of such a pod.
func TestCommandContainerDisk(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	image := t.TempDir()
	disk := filepath.Join(image, "disk")
	if err := os.Mkdir(disk, 0o755); err != nil {
		t.Fatal(err)
	}
	code, res, _ := runMain(t, "--source", "containerdisk", "--path", disk, "--target", filepath.Join(t.TempDir(), "disk.img"))
	if code != transfer.ExitFailed || res.Reason != transfer.ReasonSourceNotFound || !strings.Contains(res.Message, "holds no disk file") {
		t.Errorf("no disk: exit %d, result %+v", code, res)
	}
	if err := os.Rename(convertTo(t, raw, "qcow2"), filepath.Join(disk, "fedora.qcow2")); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "disk.img")
	code, res, log := runMain(t, "--source", "containerdisk", "--path", disk, "--target", target)
	if code != transfer.ExitSucceeded || res.Format != "qcow2" {
		t.Fatalf("exit %d, result %+v\n%s", code, res, log)
	}
	sameDisk(t, raw, target)
	if err := os.WriteFile(filepath.Join(disk, "README"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, res, _ = runMain(t, "--source", "containerdisk", "--path", disk, "--target", filepath.Join(t.TempDir(), "disk.img"))
	if code != transfer.ExitFailed || res.Reason != transfer.ReasonInvalidArgument || !strings.Contains(res.Message, "holds 2 files") {
		t.Errorf("two files: exit %d, result %+v", code, res)
	}

	installed := filepath.Join(t.TempDir(), "importer")
	if code, res, log := runMain(t, "--install", installed); code != transfer.ExitSucceeded {
		t.Fatalf("install: exit %d, result %+v\n%s", code, res, log)
	}
	self, _ := os.Executable()
	if sha256File(t, installed) != sha256File(t, self) {
		t.Error("--install wrote another binary than the running one")
	}
	if fi, err := os.Stat(installed); err != nil || fi.Mode().Perm()&0o111 == 0 {
		t.Errorf("--install: not executable: %v %v", fi, err)
	}
}
