package importer

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/test/freeport"
	"github.com/diskpipe/diskpipe/test/pki"
)

// grownSize is the disk a volume of capacity bytes holds when grown: 94 %, rounded down to
// a MiB.
func grownSize(capacity int64) int64 {
	return int64(float64(capacity)*(1-DefaultOverhead)) &^ (1<<20 - 1)
}

// TestGrow imports a 64 MiB image into a 200 MiB volume with --grow: the disk keeps the
// image's bytes and is as large as the volume allows.
func TestGrow(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	qcow := convertTo(t, raw, "qcow2")
	target := filepath.Join(t.TempDir(), "disk.img")
	code, res, log := runMain(t, "--url", serve(t, &fileServer{path: qcow}), "--target", target,
		"--capacity", "209715200", "--grow")
	if code != transfer.ExitSucceeded {
		t.Fatalf("exit %d %+v\n%s", code, res, log)
	}
	want := grownSize(200 << 20)
	if got := fileSize(t, target); got != want || res.VirtualSize != want {
		t.Errorf("disk.img is %d bytes, result says %d; want %d", got, res.VirtualSize, want)
	}
	sameDisk(t, raw, target) // qemu-img compare: the grown tail reads as zeros

	blank := filepath.Join(t.TempDir(), "disk.img")
	if code, res, log := runMain(t, "--source", "blank", "--target", blank, "--capacity", "104857600", "--grow"); code != 0 {
		t.Fatalf("blank: exit %d %+v\n%s", code, res, log)
	}
	if got := fileSize(t, blank); got != grownSize(100<<20) {
		t.Errorf("blank disk is %d bytes, want %d", got, grownSize(100<<20))
	}
}

// TestGrowOnly grows a disk that the storage system cloned into a larger volume, keeping
// its bytes; a missing disk is a clear error.
func TestGrowOnly(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	target := filepath.Join(t.TempDir(), "disk.img")
	runTool(t, "cp", "--sparse=always", raw, target)
	code, res, log := runMain(t, "--grow-only", "--target", target, "--capacity", "134217728")
	if code != transfer.ExitSucceeded || !res.Succeeded {
		t.Fatalf("exit %d %+v\n%s", code, res, log)
	}
	if got := fileSize(t, target); got != grownSize(128<<20) {
		t.Errorf("disk.img is %d bytes, want %d", got, grownSize(128<<20))
	}
	sameDisk(t, raw, target)

	// A volume too small to grow into leaves the disk as it was.
	code, _, _ = runMain(t, "--grow-only", "--target", target, "--capacity", "1048576")
	if code != transfer.ExitSucceeded || fileSize(t, target) != grownSize(128<<20) {
		t.Errorf("growing into a smaller volume: exit %d, size %d", code, fileSize(t, target))
	}

	code, res, _ = runMain(t, "--grow-only", "--target", filepath.Join(t.TempDir(), "missing.img"))
	if code != transfer.ExitFailed || res.Reason != transfer.ReasonTargetError {
		t.Errorf("missing disk: exit %d %+v", code, res)
	}
}

// TestServe runs the source side of a cross-namespace clone and imports from it over HTTPS:
// with the token and the server's certificate the copy is identical; without the token the
// server refuses; a client that does not trust the certificate, or asks for plain HTTP, gets
// nothing; a clone source without a certificate does not start.
func TestServe(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	base, trust, token, stop := startServe(t, raw)
	url := base + ServePath

	target := filepath.Join(t.TempDir(), "disk.img")
	code, res, log := runMain(t, append([]string{"--url", url, "--format", "raw", "--target", target}, trust...)...)
	if code != transfer.ExitSucceeded {
		t.Fatalf("exit %d %+v\n%s", code, res, log)
	}
	sameDisk(t, raw, target)

	wrong := slices.Clone(trust)
	wrong[1] = "Authorization: Bearer wrong"
	code, res, _ = runMain(t, append([]string{"--url", url, "--target", filepath.Join(t.TempDir(), "disk.img")}, wrong...)...)
	if code != transfer.ExitFailed || res.Reason != transfer.ReasonSourceForbidden {
		t.Errorf("wrong token: exit %d %+v", code, res)
	}
	// Another certificate than the one the server holds: the token is never sent.
	otherCA, _, _ := servingPair(t)
	code, res, _ = runMain(t, "--url", url, "--target", filepath.Join(t.TempDir(), "disk.img"), "--header", "Authorization: Bearer "+token,
		"--ca-file", otherCA, "--tls-server-name", testServerName)
	if code == transfer.ExitSucceeded || !strings.Contains(res.Message, "certificate") {
		t.Errorf("a certificate not trusted: exit %d %+v", code, res)
	}
	// Plain HTTP to the TLS port: refused.
	code, res, _ = runMain(t, append([]string{"--url", strings.Replace(url, "https://", "http://", 1), "--retries", "1",
		"--target", filepath.Join(t.TempDir(), "disk.img")}, trust...)...)
	if code == transfer.ExitSucceeded {
		t.Errorf("plain HTTP: exit %d %+v", code, res)
	}
	stop()

	code, res, _ = runMain(t, "--serve", "127.0.0.1:0", "--path", raw, "--token-file", filepath.Join(t.TempDir(), "none"))
	if code != transfer.ExitFailed || res.Reason != transfer.ReasonInvalidArgument {
		t.Errorf("a token file that is not there: exit %d %+v", code, res)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	code, res, _ = runMain(t, "--serve", "127.0.0.1:0", "--path", raw, "--token-file", tokenFile)
	if code != transfer.ExitFailed || !strings.Contains(res.Message, "only over TLS") {
		t.Errorf("a clone source without a certificate: exit %d %+v", code, res)
	}
}

// testServerName is the name the test clone sources' certificates are made for.
const testServerName = "clone-source.test.invalid"

// servingPair writes a CA, and a serving certificate of testServerName and its key issued
// by it, and returns the CA's path and the pair's.
func servingPair(t *testing.T) (ca, crt, key string) {
	t.Helper()
	auth, err := pki.New(t.TempDir(), "clone source test CA")
	if err != nil {
		t.Fatal(err)
	}
	crt, key, err = auth.Issue("serve", testServerName, nil, testServerName)
	if err != nil {
		t.Fatal(err)
	}
	return auth.CAFile, crt, key
}

// startServe runs a clone source of path, as its pod does; it returns its base URL, the
// flags of an importer that reads it (the token's header, then the certificate it trusts),
// the token, and a function that stops it and checks that it ended well.
func startServe(t *testing.T, path string) (string, []string, string, func()) {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "token")
	token := "0123456789abcdef0123456789abcdef"
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ca, crt, key := servingPair(t)
	addr, err := freeport.Addr("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int)
	go func() {
		done <- Main(ctx, []string{"--serve", addr, "--path", path, "--token-file", tokenFile, "--tls-cert-file", crt, "--tls-key-file", key,
			"--metrics-addr", "", "--termination-message-path", filepath.Join(t.TempDir(), "term")}, os.Stderr)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the clone source did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	trust := []string{"--header", "Authorization: Bearer " + token, "--ca-file", ca, "--tls-server-name", testServerName}
	return "https://" + addr, trust, token, func() {
		cancel()
		if code := <-done; code != transfer.ExitSucceeded {
			t.Errorf("the server ended with %d after its context", code)
		}
	}
}
