package importer

import (
	"path/filepath"
	"testing"

	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore/objectstoretest"
)

// TestS3Source is seed 003's story: a user uploads images with awscli to the bundled store,
// and an import reads them from there; through the command too, with credentials from files.
func TestS3Source(t *testing.T) {
	dir := t.TempDir()
	raw := makeRaw(t, dir)
	s := objectstoretest.Start(t)
	aws := func(args ...string) {
		t.Helper()
		if out, err := s.AWS(t.Context(), s.SecretKey, args...); err != nil {
			t.Fatalf("aws %v: %v\n%s", args, err, out)
		}
	}
	aws("s3", "mb", "s3://vmimage")
	qcow := convertTo(t, raw, "qcow2", "-c")
	aws("s3", "cp", "--only-show-errors", qcow, "s3://vmimage/bionic.qcow2")
	aws("s3", "cp", "--only-show-errors", compress(t, raw, "zstd"), "s3://vmimage/bionic.raw.zst")

	// A scheduled image's check: the object's ETag, new when the object is replaced (awscli).
	t.Run("check", func(t *testing.T) {
		src := &S3Source{Config: s.ClientConfig(), Bucket: "vmimage", Object: "nightly.qcow2"}
		aws("s3", "cp", "--only-show-errors", qcow, "s3://vmimage/nightly.qcow2")
		first, err := Check(t.Context(), Options{Source: src, Retry: fastRetry})
		if err != nil || first.Revision == "" {
			t.Fatalf("check: %q, %v", first.Revision, err)
		}
		if again, _ := Check(t.Context(), Options{Source: src, Retry: fastRetry}); again.Revision != first.Revision {
			t.Errorf("an unchanged object: %q then %q", first.Revision, again.Revision)
		}
		aws("s3", "cp", "--only-show-errors", compress(t, raw, "zstd"), "s3://vmimage/nightly.qcow2")
		if next, _ := Check(t.Context(), Options{Source: src, Retry: fastRetry}); next.Revision == first.Revision || next.Revision == "" {
			t.Errorf("a replaced object kept revision %q", next.Revision)
		}
		_, err = Check(t.Context(), Options{Source: &S3Source{Config: s.ClientConfig(), Bucket: "vmimage", Object: "nope"}, Retry: fastRetry})
		if transfer.ReasonOf(err) != transfer.ReasonSourceNotFound {
			t.Errorf("a missing object: %v", err)
		}
	})
	for _, object := range []string{"bionic.qcow2", "bionic.raw.zst"} {
		t.Run(object, func(t *testing.T) {
			target, res := mustImport(t, t.TempDir(), Options{Source: &S3Source{Config: s.ClientConfig(), Bucket: "vmimage", Object: object}})
			sameDisk(t, raw, target)
			if res.VirtualSize != fixtureSize {
				t.Errorf("virtual size %d", res.VirtualSize)
			}
		})
	}
	// The Secret's keys: diskpipe's secretAccessKey, or CDI's secretKey.
	for _, secretKey := range []string{"secretAccessKey", "secretKey"} {
		t.Run("command with "+secretKey, func(t *testing.T) {
			creds := t.TempDir()
			writeFile(t, filepath.Join(creds, "accessKeyId"), []byte(s.AccessKey))
			writeFile(t, filepath.Join(creds, secretKey), []byte(s.SecretKey+"\n"))
			target := filepath.Join(t.TempDir(), "disk.img")
			code, res, log := runMain(t, "--source", "s3", "--endpoint", s.Endpoint, "--bucket-lookup", "Path",
				"--bucket", "vmimage", "--object", "bionic.qcow2", "--s3-credentials-dir", creds, "--target", target,
				"--checksum", sha256File(t, qcow))
			if code != 0 {
				t.Fatalf("exit %d %+v\n%s", code, res, log)
			}
			sameDisk(t, raw, target)
		})
	}
	for _, c := range []struct {
		name           string
		bucket, object string
		secret         string
		reason         transfer.Reason
		msg            string
	}{
		{"missing object", "vmimage", "nope.qcow2", s.SecretKey, transfer.ReasonSourceNotFound, "NoSuchKey"},
		{"missing bucket", "other", "bionic.qcow2", s.SecretKey, transfer.ReasonSourceNotFound, `bucket "other" does not exist`},
		{"wrong key", "vmimage", "bionic.qcow2", "wrong", transfer.ReasonSourceForbidden, "SignatureDoesNotMatch"},
		{"invalid bucket name", "VmImage", "bionic.qcow2", s.SecretKey, transfer.ReasonInvalidArgument, `bucket name "VmImage" is not valid`},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := s.ClientConfig()
			cfg.SecretKey = c.secret
			target, _, err := importTo(t, t.TempDir(), Options{Source: &S3Source{Config: cfg, Bucket: c.bucket, Object: c.object}})
			wantFailure(t, target, err, c.reason, false, c.msg)
		})
	}
	t.Run("store down", func(t *testing.T) {
		s.Kill()
		target, _, err := importTo(t, t.TempDir(), Options{Source: &S3Source{Config: s.ClientConfig(), Bucket: "vmimage", Object: "bionic.qcow2"}})
		wantFailure(t, target, err, transfer.ReasonSourceUnavailable, true, "connection refused")
	})
}
