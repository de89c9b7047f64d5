package importer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/diskpipe/diskpipe/importer/registrytest"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// vmArtifact builds a KubeVirt VM artifact (VEP 256) as KubeVirt exports one: an OCI manifest
// of one layer per disk, each the raw disk compressed (raw+zstd, raw+gzip), annotated with its
// name and its claim's properties, and a layer of the VM's persistent state that is no disk;
// pushed behind an index of this machine's platform.
func vmArtifact(t *testing.T, addr, repo string, disks map[string]string) map[string]string {
	t.Helper()
	digests := map[string]string{}
	var layers []any
	var blobs []blob
	for _, name := range []string{"rootdisk", "data"} {
		path, ok := disks[name]
		if !ok {
			continue
		}
		tool, media := "zstd", "application/vnd.kubevirt.disk.raw+zstd"
		if name == "data" {
			tool, media = "gzip", "application/vnd.kubevirt.disk.raw+gzip"
		}
		b, err := os.ReadFile(compress(t, path, tool))
		if err != nil {
			t.Fatal(err)
		}
		l := registrytest.NewBlob(b)
		digests[name] = l.Digest
		blobs = append(blobs, l)
		layers = append(layers, registrytest.Descriptor(media, l, map[string]any{"annotations": map[string]string{
			"io.kubevirt.disk.name": name, "io.kubevirt.pvc.capacity": "128Mi", "io.kubevirt.pvc.volumeMode": "Block",
			"io.kubevirt.pvc.accessModes": "ReadWriteOnce"}}))
	}
	state := registrytest.NewBlob([]byte("not a disk: the VM's TPM and EFI state"))
	blobs = append(blobs, state)
	layers = append(layers, registrytest.Descriptor("application/vnd.kubevirt.persistentstate.tar+zstd", state, nil))
	config := registrytest.NewBlob([]byte("{}"))
	blobs = append(blobs, config)
	manifest := registrytest.NewBlob(mustJSON(t, map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"artifactType": "application/vnd.kubevirt.vm.v1+json",
		"config":       registrytest.Descriptor("application/vnd.oci.empty.v1+json", config, nil), "layers": layers}))
	idx := index(t, map[string]ociImage{"amd64": {Manifest: manifest}})
	push(t, addr, repo, "latest", idx, "application/vnd.oci.image.index.v1+json", append([]blob{manifest}, blobs...))
	return digests
}

// TestVMArtifact imports one disk of a KubeVirt VM artifact, picked by its name or its layer's
// digest, through the index to this machine's platform, each identical to its disk (qemu-img);
// an artifact of two disks with none named, a name it lacks, and a disk asked of a plain
// container disk are refused with reasons that list what there is.
func TestVMArtifact(t *testing.T) {
	dir := t.TempDir()
	root := makeRaw(t, dir)
	data := filepath.Join(dir, "data.raw")
	writeFile(t, data, []byte(strings.Repeat("data disk ", 300000)))
	addr := registry(t)
	digests := vmArtifact(t, addr, "vms/fedora", map[string]string{"rootdisk": root, "data": data})
	url := "docker://" + addr + "/vms/fedora:latest"

	for _, c := range []struct{ disk, want string }{{"rootdisk", root}, {digests["data"], data}, {"data", data}} {
		t.Run(c.disk, func(t *testing.T) {
			target, res := mustImport(t, t.TempDir(), Options{Source: &RegistrySource{URL: url, Insecure: true, Disk: c.disk}})
			sameDisk(t, c.want, target)
			if res.Format != "raw" {
				t.Errorf("format %q compression %q", res.Format, res.Compression)
			}
		})
	}
	t.Run("probe", func(t *testing.T) {
		// The compressed disk's size is not known before it is read: the capacity of the claim
		// it was exported from sizes the volume.
		res, err := Probe(t.Context(), Options{Source: &RegistrySource{URL: url, Insecure: true, Disk: "rootdisk"}, Retry: fastRetry})
		if err != nil || res.Format != "raw" || res.Compression != "zstd" || res.VirtualSize != 128<<20 {
			t.Errorf("probe: %+v %v", res, err)
		}
	})
	t.Run("command", func(t *testing.T) {
		target := filepath.Join(t.TempDir(), "disk.img")
		code, res, log := runMain(t, "--source", "registry", "--url", url, "--insecure", "--disk", "rootdisk", "--target", target)
		if code != 0 {
			t.Fatalf("exit %d %+v\n%s", code, res, log)
		}
		sameDisk(t, root, target)
	})
	only := vmArtifact(t, addr, "vms/one", map[string]string{"rootdisk": root})
	t.Run("the only disk", func(t *testing.T) {
		target, res := mustImport(t, t.TempDir(), Options{Source: &RegistrySource{URL: "docker://" + addr + "/vms/one:latest", Insecure: true}})
		sameDisk(t, root, target)
		if res.Revision == "" || only["rootdisk"] == "" {
			t.Errorf("revision %q", res.Revision)
		}
	})

	plain := containerDisk(t, root, "amd64", "disk")
	push(t, addr, "containerdisks/plain", "latest", plain.Manifest, "application/vnd.oci.image.manifest.v1+json", plain.Blobs)
	for _, c := range []struct {
		name, url, disk string
		reason          transfer.Reason
		msg             string
	}{
		{"two disks, none named", url, "", transfer.ReasonInvalidArgument, "has 2 disks, rootdisk (sha256:"},
		{"a disk it lacks", url, "swap", transfer.ReasonSourceNotFound, `has no disk "swap": its disks are rootdisk (sha256:`},
		{"a disk of a container disk", "docker://" + addr + "/containerdisks/plain:latest", "rootdisk", transfer.ReasonSourceNotFound, "is not a KubeVirt VM artifact"},
	} {
		t.Run(c.name, func(t *testing.T) {
			target, _, err := importTo(t, t.TempDir(), Options{Source: &RegistrySource{URL: c.url, Insecure: true, Disk: c.disk}})
			wantFailure(t, target, err, c.reason, false, c.msg)
		})
	}
}
