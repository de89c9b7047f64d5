// Command image builds diskpipe's container image without Docker and pushes it to a registry.
//
//	image build --out bin/diskpipe-image.tar --ref ghcr.io/diskpipe/diskpipe:0.1.0 manager=bin/linux_amd64/manager ...
//	image push --archive bin/diskpipe-image.tar registry.example.com/diskpipe:0.1.0
//	image digest --archive bin/diskpipe-image.tar
//
// The image has no base: a layer of what a Go binary needs at run time (a passwd and group
// entry for the non-root uid 65532 every diskpipe pod runs as, the CA certificates of the
// machine that builds it, nsswitch.conf), then a layer of the binaries, each at /NAME (NAME may
// name directories: usr/bin/virt-api). With --rootfs, a root filesystem in a tar (what
// mmdebstrap --format=tar writes) is the first layer instead: the real node's KubeVirt images. Every
// timestamp is the Unix epoch (or SOURCE_DATE_EPOCH) and every list is sorted, so the same
// binaries give the same digest on every build. The archive is an OCI image layout in a tar
// (what `ctr images import`, skopeo's oci-archive: and crane read).
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// UID is the user every diskpipe pod runs as (the chart's runAsUser).
const UID = 65532

// caBundle is where Debian keeps the CA certificates; Go's crypto/x509 reads the same path.
const caBundle = "/etc/ssl/certs/ca-certificates.crt"

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: image build|push|digest [flags]")
	}
	fl := flag.NewFlagSet(args[0], flag.ContinueOnError)
	out := fl.String("out", "bin/diskpipe-image.tar", "build: the OCI archive to write")
	ref := fl.String("ref", "", "build: the image's name and tag, recorded in the archive")
	entrypoint := fl.String("entrypoint", "", "build: the image's entrypoint (diskpipe's pods name their command)")
	rootfs := fl.String("rootfs", "", "build: a root filesystem tar as the first layer, instead of passwd, group and CA certificates")
	user := fl.String("user", fmt.Sprintf("%d:%d", UID, UID), "build: the user the image runs as")
	var caps capsFlag
	fl.Var(&caps, "cap", "build: NAME=CAP: give the file NAME the file capability CAP (+ep), e.g. usr/bin/virt-launcher-monitor=cap_net_bind_service; repeatable")
	ca := fl.String("ca-certificates", caBundle, "build: the CA bundle to ship")
	arch := fl.String("arch", runtime.GOARCH, "build: the binaries' architecture")
	archive := fl.String("archive", "bin/diskpipe-image.tar", "push, digest: the OCI archive to read")
	insecure := fl.Bool("insecure", false, "push: plain HTTP to the registry (localhost and 127.0.0.1 always are)")
	if err := fl.Parse(args[1:]); err != nil {
		return err
	}
	switch args[0] {
	case "build":
		files, err := parseFiles(fl.Args())
		if err != nil {
			return err
		}
		for i, f := range files {
			files[i].Caps = caps[f.Path]
		}
		img, err := Build(files, Options{Ref: *ref, Entrypoint: *entrypoint, CABundle: *ca, Arch: *arch, RootFS: *rootfs, User: *user})
		if err != nil {
			return err
		}
		if err := WriteArchive(*out, *ref, img); err != nil {
			return err
		}
		return printSummary(stdout, *out, img)
	case "push":
		if fl.NArg() != 1 {
			return errors.New("usage: image push --archive FILE REGISTRY/REPOSITORY:TAG")
		}
		var opts []name.Option
		if *insecure {
			opts = append(opts, name.Insecure)
		}
		dst, err := name.ParseReference(fl.Arg(0), opts...)
		if err != nil {
			return fmt.Errorf("image name %q: %w", fl.Arg(0), err)
		}
		img, cleanup, err := ReadArchive(*archive)
		if err != nil {
			return err
		}
		defer cleanup()
		if err := remote.Write(dst, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return fmt.Errorf("pushing to %s: %w", dst, err)
		}
		d, _ := img.Digest()
		fmt.Fprintf(stdout, "pushed %s@%s\n", dst, d)
		return nil
	case "digest":
		img, cleanup, err := ReadArchive(*archive)
		if err != nil {
			return err
		}
		defer cleanup()
		d, err := img.Digest()
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, d)
		return nil
	}
	return fmt.Errorf("unknown command %q: build, push or digest", args[0])
}

// File is one file of the image: Path in the image, Source on this machine, and the file
// capabilities it is given (Linux capability numbers, permitted and effective).
type File struct {
	Path, Source string
	Caps         []int
}

// fileCaps are the capabilities --cap knows, by name.
var fileCaps = map[string]int{"cap_net_bind_service": 10, "cap_net_admin": 12, "cap_sys_nice": 23}

// capsFlag collects --cap NAME=CAP.
type capsFlag map[string][]int

