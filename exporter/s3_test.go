package exporter

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/diskpipe/diskpipe/importer"
	"github.com/diskpipe/diskpipe/internal/contract"
	"github.com/diskpipe/diskpipe/internal/seal"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore/objectstoretest"
)

func runExporter(t *testing.T, s *objectstoretest.Server, args ...string) (int, *transfer.Result, string) {
	t.Helper()
	creds := t.TempDir()
	for k, v := range map[string]string{"accessKeyId": s.AccessKey, "secretAccessKey": s.SecretKey} {
		if err := os.WriteFile(filepath.Join(creds, k), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	term := filepath.Join(t.TempDir(), "termination-log")
	var log bytes.Buffer
	code := Main(t.Context(), append([]string{"--endpoint", s.Endpoint, "--bucket-lookup", "Path", "--s3-credentials-dir", creds,
		"--allow-destination", "127.0.0.0/8", "--metrics-addr", "", "--termination-message-path", term}, args...), &log)
	msg, err := os.ReadFile(term)
	if err != nil {
		t.Fatalf("no result (exit %d): %v\n%s", code, err, log.String())
	}
	res, err := transfer.ReadResult(string(msg))
	if err != nil {
		t.Fatal(err)
	}
	return code, res, log.String()
}

func fileDigest(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// TestExportToStore is seed 003's story 6: a disk is exported as qcow2 into the bundled store,
// downloaded with awscli and with a plain HTTP GET of a presigned URL, and checked with
// qemu-img; importing the export gives back the disk bit for bit.
func TestExportToStore(t *testing.T) {
	s := objectstoretest.Start(t)
	src := makeDisk(t, 40<<20, false)
	for _, comp := range []string{"none", "zlib"} {
		t.Run(comp, func(t *testing.T) {
			object := "mydisk-" + comp + ".qcow2"
			code, res, log := runExporter(t, s, "--source", src, "--bucket", "vmimage", "--object", object,
				"--create-bucket", "--compression", comp, "--size", "41943040")
			if code != 0 || !res.Succeeded {
				t.Fatalf("exit %d %+v\n%s", code, res, log)
			}
			if res.URL != "s3://vmimage/"+object {
				t.Errorf("url %s", res.URL)
			}
			dl := filepath.Join(t.TempDir(), "download.qcow2")
			if out, err := s.AWS(t.Context(), s.SecretKey, "s3", "cp", "--only-show-errors", "s3://vmimage/"+object, dl); err != nil {
				t.Fatalf("aws s3 cp: %v\n%s", err, out)
			}
			checkImage(t, src, dl, "qcow2")
			if got := fileDigest(t, dl); got != res.Digest {
				t.Errorf("the object's sha256 is %s, the result says %s", got, res.Digest)
			}
			tags, err := s.Client().GetObjectTagging(t.Context(), "vmimage", object, minio.GetObjectTaggingOptions{})
			if err != nil || "sha256:"+tags.ToMap()["diskpipe-sha256"] != res.Digest {
				t.Errorf("sha256 tag: %v %v", tags, err)
			}
			info, err := s.Client().StatObject(t.Context(), "vmimage", object, minio.StatObjectOptions{})
			if err != nil || info.UserMetadata["Diskpipe-Format"] != "qcow2" {
				t.Errorf("object metadata %v: %v", info.UserMetadata, err)
			}

			u, err := s.Client().PresignGet(t.Context(), "vmimage", object, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			viaCurl := filepath.Join(t.TempDir(), "curl.qcow2")
			if out, err := exec.Command("curl", "-sSf", "-o", viaCurl, u.String()).CombinedOutput(); err != nil {
				t.Fatalf("curl: %v\n%s", err, out)
			}
			if fileDigest(t, viaCurl) != res.Digest {
				t.Error("the presigned download differs from the object")
			}

			target := filepath.Join(t.TempDir(), "disk.img")
			if _, err := importer.Import(t.Context(), importer.Options{Target: target,
				Source: &importer.S3Source{Config: s.ClientConfig(), Bucket: "vmimage", Object: object}}); err != nil {
				t.Fatalf("importing the export: %v", err)
			}
			if fileDigest(t, target) != fileDigest(t, src) {
				t.Error("the round trip through the importer is not bit-identical")
			}
		})
	}
}

// TestObjectActions: the exporter signs the download URL itself after an export, and as its
// own action later, and deletes the object: what the manager asks of a pod for an external
// store, so that only the pod reads the user's keys.
func TestObjectActions(t *testing.T) {
	s := objectstoretest.Start(t)
	src := makeDisk(t, 8<<20, false)
	key, err := seal.Key(bytes.Repeat([]byte{1}, 32))
	if err != nil {
		t.Fatal(err)
	}
	// open reads a sealed URL as the manager does; the result itself holds none in the clear.
	open := func(res *transfer.Result, log string) string {
		t.Helper()
		if strings.Contains(log, "X-Amz-Signature") {
			t.Errorf("the log shows a signed URL:\n%s", log)
		}
		u, err := seal.Open(key, res.SealedDownloadURL, contract.DownloadSealContext("vms/backup", *res.DownloadURLExpiresAt))
		if err != nil {
			t.Fatalf("opening the sealed URL: %v", err)
		}
		return string(u)
	}
	before := time.Now()
	code, res, log := runExporter(t, s, "--source", src, "--bucket", "offsite", "--object", "disk.qcow2", "--create-bucket",
		"--download-url-expiry", "90m", "--seal-key", seal.Public(key), "--seal-context", "vms/backup")
	if code != 0 || !res.Succeeded || res.SealedDownloadURL == "" || res.DownloadURLExpiresAt == nil {
		t.Fatalf("exit %d %+v\n%s", code, res, log)
	}
	if d := res.DownloadURLExpiresAt.Sub(before); d < 90*time.Minute || d > 91*time.Minute {
		t.Errorf("the URL expires %v after the start, asked 90m", d)
	}
	download := func(u string) (string, error) {
		p := filepath.Join(t.TempDir(), "download.qcow2")
		out, err := exec.Command("curl", "-sSf", "-o", p, u).CombinedOutput()
		if err != nil {
			return string(out), err
		}
		return fileDigest(t, p), nil
	}
	first := open(res, log)
	if got, err := download(first); err != nil || got != res.Digest {
		t.Fatalf("the export's own URL: %v %s (the object is %s)", err, got, res.Digest)
	}

	code, signed, log := runExporter(t, s, "--action", "presign", "--bucket", "offsite", "--object", "disk.qcow2", "--download-url-expiry", "2h",
		"--seal-key", seal.Public(key), "--seal-context", "vms/backup")
	if code != 0 || signed.SealedDownloadURL == "" || signed.URL != "s3://offsite/disk.qcow2" {
		t.Fatalf("presign: exit %d %+v\n%s", code, signed, log)
	}
	second := open(signed, log)
	if second == first {
		t.Error("presign signed the URL of the export again")
	}
	// Bound to the export it was signed for, and to its expiry: another export's context, or
	// another expiry, does not open it.
	if _, err := seal.Open(key, signed.SealedDownloadURL, contract.DownloadSealContext("mallory/loot", *signed.DownloadURLExpiresAt)); err == nil {
		t.Error("the sealed URL opened for another export")
	}
	if _, err := seal.Open(key, signed.SealedDownloadURL, contract.DownloadSealContext("vms/backup", signed.DownloadURLExpiresAt.Add(time.Hour))); err == nil {
		t.Error("the sealed URL opened with another expiry")
	}
	if got, err := download(second); err != nil || got != res.Digest {
		t.Fatalf("the presigned URL: %v %s", err, got)
	}
	if code, res, _ := runExporter(t, s, "--action", "presign", "--bucket", "offsite", "--object", "disk.qcow2"); code != transfer.ExitFailed ||
		res.Reason != transfer.ReasonInvalidArgument {
		t.Errorf("presign without an expiry: exit %d %+v", code, res)
	}
	// Never a URL in the clear: with no key to seal it to, no URL.
	if code, res, _ := runExporter(t, s, "--action", "presign", "--bucket", "offsite", "--object", "disk.qcow2", "--download-url-expiry", "1h"); code != transfer.ExitFailed ||
		res.Reason != transfer.ReasonInvalidArgument || !strings.Contains(res.Message, "--seal-key") {
		t.Errorf("presign without a seal key: exit %d %+v", code, res)
	}

	for range 2 { // deleting an object already gone succeeds
		if code, res, log := runExporter(t, s, "--action", "delete", "--bucket", "offsite", "--object", "disk.qcow2"); code != 0 || !res.Succeeded {
			t.Fatalf("delete: exit %d %+v\n%s", code, res, log)
		}
		noObject(t, s, "offsite", "disk.qcow2")
	}
	if _, err := download(second); err == nil {
		t.Error("the URL still downloads a deleted object")
	}
	var stderr bytes.Buffer
	if code := Main(t.Context(), []string{"--action", "copy"}, &stderr); code != transfer.ExitUsage || !strings.Contains(stderr.String(), "export, presign or delete") {
		t.Errorf("an unknown action: exit %d %s", code, stderr.String())
	}
}

// TestBlockSource exports a block device (a loop device).
func TestBlockSource(t *testing.T) {
	src := makeDisk(t, 24<<20, false)
	out, err := exec.Command("losetup", "-f", "--show", src).CombinedOutput()
	if err != nil {
		t.Skipf("no loop device (losetup: %v: %s): block sources are not tested", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	img, _ := exportFile(t, Options{Source: dev, Format: FormatQcow2, Compression: CompressionZlib})
	checkImage(t, src, img, "qcow2")
}

func randomDisk(t *testing.T, size int) string {
	t.Helper()
	b := make([]byte, size)
	_, _ = rand.Read(b)
	p := filepath.Join(t.TempDir(), "random.img")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func noObject(t *testing.T, s *objectstoretest.Server, bucket, object string) {
	t.Helper()
	if _, err := s.Client().StatObject(t.Context(), bucket, object, minio.StatObjectOptions{}); err == nil {
		t.Errorf("s3://%s/%s exists after a failed export", bucket, object)
	}
}

func pendingUploads(t *testing.T, s *objectstoretest.Server) int {
	t.Helper()
	res, err := minio.Core{Client: s.Client().Client}.ListMultipartUploads(t.Context(), "exports", "", "", "", "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	return len(res.Uploads)
}

// TestStoreGoesAway kills the store after the first part: the export fails as transient,
// no object appears; the next export aborts the left-over upload and succeeds.
func TestStoreGoesAway(t *testing.T) {
	s := objectstoretest.Start(t)
	if err := s.Client().EnsureBucket(t.Context(), "exports"); err != nil {
		t.Fatal(err)
	}
	src := randomDisk(t, 48<<20)
	fast := transfer.RetryPolicy{Attempts: 2, Initial: 10 * time.Millisecond, Max: 20 * time.Millisecond}
	sink, err := NewMultipartSink(t.Context(), s.Client(), SinkOptions{Bucket: "exports", Object: "disk.raw", PartSize: 5 << 20, Parallel: 1, Retry: fast})
	if err != nil {
		t.Fatal(err)
	}
	sink.OnPart = func(n int) {
		if n == 1 {
			s.Kill()
		}
	}
	_, err = Export(t.Context(), Options{Source: src, Format: FormatRaw, Sink: sink})
	if !transfer.IsTransient(err) || transfer.ReasonOf(err) != transfer.ReasonTargetUnavailable {
		t.Fatalf("err = %v (%s), want a transient failure", err, transfer.ReasonOf(err))
	}
	s.Restart()
	noObject(t, s, "exports", "disk.raw")
	if n := pendingUploads(t, s); n != 1 {
		t.Fatalf("%d pending uploads after the store came back, want the one left behind", n)
	}
	sink, err = NewMultipartSink(t.Context(), s.Client(), SinkOptions{Bucket: "exports", Object: "disk.raw", PartSize: 5 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Export(t.Context(), Options{Source: src, Format: FormatRaw, Sink: sink}); err != nil {
		t.Fatal(err)
	}
	if n := pendingUploads(t, s); n != 0 {
		t.Errorf("%d uploads still pending", n)
	}
}

// TestBadSources: a disk shorter than declared, a missing disk, an invalid bucket — each
// fails permanently with nothing left in the store.
func TestBadSources(t *testing.T) {
	s := objectstoretest.Start(t)
	src := makeDisk(t, 24<<20, false)
	for _, c := range []struct {
		name   string
		args   []string
		reason transfer.Reason
		msg    string
	}{
		{"shorter than declared", []string{"--source", src, "--size", "33554432", "--bucket", "exports", "--object", "a"},
			transfer.ReasonTruncatedImage, "shorter than the declared 33554432"},
		{"missing disk", []string{"--source", "/nonexistent", "--bucket", "exports", "--object", "b"},
			transfer.ReasonSourceNotFound, "does not exist"},
		{"invalid bucket", []string{"--source", src, "--bucket", "VmImage", "--object", "c"},
			transfer.ReasonInvalidArgument, `bucket name "VmImage" is not valid`},
		{"raw compressed", []string{"--source", src, "--bucket", "exports", "--object", "d", "--format", "raw", "--compression", "zlib"},
			transfer.ReasonInvalidArgument, "compression zlib needs format qcow2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, res, _ := runExporter(t, s, append(c.args, "--create-bucket")...)
			if code != transfer.ExitFailed || res.Reason != c.reason || !strings.Contains(res.Message, c.msg) {
				t.Errorf("exit %d, result %+v", code, res)
			}
		})
	}
	if err := s.Client().EnsureBucket(t.Context(), "exports"); err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{"a", "b", "d"} {
		noObject(t, s, "exports", o)
	}
	if n := pendingUploads(t, s); n != 0 {
		t.Errorf("%d uploads left pending", n)
	}
}

// TestStoreDiskFull exports more than the store's filesystem holds.
func TestStoreDiskFull(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small filesystem (%v: %s): disk-full is not tested", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	s := objectstoretest.StartIn(t, filepath.Join(dir, "data"))
	if err := s.Client().EnsureBucket(t.Context(), "exports"); err != nil {
		t.Fatal(err)
	}
	src := randomDisk(t, 40<<20)
	fast := transfer.RetryPolicy{Attempts: 2, Initial: 10 * time.Millisecond, Max: 20 * time.Millisecond}
	sink, err := NewMultipartSink(t.Context(), s.Client(), SinkOptions{Bucket: "exports", Object: "big.raw", PartSize: 5 << 20, Retry: fast})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Export(t.Context(), Options{Source: src, Format: FormatRaw, Sink: sink})
	if transfer.ReasonOf(err) != transfer.ReasonTargetError || transfer.IsTransient(err) || !strings.Contains(err.Error(), "InsufficientStorage") {
		t.Fatalf("a 40 MiB export into a 24 MiB store: %v (%s), want a permanent TargetError", err, transfer.ReasonOf(err))
	}
	noObject(t, s, "exports", "big.raw")
	if n := pendingUploads(t, s); n != 0 {
		t.Errorf("%d uploads left pending", n)
	}
}
