package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/diskpipe/diskpipe/importer/registrytest"
)

// benchCompressed imports the benchmark's raw disk wrapped in the compressions images ship in
// (raw.gz, raw.xz, raw.zst), served by nginx from memory, and as the raw+zstd layer of a
// KubeVirt VM artifact in Debian's registry. The references are the same bytes fetched by
// curl and decoded by the tool that made them, to /dev/null (writing nothing, while the
// importer writes the disk and flushes it), and decoded into a sparse file on stable storage
// by dd (what the importer does). Each import is compared with the disk by qemu-img.
func benchCompressed(b importBench, raw, mem string) error {
	rows := []struct {
		name, tool, ext string
		compress        string // the shell command making the file from $1 into $2
		decode          string // what decodes it from stdin
	}{
		{"raw.gz", "gzip", ".gz", `gzip -6 -c "$1" > "$2"`, "gzip -dc"},
		// xz -T2 writes a stream of blocks with their sizes in their headers (xz's default
		// since 5.4 on more than one core), which decoders may decode on several threads.
		{"raw.xz", "xz", ".xz", `xz -T2 -1 -c "$1" > "$2"`, "xz -dc -T2"},
		{"raw.zst", "zstd", ".zst", `zstd -q -3 -T2 -c "$1" > "$2"`, "zstd -dc"},
		{"artifact raw+zstd", "zstd", ".zst", `zstd -q -3 -T2 -c "$1" > "$2"`, "zstd -dc"}, // raw.zst's file
	}
	var reg *registry
	defer func() {
		if reg != nil {
			reg.stop()
		}
	}()
	for _, row := range rows {
		if !benchOnly(row.name) {
			continue
		}
		file := filepath.Join(b.work, "rootfs.raw"+row.ext)
		if _, err := os.Stat(file); err != nil {
			fmt.Printf("bench: compressing the disk (once) with %s\n", row.tool)
			if err := sh("sh", "-c", strings.ReplaceAll(row.compress, "$2", "$2.tmp")+` && mv "$2.tmp" "$2"`, "compress", raw, file); err != nil {
				return err
			}
		}
		var url, served string
		args := []string{}
		if row.name == "artifact raw+zstd" {
			if reg == nil {
				var err error
				if reg, err = startRegistry(b.work); err != nil {
					return err
				}
			}
			blobURL, err := reg.pushArtifact(file, fileSize(raw))
			if err != nil {
				return err
			}
			url = blobURL
			args = []string{"--source", "registry", "--url", "docker://" + reg.addr + "/bench/vm:latest", "--insecure", "--disk", "rootdisk"}
		} else {
			served = filepath.Join(mem, filepath.Base(file))
			if err := sh("cp", file, served); err != nil {
				return err
			}
			url = b.srv.URL + "memory/" + filepath.Base(file)
		}
		fmt.Printf("\n%s: %.2f GiB file (%d bytes) for a %.2f GiB disk\n", row.name, float64(fileSize(file))/(1<<30), fileSize(file),
			float64(fileSize(raw))/(1<<30))
		err := b.compressedRounds(row.name, url, row.decode, args, raw, fileSize(file))
		if served != "" {
			_ = os.Remove(served)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// compressedRounds times the importer against curl | decode, b.runs rounds from a cold page
// cache, in turns.
func (b importBench) compressedRounds(name, url, decode string, source []string, raw string, size int64) error {
	out := filepath.Join(b.work, "imported.raw")
	defer os.Remove(out)
	var ref, durable, ours []measurement
	refName := "curl | " + decode + " > /dev/null"
	durableName := "curl | " + decode + " | dd conv=sparse,fdatasync"
	for round := range b.runs {
		steps := []func() error{
			func() error {
				dropCaches()
				m, err := timed(refName, size, "sh", "-c", `curl -sSfL "$1" | `+decode+` > /dev/null`, "ref", url)
				ref = append(ref, m)
				return err
			},
			func() error {
				_ = os.Remove(out)
				dropCaches()
				m, err := timed(durableName, size, "sh", "-c", `curl -sSfL "$1" | `+decode+` | dd of="$2" bs=1M conv=sparse,fdatasync status=none`, "ref", url, out)
				durable = append(durable, m)
				_ = os.Remove(out)
				return err
			},
			func() error {
				_ = os.Remove(out)
				dropCaches()
				args := importerArgs(url, out)
				if len(source) > 0 {
					args = append(args[2:], source...)
				}
				m, err := timed("diskpipe importer", size, b.importer, append(args, "--allow-destination", "127.0.0.1")...)
				ours = append(ours, m)
				if err != nil {
					return err
				}
				if err := sh("qemu-img", "compare", "-f", "raw", "-F", "raw", raw, out); err != nil {
					return fmt.Errorf("%s: the import differs from the disk: %w", name, err)
				}
				return nil
			},
		}
		for i := range steps {
			if err := steps[(round+i)%len(steps)](); err != nil {
				return err
			}
		}
	}
	r, d, o := median(ref), median(durable), median(ours)
	for _, m := range []measurement{r, d, o} {
		fmt.Println("  " + m.String())
	}
	fmt.Printf("  our wall / (%s) = %.2f; each round: %s; our CPU / its CPU = %.2f; peak RSS %.0f MiB\n",
		refName, o.wall.Seconds()/r.wall.Seconds(), roundRatios(ours, ref), o.cpu.Seconds()/r.cpu.Seconds(), float64(o.peakRSS)/(1<<20))
	fmt.Printf("  against the tools writing the disk to stable storage (%s): %.2f; each round: %s\n",
		durableName, o.wall.Seconds()/d.wall.Seconds(), roundRatios(ours, durable))
	return nil
}

// registry is Debian's docker-registry holding the benchmark's artifact.
type registry struct {
	addr string
	t    *benchT
}

func startRegistry(work string) (*registry, error) {
	t := &benchT{dir: filepath.Join(work, "registry")}
	_ = os.RemoveAll(t.dir)
	var addr string
	if err := t.run(func() { addr = registrytest.Start(t) }); err != nil {
		return nil, err
	}
	return &registry{addr: addr, t: t}, nil
}

// pushArtifact pushes the zstd-compressed disk as the one disk (rootdisk) of a KubeVirt VM
// artifact, in the layout of KubeVirt's export (VEP 256), behind an index; it answers the
// layer's blob URL.
func (r *registry) pushArtifact(file string, capacity int64) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	layer := registrytest.NewBlob(data)
	config := registrytest.NewBlob([]byte("{}"))
	err = r.t.run(func() {
		manifest := registrytest.NewBlob(mustMarshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
			"artifactType": "application/vnd.kubevirt.vm.v1+json",
			"config":       registrytest.Descriptor("application/vnd.oci.empty.v1+json", config, nil),
			"layers": []any{registrytest.Descriptor("application/vnd.kubevirt.disk.raw+zstd", layer, map[string]any{"annotations": map[string]string{
				"io.kubevirt.disk.name": "rootdisk", "io.kubevirt.pvc.capacity": fmt.Sprint(capacity), "io.kubevirt.pvc.volumeMode": "Filesystem",
				"io.kubevirt.pvc.accessModes": "ReadWriteOnce"}})}}))
		index := registrytest.NewBlob(mustMarshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
			"manifests": []any{registrytest.Descriptor("application/vnd.oci.image.manifest.v1+json", manifest,
				map[string]any{"platform": map[string]string{"architecture": "amd64", "os": "linux"}})}}))
		registrytest.Push(r.t, r.addr, "bench/vm", "latest", index, "application/vnd.oci.image.index.v1+json", []registrytest.Blob{layer, config, manifest})
	})
	if err != nil {
		return "", err
	}
	url := "http://" + r.addr + "/v2/bench/vm/blobs/" + layer.Digest
	resp, err := http.Head(url)
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("HEAD %s: %s", url, resp.Status)
	}
	return url, nil
}

