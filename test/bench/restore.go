package main

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/diskpipe/diskpipe/internal/backup"
)

// restoreRounds is how many cold rounds each contender runs; medians are reported.
const restoreRounds = 3

// benchRestore restores the 4 GiB ext4 disk from a chain of 4 layers kept in the bundled store
// (the full backup and three incrementals, written with qemu-io over it), through its index,
// beside the way users do it today — download the chain with aws s3 cp, rebase each
// incremental onto its predecessor, qemu-img convert the newest to raw — and beside that
// conversion step alone, in the same run.
func benchRestore(root, work string) error {
	raw, err := fsImage(work)
	if err != nil {
		return err
	}
	for _, b := range []string{"importer", "objectstore"} {
		if _, err := os.Stat(filepath.Join(root, "bin", b)); err != nil {
			return fmt.Errorf("bin/%s: run 'make build' first: %w", b, err)
		}
	}
	chainDir := filepath.Join(work, "chain")
	layers, err := benchChain(raw, chainDir)
	if err != nil {
		return err
	}
	st, err := startStore(root, work)
	if err != nil {
		return err
	}
	defer st.stop()
	endpoint, awsEnv, creds, addr := st.endpoint, st.awsEnv, st.creds, st.addr
	aws := func(args ...string) error {
		_, err := timedEnv("aws", 0, awsEnv, "/usr/bin/aws", append([]string{"--endpoint-url", endpoint}, args...)...)
		return err
	}
	if err := aws("s3", "mb", "s3://bench"); err != nil {
		return err
	}
	var held int64
	for _, l := range layers {
		held += fileSize(l)
		if err := aws("s3", "cp", "--only-show-errors", l, "s3://bench/vm-root/"+filepath.Base(l)); err != nil {
			return err
		}
	}
	if err := aws("s3", "cp", "--only-show-errors", filepath.Join(chainDir, backup.IndexName), "s3://bench/vm-root/"+backup.IndexName); err != nil {
		return err
	}
	want := filepath.Join(work, "chain-want.raw")
	if err := sh("qemu-img", "convert", "-O", "raw", layers[len(layers)-1], want); err != nil {
		return err
	}
	defer os.Remove(want)
	fmt.Printf("bench-restore: a chain of %d layers (%.2f GiB of objects) of a %.2f GiB disk (%.2f GiB of data once restored); store on %s; %d cold rounds, medians\n",
		len(layers), float64(held)/(1<<30), float64(fileSize(want))/(1<<30), float64(allocated(want))/(1<<30), addr, restoreRounds)

	download := filepath.Join(work, "chain-download")
	out := filepath.Join(work, "chain-restored.raw")
	importer := func(name string, extra ...string) (measurement, error) {
		_ = os.Remove(out)
		dropCaches()
		args := append([]string{"--source", "s3", "--endpoint", endpoint, "--bucket-lookup", "Path", "--s3-credentials-dir", creds,
			"--bucket", "bench", "--target", out, "--capacity", strconv.FormatInt(8<<30, 10), "--allow-destination", "127.0.0.1",
			"--metrics-addr", "", "--termination-message-path", "", "--progress-interval", "1h"}, extra...)
		m, err := timed(name, held, filepath.Join(root, "bin", "importer"), args...)
		if err == nil {
			err = sh("qemu-img", "compare", "-f", "raw", "-F", "raw", want, out)
		}
		return m, err
	}
	var explicit []string
	for _, l := range layers {
		explicit = append(explicit, "--layer", "vm-root/"+filepath.Base(l))
	}
	rows := map[string][]measurement{}
	var order []string
	add := func(m measurement, err error) error {
		if err != nil {
			return err
		}
		if _, ok := rows[m.name]; !ok {
			order = append(order, m.name)
		}
		rows[m.name] = append(rows[m.name], m)
		return nil
	}
	for range restoreRounds {
		_ = os.RemoveAll(download)
		_ = os.MkdirAll(download, 0o755)
		dropCaches()
		if err := add(timedEnv("aws s3 cp --recursive (the chain)", held, awsEnv, "/usr/bin/aws", "--endpoint-url", endpoint,
			"s3", "cp", "--recursive", "--only-show-errors", "s3://bench/vm-root/", download+"/")); err != nil {
			return err
		}
		for i := 1; i < len(layers); i++ {
			if err := sh("qemu-img", "rebase", "-u", "-f", "qcow2", "-b", filepath.Base(layers[i-1]), "-F", "qcow2", filepath.Join(download, filepath.Base(layers[i]))); err != nil {
				return err
			}
		}
		_ = os.Remove(out)
		dropCaches()
		if err := add(timed("qemu-img convert (downloaded chain)", held, "qemu-img", "convert", "-O", "raw",
			filepath.Join(download, filepath.Base(layers[len(layers)-1])), out)); err != nil {
			return err
		}
		if err := add(importer("diskpipe restore (index, digests)", "--chain-index", "vm-root/"+backup.IndexName)); err != nil {
			return err
		}
		if err := add(importer("diskpipe restore (layers, no digest)", explicit...)); err != nil {
			return err
		}
	}
	restored := allocated(out)
	_ = os.Remove(out)
	_ = os.RemoveAll(download)
	med := map[string]measurement{}
	for _, name := range order {
		med[name] = median(rows[name])
		fmt.Println("  " + med[name].String())
	}
	dl, conv := med["aws s3 cp --recursive (the chain)"], med["qemu-img convert (downloaded chain)"]
	for _, name := range []string{"diskpipe restore (index, digests)", "diskpipe restore (layers, no digest)"} {
		m := med[name]
		fmt.Printf("  %s: / conversion alone = %.2f s / %.2f s = %.2f (target <= 1.0); / download + convert = %.2f; peak RSS %.0f MiB (target <= 64); "+
			"written %.2f GiB for %.2f GiB of objects (target <=); scratch 0 (download+convert: %.2f GiB)\n",
			name, m.wall.Seconds(), conv.wall.Seconds(), m.wall.Seconds()/conv.wall.Seconds(), m.wall.Seconds()/(dl.wall+conv.wall).Seconds(),
			float64(m.peakRSS)/(1<<20), float64(m.written)/(1<<30), float64(held)/(1<<30), float64(held)/(1<<30))
	}
	fmt.Printf("  the restored disk allocates %.2f GiB; qemu-img compare identical every round\n", float64(restored)/(1<<30))
	return nil
}

