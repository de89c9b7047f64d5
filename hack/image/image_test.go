package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	. "github.com/onsi/gomega"

	"github.com/diskpipe/diskpipe/importer/registrytest"
)

// binaries builds two of diskpipe's commands as static binaries into dir, as `make image` does.
func binaries(t *testing.T, dir string) []string {
	t.Helper()
	var args []string
	for _, b := range []string{"importer", "exporter"} {
		cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, b), "../../cmd/"+b)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b, err, out)
		}
		args = append(args, b+"="+filepath.Join(dir, b))
	}
	return args
}

func build(t *testing.T, out string, args ...string) string {
	t.Helper()
	var stdout bytes.Buffer
	if err := run(context.Background(), append([]string{"build", "--out", out, "--ref", "example.com/diskpipe:1.2.3"}, args...), &stdout); err != nil {
		t.Fatalf("build: %v", err)
	}
	return stdout.String()
}

func digestOf(t *testing.T, archive string) string {
	t.Helper()
	var stdout bytes.Buffer
	if err := run(context.Background(), []string{"digest", "--archive", archive}, &stdout); err != nil {
		t.Fatalf("digest: %v", err)
	}
	return strings.TrimSpace(stdout.String())
}

func fileSum(t *testing.T, p string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// TestReproducible builds the image twice, from binaries built twice in different places with
// different times, and gets the same digest and the same archive bytes.
func TestReproducible(t *testing.T) {
	g := NewWithT(t)
	one, two := t.TempDir(), t.TempDir()
	a := binaries(t, one)
	b := binaries(t, two)
	later := time.Now().Add(time.Hour)
	for _, f := range []string{"importer", "exporter"} {
		g.Expect(os.Chtimes(filepath.Join(two, f), later, later)).To(Succeed())
	}
	summary := build(t, filepath.Join(one, "image.tar"), a...)
	build(t, filepath.Join(two, "image.tar"), b...)
	d1, d2 := digestOf(t, filepath.Join(one, "image.tar")), digestOf(t, filepath.Join(two, "image.tar"))
	g.Expect(d1).To(HavePrefix("sha256:"))
	g.Expect(d1).To(Equal(d2))
	g.Expect(fileSum(t, filepath.Join(one, "image.tar"))).To(Equal(fileSum(t, filepath.Join(two, "image.tar"))))
	g.Expect(summary).To(ContainSubstring(d1))
	g.Expect(summary).To(ContainSubstring("layer 2"))

	// A changed binary changes the digest: the digest is of the content.
	g.Expect(os.WriteFile(filepath.Join(two, "exporter"), []byte("not the exporter"), 0o755)).To(Succeed())
	build(t, filepath.Join(two, "image.tar"), b...)
	g.Expect(digestOf(t, filepath.Join(two, "image.tar"))).NotTo(Equal(d1))
}

// TestContents reads the built image back: the binaries at /NAME, executable; a passwd entry
// and a group for the uid the pods run as, which is the image's user; the CA certificates.
func TestContents(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	build(t, filepath.Join(dir, "image.tar"), binaries(t, dir)...)
	img, cleanup, err := ReadArchive(filepath.Join(dir, "image.tar"))
	g.Expect(err).NotTo(HaveOccurred())
	defer cleanup()

	cf, err := img.ConfigFile()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cf.Config.User).To(Equal("65532:65532"))
	g.Expect(cf.OS).To(Equal("linux"))
	g.Expect(cf.Config.Labels).To(HaveKeyWithValue("org.opencontainers.image.version", "1.2.3"))
	g.Expect(cf.Created.Unix()).To(BeZero())

	files := map[string]*tar.Header{}
	content := map[string][]byte{}
	layers, err := img.Layers()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(layers).To(HaveLen(2))
	for _, l := range layers {
		rc, err := l.Uncompressed()
		g.Expect(err).NotTo(HaveOccurred())
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			g.Expect(err).NotTo(HaveOccurred())
			files[h.Name] = h
			content[h.Name], _ = io.ReadAll(tr)
			g.Expect(h.ModTime.Unix()).To(BeZero(), h.Name)
		}
		rc.Close()
	}
	for _, b := range []string{"importer", "exporter"} {
		g.Expect(files).To(HaveKey(b))
		g.Expect(files[b].Mode & 0o111).NotTo(BeZero())
		g.Expect(content[b][:4]).To(Equal([]byte("\x7fELF")))
	}
	g.Expect(string(content["etc/passwd"])).To(ContainSubstring("nonroot:x:65532:65532:"))
	g.Expect(string(content["etc/group"])).To(ContainSubstring("nonroot:x:65532:"))
	g.Expect(string(content["etc/ssl/certs/ca-certificates.crt"])).To(ContainSubstring("BEGIN CERTIFICATE"))
	g.Expect(files["tmp/"].Mode & 0o1777).To(Equal(int64(0o1777)))

	// The binaries are static: they run on an image with no libc.
	out, err := exec.Command("file", filepath.Join(dir, "importer")).CombinedOutput()
	if err == nil {
		g.Expect(string(out)).To(ContainSubstring("statically linked"))
	}
}

