package importer

import (
	"path/filepath"
	"testing"

	"github.com/diskpipe/diskpipe/importer/registrytest"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// TestSignedContainerDisk requires a cosign signature by a key, made by sigstore's Go
// libraries and stored in a real registry as cosign stores it: a signed image imports; an
// unsigned one, one signed by another key, and one replaced after it was signed (its tag now
// names another digest, beside the first one's signature) each fail with their own reason,
// before a byte is written.
func TestSignedContainerDisk(t *testing.T) {
	dir := t.TempDir()
	raw := makeRaw(t, dir)
	qcow := convertTo(t, raw, "qcow2")
	addr := registry(t)
	signer, stranger := registrytest.NewSigner(t), registrytest.NewSigner(t)
	keyFile := filepath.Join(dir, "cosign.pub")
	writeFile(t, keyFile, signer.PublicKey)

	const mt = "application/vnd.oci.image.manifest.v1+json"
	signed := containerDisk(t, qcow, "amd64", "disk")
	push(t, addr, "disks/signed", "v1", signed.Manifest, mt, signed.Blobs)
	signer.Sign(t, addr, "disks/signed", signed.Manifest.Digest)
	push(t, addr, "disks/unsigned", "v1", signed.Manifest, mt, signed.Blobs)
	push(t, addr, "disks/stranger", "v1", signed.Manifest, mt, signed.Blobs)
	stranger.Sign(t, addr, "disks/stranger", signed.Manifest.Digest)
	// Replaced: v1 now names another image; the signature of the first is copied beside it.
	other := containerDisk(t, raw, "amd64", "disk")
	push(t, addr, "disks/replaced", "v1", other.Manifest, mt, other.Blobs)
	signer.SignAs(t, addr, "disks/replaced", other.Manifest.Digest, signed.Manifest.Digest)

	src := func(repo string) *RegistrySource {
		return &RegistrySource{URL: "docker://" + addr + "/" + repo + ":v1", Insecure: true, PublicKeyFile: keyFile}
	}
	t.Run("signed", func(t *testing.T) {
		target, res := mustImport(t, t.TempDir(), Options{Source: src("disks/signed")})
		sameDisk(t, raw, target)
		if res.Format != "qcow2" {
			t.Errorf("format %s", res.Format)
		}
	})
	t.Run("command", func(t *testing.T) {
		target := filepath.Join(t.TempDir(), "disk.img")
		code, res, log := runMain(t, "--source", "registry", "--url", "docker://"+addr+"/disks/signed:v1", "--insecure",
			"--registry-public-key-file", keyFile, "--target", target)
		if code != 0 {
			t.Fatalf("exit %d %+v\n%s", code, res, log)
		}
		sameDisk(t, raw, target)
	})
	notPEM := filepath.Join(dir, "not.pub")
	writeFile(t, notPEM, []byte("ssh-ed25519 AAAA"))
	for _, c := range []struct {
		name   string
		src    *RegistrySource
		reason transfer.Reason
		msg    string
	}{
		{"unsigned", src("disks/unsigned"), transfer.ReasonUnsigned, "has no cosign signature"},
		{"signed by another key", src("disks/stranger"), transfer.ReasonSignatureInvalid, "none by the given key"},
		{"replaced after it was signed", src("disks/replaced"), transfer.ReasonSignedDigestMismatch, "signs " + signed.Manifest.Digest},
		{"a key that is not PEM", &RegistrySource{URL: "docker://" + addr + "/disks/signed:v1", Insecure: true, PublicKeyFile: notPEM},
			transfer.ReasonInvalidArgument, "not PEM"},
		{"an oci-archive", &RegistrySource{URL: "oci-archive:" + ociArchive(t, signed, false), PublicKeyFile: keyFile},
			transfer.ReasonInvalidArgument, "docker:// images only"},
	} {
		t.Run(c.name, func(t *testing.T) {
			target, res, err := importTo(t, t.TempDir(), Options{Source: c.src})
			wantFailure(t, target, err, c.reason, false, c.msg)
			if res.BytesRead != 0 || res.BytesWritten != 0 {
				t.Errorf("read %d and wrote %d bytes of a disk that was refused", res.BytesRead, res.BytesWritten)
			}
		})
	}
}