func (r *registry) stop() { r.t.cleanup() }

// benchT is the registrytest.T of a benchmark: a failure ends the call run made, as an error.
type benchT struct {
	dir      string
	n        int
	cleanups []func()
}

type benchFailure struct{ msg string }

func (t *benchT) Helper()           {}
func (t *benchT) Fatal(args ...any) { panic(benchFailure{fmt.Sprint(args...)}) }
func (t *benchT) Fatalf(format string, args ...any) {
	panic(benchFailure{fmt.Sprintf(format, args...)})
}
func (t *benchT) Skip(args ...any) { panic(benchFailure{fmt.Sprint(args...)}) }
func (t *benchT) Cleanup(f func()) { t.cleanups = append(t.cleanups, f) }

func (t *benchT) TempDir() string {
	t.n++
	d := filepath.Join(t.dir, fmt.Sprint(t.n))
	if err := os.MkdirAll(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

// run calls f, answering its failure as an error.
func (t *benchT) run(f func()) (err error) {
	defer func() {
		if v := recover(); v != nil {
			bf, ok := v.(benchFailure)
			if !ok {
				panic(v)
			}
			err = fmt.Errorf("%s", bf.msg)
		}
	}()
	f()
	return nil
}

func (t *benchT) cleanup() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
	_ = os.RemoveAll(t.dir)
}

func mustMarshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