// layerFiles reads every file of img's layers, in order, by name.
func layerFiles(t *testing.T, img interface{ Layers() ([]v1.Layer, error) }) []map[string][]byte {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string][]byte
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		files := map[string][]byte{}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name], _ = io.ReadAll(tr)
		}
		rc.Close()
		out = append(out, files)
	}
	return out
}

// layerTar writes img's layer i, uncompressed, to a file.
func layerTar(t *testing.T, img interface{ Layers() ([]v1.Layer, error) }, i int) string {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[i].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	p := filepath.Join(t.TempDir(), "layer.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.Copy(f, rc); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRootFS builds on a root filesystem's tar (as the real node's KubeVirt images are): it is
// the first layer as it was, the binaries go where their names say, in directories the layer
// lists, and the image runs as the user asked.
func TestRootFS(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	var rootfs bytes.Buffer
	tw := tar.NewWriter(&rootfs)
	for _, f := range []struct{ name, data string }{{"etc/", ""}, {"etc/os-release", "ID=debian\n"}, {"usr/", ""}, {"usr/bin/", ""}} {
		h := &tar.Header{Name: f.name, Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(f.data))}
		if strings.HasSuffix(f.name, "/") {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		}
		g.Expect(tw.WriteHeader(h)).To(Succeed())
		_, _ = tw.Write([]byte(f.data))
	}
	g.Expect(tw.Close()).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(dir, "rootfs.tar"), rootfs.Bytes(), 0o644)).To(Succeed())
	tool := filepath.Join(dir, "tool")
	g.Expect(os.WriteFile(tool, []byte("#!/bin/sh\n"), 0o755)).To(Succeed())

	build(t, filepath.Join(dir, "image.tar"), "--rootfs", filepath.Join(dir, "rootfs.tar"), "--user", "107:107",
		"--entrypoint", "/usr/bin/tool", "--cap", "usr/bin/tool=cap_net_bind_service", "usr/bin/tool="+tool, "opt/kubevirt/bin/helper="+tool)
	img, cleanup, err := ReadArchive(filepath.Join(dir, "image.tar"))
	g.Expect(err).NotTo(HaveOccurred())
	defer cleanup()
	layers := layerFiles(t, img)
	g.Expect(layers).To(HaveLen(2))
	g.Expect(layers[0]).To(HaveKeyWithValue("etc/os-release", []byte("ID=debian\n")))
	g.Expect(layers[0]).NotTo(HaveKey("etc/passwd"), "the root filesystem replaces the minimal layer")
	g.Expect(layers[1]).To(HaveKeyWithValue("usr/bin/tool", []byte("#!/bin/sh\n")))
	g.Expect(layers[1]).To(HaveKey("opt/kubevirt/bin/helper"))
	g.Expect(layers[1]).To(HaveKey("opt/kubevirt/"), "the directories a binary is in")
	// The file capability, as setcap writes it: GNU tar reads it back.
	out, err := exec.Command("tar", "--xattrs", "--xattrs-include=security.capability", "-xf", layerTar(t, img, 1), "-C", dir, "usr/bin/tool").CombinedOutput()
	g.Expect(err).NotTo(HaveOccurred(), string(out))
	out, err = exec.Command("/usr/sbin/getcap", filepath.Join(dir, "usr/bin/tool")).CombinedOutput() // libcap2-bin, hack/setup.sh
	g.Expect(err).NotTo(HaveOccurred(), string(out))
	g.Expect(string(out)).To(ContainSubstring("cap_net_bind_service=ep"))
	cf, err := img.ConfigFile()
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cf.Config.User).To(Equal("107:107"))
	g.Expect(cf.Config.Entrypoint).To(Equal([]string{"/usr/bin/tool"}))
	g.Expect(cf.Config.Env).To(ContainElement(ContainSubstring(":/usr/bin:")))
}

// TestPush pushes the archive to a real registry (Debian's docker-registry) and reads the
// manifest back by digest.
func TestPush(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	build(t, filepath.Join(dir, "image.tar"), binaries(t, dir)...)
	addr := registrytest.Start(t)
	var stdout bytes.Buffer
	g.Expect(run(context.Background(), []string{"push", "--archive", filepath.Join(dir, "image.tar"), addr + "/diskpipe/diskpipe:1.2.3"}, &stdout)).To(Succeed())
	d := digestOf(t, filepath.Join(dir, "image.tar"))
	g.Expect(stdout.String()).To(ContainSubstring(d))

	ref, err := name.ParseReference(addr + "/diskpipe/diskpipe:1.2.3")
	g.Expect(err).NotTo(HaveOccurred())
	desc, err := remote.Get(ref)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(desc.Digest.String()).To(Equal(d))

	// A name that is no image name is refused before anything is sent.
	err = run(context.Background(), []string{"push", "--archive", filepath.Join(dir, "image.tar"), "Not An Image"}, io.Discard)
	g.Expect(err).To(MatchError(ContainSubstring(`image name "Not An Image"`)))
	// A missing archive says which command makes it.
	err = run(context.Background(), []string{"push", "--archive", filepath.Join(dir, "missing.tar"), addr + "/x:1"}, io.Discard)
	g.Expect(err).To(MatchError(ContainSubstring("make image writes it")))
}
