package importer

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/test/freeport"
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

// TestServe runs the source side of a cross-namespace clone and imports from it over HTTP:
// with the token the copy is identical; without it the server refuses.
func TestServe(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	base, token, stop := startServe(t, raw)
	url := base + ServePath

	target := filepath.Join(t.TempDir(), "disk.img")
	code, res, log := runMain(t, "--url", url, "--header", "Authorization: Bearer "+token, "--format", "raw", "--target", target)
	if code != transfer.ExitSucceeded {
		t.Fatalf("exit %d %+v\n%s", code, res, log)
	}
	sameDisk(t, raw, target)

	code, res, _ = runMain(t, "--url", url, "--header", "Authorization: Bearer wrong", "--target", filepath.Join(t.TempDir(), "disk.img"))
	if code != transfer.ExitFailed || res.Reason != transfer.ReasonSourceForbidden {
		t.Errorf("wrong token: exit %d %+v", code, res)
	}
	stop()
}

// startServe runs a clone source of path, as its pod does; it returns its base URL and token,
// and a function that stops it and checks that it ended well.
func startServe(t *testing.T, path string) (string, string, func()) {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "token")
	token := "0123456789abcdef0123456789abcdef"
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, err := freeport.Addr("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int)
	go func() {
		done <- Main(ctx, []string{"--serve", addr, "--path", path, "--token-file", tokenFile, "--metrics-addr", "",
			"--termination-message-path", filepath.Join(t.TempDir(), "term")}, os.Stderr)
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
	return "http://" + addr, token, func() {
		cancel()
		if code := <-done; code != transfer.ExitSucceeded {
			t.Errorf("the server ended with %d after its context", code)
		}
	}
}
