package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"net/http"

	"github.com/diskpipe/diskpipe/test/freeport"
)

// benchExport exports the 4 GiB ext4 disk into the bundled store on 127.0.0.1 as qcow2, plain
// and compressed, beside the two-step reference: qemu-img convert to a local file, then
// aws s3 cp of that file into the same store.
func benchExport(root, work string) error {
	raw, err := fsImage(work)
	if err != nil {
		return err
	}
	for _, b := range []string{"exporter", "objectstore"} {
		if _, err := os.Stat(filepath.Join(root, "bin", b)); err != nil {
			return fmt.Errorf("bin/%s: run 'make build' first: %w", b, err)
		}
	}
	st, err := startStore(root, work)
	if err != nil {
		return err
	}
	defer st.stop()
	endpoint, awsEnv, creds, store, addr := st.endpoint, st.awsEnv, st.creds, st.dir, st.addr
	if _, err := timedEnv("mb", 0, awsEnv, "/usr/bin/aws", "--endpoint-url", endpoint, "s3", "mb", "s3://bench"); err != nil {
		return err
	}

	data := allocated(raw)
	fmt.Printf("bench-export: source %s: %.2f GiB virtual, %.2f GiB of data; store on %s\n", raw,
		float64(fileSize(raw))/(1<<30), float64(data)/(1<<30), addr)
	for _, v := range []struct {
		name, compression string
		qemuArgs          []string
	}{
		{"qcow2", "none", []string{"-O", "qcow2"}},
		{"qcow2 compressed (zlib)", "zlib", []string{"-O", "qcow2", "-c"}},
	} {
		if !benchOnly(v.compression) {
			continue
		}
		fmt.Printf("\n%s:\n", v.name)
		local := filepath.Join(work, "reference.qcow2")
		_ = os.Remove(local)
		dropCaches()
		conv, err := timed("qemu-img convert (local file)", data, "qemu-img", append(append([]string{"convert", "-f", "raw"}, v.qemuArgs...), raw, local)...)
		if err != nil {
			return err
		}
		dropCaches()
		up, err := timedEnv("aws s3 cp (that file)", fileSize(local), awsEnv, "/usr/bin/aws", "--endpoint-url", endpoint,
			"s3", "cp", "--only-show-errors", local, "s3://bench/reference-"+v.compression+".qcow2")
		if err != nil {
			return err
		}
		refSize := fileSize(local)
		_ = os.Remove(local)
		dropCaches()
		object := "diskpipe-" + v.compression + ".qcow2"
		ours, err := timed("diskpipe exporter (streaming)", data, filepath.Join(root, "bin", "exporter"),
			"--source", raw, "--endpoint", endpoint, "--bucket-lookup", "Path", "--s3-credentials-dir", creds,
			"--bucket", "bench", "--object", object, "--compression", v.compression, "--allow-destination", "127.0.0.1",
			"--metrics-addr", "", "--termination-message-path", "", "--progress-interval", "1h")
		if err != nil {
			return err
		}
		stored := filepath.Join(store, "bench", object) // the POSIX backend keeps objects as files
		if err := sh("qemu-img", "check", "-q", stored); err != nil {
			return fmt.Errorf("qemu-img check of the export: %w", err)
		}
		if err := sh("qemu-img", "compare", "-f", "raw", "-F", "qcow2", raw, stored); err != nil {
			return fmt.Errorf("the export differs from the disk: %w", err)
		}
		for _, m := range []measurement{conv, up, ours} {
			fmt.Println("  " + m.String())
		}
		two := conv.wall + up.wall
		fmt.Printf("  our wall / (qemu-img convert + aws s3 cp) = %.2f s / %.2f s = %.2f (target <= 1.0)\n",
			ours.wall.Seconds(), two.Seconds(), ours.wall.Seconds()/two.Seconds())
		fmt.Printf("  peak RSS %.0f MiB (target <= 256); scratch written by the exporter %d bytes (target 0); "+
			"object %.3f GiB vs qemu-img's %.3f GiB = %.4f (compressed target <= 1.05); qemu-img check and compare pass\n",
			float64(ours.peakRSS)/(1<<20), ours.written, float64(fileSize(stored))/(1<<30), float64(refSize)/(1<<30),
			float64(fileSize(stored))/float64(refSize))
	}
	return nil
}

// benchStore is the bundled store a benchmark runs, on 127.0.0.1, with its data in work/store.
type benchStore struct {
	dir, addr, endpoint string
	// awsEnv has awscli use the store's keys; creds is a directory of them for diskpipe's pods'
	// commands (--s3-credentials-dir).
	awsEnv []string
	creds  string
	stop   func()
}

// startStore starts bin/objectstore and waits until it answers.
func startStore(root, work string) (*benchStore, error) {
	st := &benchStore{dir: filepath.Join(work, "store"), creds: filepath.Join(work, "creds"),
		awsEnv: []string{"AWS_ACCESS_KEY_ID=bench", "AWS_SECRET_ACCESS_KEY=bench-secret", "AWS_DEFAULT_REGION=us-east-1",
			"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null"}}
	_ = os.RemoveAll(st.dir)
	var err error
	if st.addr, err = freeport.Addr("127.0.0.1"); err != nil {
		return nil, err
	}
	st.endpoint = "http://" + st.addr
	srv := exec.Command(filepath.Join(root, "bin", "objectstore"), "--data-dir", st.dir, "--listen", st.addr)
	srv.Env = append(os.Environ(), "DISKPIPE_S3_ACCESS_KEY=bench", "DISKPIPE_S3_SECRET_KEY=bench-secret")
	if err := srv.Start(); err != nil {
		return nil, err
	}
	st.stop = func() { _ = srv.Process.Kill(); _ = srv.Wait(); _ = os.RemoveAll(st.dir) }
	for i := 0; ; i++ {
		resp, err := http.Get(st.endpoint + "/healthz") //nolint:gosec,noctx // loopback
		if err == nil {
			resp.Body.Close()
			break
		}
		if i > 100 {
			st.stop()
			return nil, fmt.Errorf("the object store did not start: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = os.MkdirAll(st.creds, 0o700)
	_ = os.WriteFile(filepath.Join(st.creds, "accessKeyId"), []byte("bench"), 0o600)
	_ = os.WriteFile(filepath.Join(st.creds, "secretAccessKey"), []byte("bench-secret"), 0o600)
	return st, nil
}
