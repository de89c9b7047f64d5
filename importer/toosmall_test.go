package importer

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore/objectstoretest"
)

// TestTooSmallForEverySource gives every source and format a volume too small for the image:
// each import is refused with TooLarge and the volume to request, having read a small part of
// the source (the image is 64 MiB of random data, so a download would show).
func TestTooSmallForEverySource(t *testing.T) {
	dir := t.TempDir()
	raw := filepath.Join(dir, "random.raw")
	b := make([]byte, fixtureSize)
	_, _ = rand.Read(b)
	writeFile(t, raw, b)
	qcow := convertTo(t, raw, "qcow2")
	vmdk := convertTo(t, raw, "vmdk", "-o", "subformat=streamOptimized")
	zst := compress(t, raw, "zstd")
	xz := filepath.Join(dir, "random.raw.xz")
	runTool(t, "sh", "-c", "xz -0 -T2 -k -c "+raw+" > "+xz)
	gz := filepath.Join(dir, "random.raw.gz")
	runTool(t, "sh", "-c", "gzip -1 -c "+raw+" > "+gz)
	ova := makeOVA(t, ovf([4]string{"d", filepath.Base(vmdk), "64", ""}), vmdk)

	store := objectstoretest.Start(t)
	if out, err := store.AWS(t.Context(), store.SecretKey, "s3", "mb", "s3://images"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for _, p := range []string{qcow, xz} {
		if out, err := store.AWS(t.Context(), store.SecretKey, "s3", "cp", "--only-show-errors", p, "s3://images/"+filepath.Base(p)); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	reg := registry(t)
	for name, disk := range map[string]string{"qcow2": qcow, "raw": raw} {
		img := containerDisk(t, disk, "amd64", "disk")
		push(t, reg, "containerdisks/"+name, "latest", img.Manifest, "application/vnd.oci.image.manifest.v1+json", img.Blobs)
	}

	http := func(path string, noRange bool) Source {
		return &HTTPSource{URL: serve(t, &fileServer{path: path, noRange: noRange})}
	}
	for _, c := range []struct {
		name string
		src  Source
	}{
		{"http qcow2", http(qcow, false)},
		{"http qcow2 without Range", http(qcow, true)},
		{"http streamOptimized vmdk without Range", http(vmdk, true)},
		{"http raw", http(raw, false)},
		{"http raw without Range", http(raw, true)},
		{"http raw.zst without Range", http(zst, true)},
		{"http raw.gz", http(gz, false)},
		{"http raw.xz", http(xz, false)},
		{"http OVA without Range", http(ova, true)},
		{"s3 qcow2", &S3Source{Config: store.ClientConfig(), Bucket: "images", Object: filepath.Base(qcow)}},
		{"s3 raw.xz", &S3Source{Config: store.ClientConfig(), Bucket: "images", Object: filepath.Base(xz)}},
		{"registry qcow2", &RegistrySource{URL: "docker://" + reg + "/containerdisks/qcow2:latest", Insecure: true}},
		{"registry raw", &RegistrySource{URL: "docker://" + reg + "/containerdisks/raw:latest", Insecure: true}},
		{"another volume's disk", &FileSource{Path: raw}},
	} {
		t.Run(c.name, func(t *testing.T) {
			// 66 MiB less 6 % is 62 MiB: too small for 64 MiB; 69 MiB would do.
			target, res, err := importTo(t, t.TempDir(), Options{Source: c.src, Capacity: 66 << 20})
			wantFailure(t, target, err, transfer.ReasonTooLarge, false, "request a volume of at least 69.0 MiB")
			if res.BytesRead > 8<<20 {
				t.Errorf("read %d bytes of the source before refusing it", res.BytesRead)
			}
		})
	}
	t.Run("a block device", func(t *testing.T) {
		if os.Getuid() != 0 {
			t.Skip("needs root for a loop device")
		}
		dev := loopDevice(t, 48<<20)
		_, _, err := importTo(t, t.TempDir(), Options{Source: http(qcow, false), Target: dev})
		if transfer.ReasonOf(err) != transfer.ReasonTooLarge || !strings.Contains(err.Error(), "request a volume of at least 64.0 MiB") {
			t.Errorf("%v", err)
		}
	})
}

// TestPreallocate allocates the whole disk file, imported or grown, keeping its bytes.
func TestPreallocate(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	url := serve(t, &fileServer{path: convertTo(t, raw, "qcow2")})
	target, res := mustImport(t, t.TempDir(), Options{Source: &HTTPSource{URL: url}, Preallocate: true})
	sameDisk(t, raw, target)
	if a := allocated(t, target); a < res.VirtualSize {
		t.Errorf("%d bytes allocated of a %d-byte preallocated disk", a, res.VirtualSize)
	}
	sparse, _ := mustImport(t, t.TempDir(), Options{Source: &HTTPSource{URL: url}})
	if a := allocated(t, sparse); a >= fixtureSize/2 {
		t.Errorf("%d bytes allocated without preallocation: the control is not sparse", a)
	}
	// A disk the storage cloned, grown into a larger volume: 100 MiB less 6 % is 94 MiB.
	gres, err := Grow(sparse, 100<<20, DefaultOverhead, true)
	if err != nil {
		t.Fatal(err)
	}
	if gres.VirtualSize != 94<<20 || allocated(t, sparse) < gres.VirtualSize {
		t.Errorf("grown to %d bytes, %d allocated", gres.VirtualSize, allocated(t, sparse))
	}
	sameDisk(t, raw, sparse) // qemu-img compare: the image, then zeros
}

// TestOverheadAsGiven: the filesystem's share is the one the pod is given, 0 included (a
// CDIConfig may keep none, and the claim was then sized with none): a disk exactly as large
// as its volume fits with --overhead 0 and is refused with the default, which names it.
func TestOverheadAsGiven(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	url := serve(t, &fileServer{path: raw})
	size := strconv.Itoa(fixtureSize)
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"--overhead", "0"}, transfer.ExitSucceeded},
		{nil, transfer.ExitFailed},
	} {
		target := filepath.Join(t.TempDir(), "disk.img")
		code, res, log := runMain(t, append([]string{"--url", url, "--target", target, "--capacity", size}, c.args...)...)
		if code != c.code {
			t.Fatalf("%v: exit %d, want %d: %+v\n%s", c.args, code, c.code, res, log)
		}
		if code == transfer.ExitSucceeded {
			sameDisk(t, raw, target)
		} else if res.Reason != transfer.ReasonTooLarge || !strings.Contains(res.Message, "6 % filesystem overhead") {
			t.Errorf("the default overhead: %s %s", res.Reason, res.Message)
		}
	}
}
