package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// benchImport imports a 4 GiB qcow2 (plain and with compressed clusters) from an HTTP server
// with Range support on 127.0.0.1 into a raw file, beside curl fetching the same URL to
// /dev/null and qemu-img converting the same file locally.
func benchImport(root, work string) error {
	raw, err := fsImage(work)
	if err != nil {
		return err
	}
	importer := filepath.Join(root, "bin", "importer")
	if _, err := os.Stat(importer); err != nil {
		return fmt.Errorf("%s: run 'make build' first: %w", importer, err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.FileServer(http.Dir(work)), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	defer srv.Close()
	base := "http://" + l.Addr().String() + "/"

	fmt.Printf("bench-import: source %s: %.2f GiB virtual, %.2f GiB of data\n", raw,
		float64(fileSize(raw))/(1<<30), float64(allocated(raw))/(1<<30))
	for _, v := range []struct {
		name string
		args []string
	}{
		{"qcow2", []string{"-O", "qcow2"}},
		{"qcow2 compressed", []string{"-O", "qcow2", "-c"}},
	} {
		if only := os.Getenv("BENCH_ONLY"); only != "" && only != v.name {
			continue
		}
		img := filepath.Join(work, "rootfs-"+map[bool]string{false: "plain", true: "compressed"}[len(v.args) == 3]+".qcow2")
		if err := convertOnce(raw, img, v.args...); err != nil {
			return err
		}
		url := base + filepath.Base(img)
		out := filepath.Join(work, "imported.raw")
		ref := filepath.Join(work, "qemu-img.raw")
		size := fileSize(img)

		fmt.Printf("\n%s: %s, %.2f GiB file\n", v.name, filepath.Base(img), float64(size)/(1<<30))
		dropCaches()
		curl, err := timed("curl -o /dev/null", size, "curl", "-sSf", "-o", "/dev/null", url)
		if err != nil {
			return err
		}
		_ = os.Remove(ref)
		dropCaches()
		qemu, err := timed("qemu-img convert -O raw (local)", size, "qemu-img", "convert", "-O", "raw", img, ref)
		if err != nil {
			return err
		}
		_ = os.Remove(out)
		dropCaches()
		ours, err := timed("diskpipe importer (HTTP, Range)", size, importer, "--url", url, "--target", out,
			"--capacity", "5368709120", "--metrics-addr", "", "--termination-message-path", "", "--progress-interval", "1h")
		if err != nil {
			return err
		}
		if err := sh("qemu-img", "compare", "-f", "raw", "-F", "raw", ref, out); err != nil {
			return fmt.Errorf("the import differs from qemu-img's conversion: %w", err)
		}
		for _, m := range []measurement{curl, qemu, ours} {
			fmt.Println("  " + m.String())
		}
		refWall := max(curl.wall, qemu.wall)
		fmt.Printf("  our wall / max(curl, qemu-img) = %.2f (target <= 1.25); peak RSS %.0f MiB (target <= 160); "+
			"wrote %.2f GiB, identical by qemu-img compare\n",
			ours.wall.Seconds()/refWall.Seconds(), float64(ours.peakRSS)/(1<<20), float64(allocated(out))/(1<<30))
		_ = os.Remove(out)
		_ = os.Remove(ref)
	}
	return nil
}