// benchChain makes (once) the chain: the full backup of raw, then three incrementals over it
// written with qemu-io — random data in 4 MiB runs spread over the disk (256, 128 and 192 MiB
// of it), zeroed and discarded ranges — and its index.
func benchChain(raw, dir string) ([]string, error) {
	names := []string{"full.qcow2", "inc1.qcow2", "inc2.qcow2", "inc3.qcow2"}
	var layers []string
	for _, n := range names {
		layers = append(layers, filepath.Join(dir, n))
	}
	if _, err := os.Stat(filepath.Join(dir, backup.IndexName)); err == nil {
		return layers, nil
	}
	_ = os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	random := filepath.Join(dir, "random")
	b := make([]byte, 4<<20)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	if err := os.WriteFile(random, b, 0o600); err != nil {
		return nil, err
	}
	defer os.Remove(random)
	fmt.Println("bench: building the chain (once)")
	if err := sh("qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, layers[0]); err != nil {
		return nil, err
	}
	size := fileSize(raw)
	for i, mib := range []int64{256, 128, 192} {
		if err := shIn(dir, "qemu-img", "create", "-q", "-f", "qcow2", "-b", names[i], "-F", "qcow2", names[i+1]); err != nil {
			return nil, err
		}
		args := []string{"-f", "qcow2"}
		runs := mib / 4
		stride := size / runs / (1 << 20) * (1 << 20)
		for r := int64(0); r < runs; r++ {
			args = append(args, "-c", fmt.Sprintf("write -s %s %d 4M", random, r*stride+int64(i+1)<<20))
		}
		args = append(args, "-c", fmt.Sprintf("write -z %d 32M", int64(i+1)<<28), "-c", fmt.Sprintf("discard %d 16M", int64(i+5)<<28), names[i+1])
		if err := shIn(dir, "qemu-io", args...); err != nil {
			return nil, err
		}
	}
	ix := backup.Index{Format: backup.Format, Disk: "bench/vm-root"}
	for i, p := range layers {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		h := sha256.New()
		n, err := io.Copy(h, f)
		f.Close()
		if err != nil {
			return nil, err
		}
		l := backup.Layer{Checkpoint: fmt.Sprintf("cp%d", i+1), Object: names[i], Size: n, VirtualSize: size, SHA256: hex.EncodeToString(h.Sum(nil))}
		if i > 0 {
			l.Parent = fmt.Sprintf("cp%d", i)
		}
		ix.Layers = append(ix.Layers, l)
	}
	j, err := json.Marshal(ix)
	if err != nil {
		return nil, err
	}
	return layers, os.WriteFile(filepath.Join(dir, backup.IndexName), j, 0o600)
}

func shIn(dir, cmd string, args ...string) error {
	c := exec.Command(cmd, args...)
	c.Dir = dir
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w\n%s", cmd, err, tail(string(out)))
	}
	return nil
}