func (c *capsFlag) String() string { return fmt.Sprint(map[string][]int(*c)) }
func (c *capsFlag) Set(v string) error {
	p, name, ok := strings.Cut(v, "=")
	n, known := fileCaps[strings.ToLower(name)]
	if !ok || !known {
		return fmt.Errorf("%q: want NAME=CAP, CAP one of cap_net_bind_service, cap_net_admin, cap_sys_nice", v)
	}
	if *c == nil {
		*c = capsFlag{}
	}
	p = "/" + strings.TrimPrefix(p, "/")
	(*c)[p] = append((*c)[p], n)
	return nil
}

// capXattr is the security.capability extended attribute (VFS_CAP_REVISION_2) that gives caps
// as permitted and effective.
func capXattr(caps []int) string {
	var lo, hi uint32
	for _, n := range caps {
		if n < 32 {
			lo |= 1 << n
		} else {
			hi |= 1 << (n - 32)
		}
	}
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], 0x02000000|0x1) // revision 2, effective
	binary.LittleEndian.PutUint32(b[4:], lo)             // permitted, low word
	binary.LittleEndian.PutUint32(b[12:], hi)            // permitted, high word
	return string(b)
}

func parseFiles(args []string) ([]File, error) {
	var files []File
	for _, a := range args {
		p, src, ok := strings.Cut(a, "=")
		if !ok || p == "" || src == "" {
			return nil, fmt.Errorf("%q: want NAME=PATH (the file PATH becomes /NAME in the image)", a)
		}
		files = append(files, File{Path: "/" + strings.TrimPrefix(p, "/"), Source: src})
	}
	if len(files) == 0 {
		return nil, errors.New("no files: name the binaries as NAME=PATH")
	}
	return files, nil
}

// Options shape the image.
type Options struct {
	// Ref is the image's name, recorded as its version label when it has a tag.
	Ref string
	// Entrypoint is the command the image runs when a pod names none.
	Entrypoint string
	// CABundle is the file shipped as /etc/ssl/certs/ca-certificates.crt.
	CABundle string
	// Arch is the binaries' architecture (GOARCH).
	Arch string
	// RootFS is a root filesystem's tar, the first layer in place of the minimal one.
	RootFS string
	// User runs the image's process (default the non-root UID).
	User string
}

// pathDirs is the image's PATH: / (diskpipe's binaries), then the usual directories.
const pathDirs = "/:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// epoch is every timestamp the image holds: SOURCE_DATE_EPOCH, or 1970.
func epoch() time.Time {
	if s, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64); err == nil {
		return time.Unix(s, 0).UTC()
	}
	return time.Unix(0, 0).UTC()
}

// Build makes the image from files, on no base or on o.RootFS.
func Build(files []File, o Options) (v1.Image, error) {
	var bins []entry
	for _, f := range files {
		data, err := os.ReadFile(f.Source)
		if err != nil {
			return nil, fmt.Errorf("%s (make image builds it): %w", f.Path, err)
		}
		e := entry{path: f.Path, mode: 0o755, data: data}
		if len(f.Caps) > 0 {
			e.xattrs = map[string]string{"security.capability": capXattr(f.Caps)}
		}
		bins = append(bins, e)
	}
	img := empty.Image
	var base v1.Layer
	what := "passwd, group, nsswitch.conf, CA certificates"
	if o.RootFS != "" {
		var err error
		if base, err = tarball.LayerFromFile(o.RootFS, tarball.WithMediaType(types.OCILayer)); err != nil {
			return nil, fmt.Errorf("the root filesystem %s: %w", o.RootFS, err)
		}
		what = "root filesystem " + filepath.Base(o.RootFS)
	} else {
		var err error
		if base, err = minimalBase(o.CABundle); err != nil {
			return nil, err
		}
	}
	binLayer, err := tarLayer(bins)
	if err != nil {
		return nil, err
	}
	for _, l := range []struct {
		layer v1.Layer
		what  string
	}{{base, what}, {binLayer, "binaries"}} {
		img, err = mutate.Append(img, mutate.Addendum{Layer: l.layer, MediaType: types.OCILayer,
			History: v1.History{Created: v1.Time{Time: epoch()}, CreatedBy: "diskpipe hack/image: " + l.what}})
		if err != nil {
			return nil, err
		}
	}
	img = mutate.MediaType(img, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", o.Arch
	cf.Created = v1.Time{Time: epoch()}
	cf.Config.User = o.User
	if cf.Config.User == "" {
		cf.Config.User = fmt.Sprintf("%d:%d", UID, UID)
	}
	cf.Config.WorkingDir = "/"
	cf.Config.Env = []string{"PATH=" + pathDirs, "SSL_CERT_FILE=" + caBundle}
	if o.Entrypoint != "" {
		cf.Config.Entrypoint = []string{o.Entrypoint}
	}
	cf.Config.Labels = map[string]string{"org.opencontainers.image.title": "diskpipe",
		"org.opencontainers.image.source": "https://github.com/diskpipe/diskpipe"}
	if r, err := name.ParseReference(o.Ref); err == nil {
		if t, ok := r.(name.Tag); ok {
			cf.Config.Labels["org.opencontainers.image.version"] = t.TagStr()
		}
	}
	return mutate.ConfigFile(img, cf)
}

// minimalBase is the layer of what a Go binary needs at run time.
func minimalBase(caBundle string) (v1.Layer, error) {
	ca, err := os.ReadFile(caBundle)
	if err != nil {
		return nil, fmt.Errorf("the CA certificates (apt-get install ca-certificates): %w", err)
	}
	return tarLayer([]entry{
		{path: "/etc/", mode: 0o755},
		{path: "/etc/group", mode: 0o644, data: fmt.Appendf(nil, "root:x:0:\nnonroot:x:%d:\n", UID)},
		{path: "/etc/nsswitch.conf", mode: 0o644, data: []byte("hosts: files dns\n")},
		{path: "/etc/passwd", mode: 0o644, data: fmt.Appendf(nil,
			"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", UID, UID)},
		{path: "/etc/ssl/", mode: 0o755},
		{path: "/etc/ssl/certs/", mode: 0o755},
		{path: "/etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: ca},
		{path: "/home/", mode: 0o755},
		{path: "/home/nonroot/", mode: 0o700, uid: UID},
		{path: "/tmp/", mode: 0o1777},
	})
}

// entry is a file or, with a trailing slash, a directory of a layer.
type entry struct {
	path   string
	mode   int64
	uid    int
	data   []byte
	xattrs map[string]string
}

// tarLayer writes entries as a tar in path order, owned by root unless said, stamped epoch(),
// with the directories they are in that entries do not list (0755).
func tarLayer(entries []entry) (v1.Layer, error) {
	listed := map[string]bool{}
	for _, e := range entries {
		listed[e.path] = true
	}
	for _, e := range entries {
		for d := filepath.Dir(strings.TrimSuffix(e.path, "/")); d != "/" && d != "."; d = filepath.Dir(d) {
			if !listed[d+"/"] {
				listed[d+"/"] = true
				entries = append(entries, entry{path: d + "/", mode: 0o755})
			}
		}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].path < entries[j].path })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: strings.TrimPrefix(e.path, "/"), Mode: e.mode, Uid: e.uid, Gid: e.uid,
			ModTime: epoch(), Format: tar.FormatPAX, Typeflag: tar.TypeReg, Size: int64(len(e.data))}
		for k, v := range e.xattrs { // as GNU tar and containerd write and read them
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		if strings.HasSuffix(e.path, "/") {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer))
}

// WriteArchive writes img as an OCI image layout in a tar at path, the manifest annotated
// with ref so that importers name it.
func WriteArchive(path, ref string, img v1.Image) error {
	dir, err := os.MkdirTemp(filepath.Dir(path), ".image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	var opts []layout.Option
	if ref != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref}))
	}
	if err := lp.AppendImage(img, opts...); err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	if err := tarDir(f, dir); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// tarDir writes the tree under dir into w, sorted, stamped epoch(), owned by root.
func tarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error { // WalkDir is lexical
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: epoch(), Format: tar.FormatPAX, Mode: 0o644, Typeflag: tar.TypeReg}
		if d.IsDir() {
			h.Name += "/"
			h.Mode, h.Typeflag = 0o755, tar.TypeDir
			return tw.WriteHeader(h)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		h.Size = int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// ReadArchive opens the one image of an OCI archive; cleanup removes what it unpacked.
func ReadArchive(path string) (v1.Image, func(), error) {
	dir, err := os.MkdirTemp("", "diskpipe-image-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	if err := untar(path, dir); err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("%s (make image writes it): %w", path, err)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("%s is not an OCI archive: %w", path, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(m.Manifests) != 1 {
		cleanup()
		return nil, nil, fmt.Errorf("%s: want one image in the archive, found %d", path, len(m.Manifests))
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return img, cleanup, nil
}

func untar(path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
			return fmt.Errorf("entry %q leaves the archive", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			out, err := os.Create(p)
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, tr); err != nil { //nolint:gosec // our own archive, read whole
				out.Close()
				return err
			}
			if err := out.Close(); err != nil {
				return err
			}
		}
	}
}

// printSummary says what was written: the digest, the size and each layer.
func printSummary(w io.Writer, path string, img v1.Image) error {
	d, err := img.Digest()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	var total int64
	cf, _ := img.ConfigFile()
	for i, l := range layers {
		size, _ := l.Size()
		ld, _ := l.Digest()
		total += size
		fmt.Fprintf(w, "  layer %d  %s  %6.1f MiB  %s\n", i+1, ld.String()[:19], float64(size)/(1<<20), cf.History[i].CreatedBy)
	}
	fmt.Fprintf(w, "%s  %s  %.1f MiB compressed\n", path, d, float64(total)/(1<<20))
	return nil
}
