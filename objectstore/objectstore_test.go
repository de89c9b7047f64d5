package objectstore_test

import (
	"bytes"
	"crypto/rand"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/minio/minio-go/v7"

	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore"
	"github.com/diskpipe/diskpipe/objectstore/objectstoretest"
)

func randomFile(t *testing.T, size int) (string, []byte) {
	t.Helper()
	b := make([]byte, size)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "payload")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p, b
}

func aws3(t *testing.T, s *objectstoretest.Server, args ...string) string {
	t.Helper()
	if args[0] == "cp" {
		args = append(args, "--only-show-errors")
	}
	out, err := s.AWS(t.Context(), s.SecretKey, append([]string{"s3"}, args...)...)
	if err != nil {
		t.Fatalf("aws s3 %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// TestAWSCLI is a user's session with Debian's awscli: make a bucket, upload a file larger
// than the multipart threshold, list it, download it; then the same object survives a
// restart of the store.
func TestAWSCLI(t *testing.T) {
	s := objectstoretest.Start(t)
	src, want := randomFile(t, 20<<20) // awscli uploads over 8 MiB in parts
	aws3(t, s, "mb", "s3://images")
	aws3(t, s, "cp", src, "s3://images/debian/disk.img")
	ls := aws3(t, s, "ls", "--recursive", "s3://images/")
	if !strings.Contains(ls, "20971520 debian/disk.img") {
		t.Errorf("aws s3 ls:\n%s", ls)
	}
	check := func() {
		t.Helper()
		dst := filepath.Join(t.TempDir(), "download")
		aws3(t, s, "cp", "s3://images/debian/disk.img", dst)
		got, _ := os.ReadFile(dst)
		if !bytes.Equal(got, want) {
			t.Fatalf("downloaded %d bytes differ from the uploaded %d", len(got), len(want))
		}
	}
	check()
	s.Restart()
	check()
}

// TestAWSSDK proves the store's S3 compatibility with a second, independent client: the
// official aws-sdk-go-v2.
func TestAWSSDK(t *testing.T) {
	s := objectstoretest.Start(t)
	ctx := t.Context()
	cfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion("us-east-1"),
		awsconfig.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, "")))
	if err != nil {
		t.Fatal(err)
	}
	c := s3.NewFromConfig(cfg, func(o *s3.Options) {
		o.BaseEndpoint, o.UsePathStyle = aws.String(s.Endpoint), true
		o.DisableLogOutputChecksumValidationSkipped = true
	})
	if _, err := c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String("sdk")}); err != nil {
		t.Fatal(err)
	}
	_, want := randomFile(t, 3<<20)
	if _, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("sdk"), Key: aws.String("a/b"), Body: bytes.NewReader(want)}); err != nil {
		t.Fatal(err)
	}
	out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("sdk"), Key: aws.String("a/b"), Range: aws.String("bytes=1000-1999")})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(out.Body)
	out.Body.Close()
	if !bytes.Equal(got, want[1000:2000]) {
		t.Error("ranged GET returned other bytes")
	}
	list, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("sdk")})
	if err != nil || len(list.Contents) != 1 || *list.Contents[0].Key != "a/b" || *list.Contents[0].Size != int64(len(want)) {
		t.Errorf("list: %v %+v", err, list)
	}
	// And what the SDK wrote, diskpipe's client reads.
	obj, err := s.Client().GetObject(ctx, "sdk", "a/b", minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err = io.ReadAll(obj)
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("minio-go read %d bytes (%v)", len(got), err)
	}
}

// TestBadRequests: wrong credentials, an invalid bucket name and a missing bucket each get a
// clear error, from awscli and from diskpipe's client.
func TestBadRequests(t *testing.T) {
	s := objectstoretest.Start(t)
	ctx := t.Context()
	aws3(t, s, "mb", "s3://images")

	out, err := s.AWS(ctx, "wrong-secret", "s3", "ls", "s3://images/")
	if err == nil || !strings.Contains(out, "SignatureDoesNotMatch") {
		t.Errorf("wrong key: %v\n%s", err, out)
	}
	bad := s.ClientConfig()
	bad.SecretKey = "wrong-secret"
	c, err := objectstore.NewClient(bad)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.StatObject(ctx, "images", "x", minio.StatObjectOptions{})
	err = objectstore.Classify(err, "reading s3://images/x")
	if transfer.ReasonOf(err) != transfer.ReasonSourceForbidden {
		t.Errorf("wrong key: %v, want SourceForbidden", err)
	}

	out, err = s.AWS(ctx, s.SecretKey, "s3", "mb", "s3://VmImage")
	if err == nil || !strings.Contains(out, "InvalidBucketName") {
		t.Errorf("VmImage: %v\n%s", err, out)
	}
	err = s.Client().EnsureBucket(ctx, "VmImage")
	if transfer.ReasonOf(err) != transfer.ReasonInvalidArgument || !strings.Contains(err.Error(), `bucket name "VmImage" is not valid`) {
		t.Errorf("VmImage: %v", err)
	}

	_, err = s.Client().StatObject(ctx, "missing", "x", minio.StatObjectOptions{})
	err = objectstore.Classify(err, "reading s3://missing/x")
	if transfer.ReasonOf(err) != transfer.ReasonSourceNotFound || !strings.Contains(err.Error(), `bucket "missing" does not exist`) {
		t.Errorf("missing bucket: %v", err)
	}
	if err := s.Client().EnsureBucket(ctx, "created-on-demand"); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Client().BucketExists(ctx, "created-on-demand"); !ok || err != nil {
		t.Errorf("EnsureBucket did not create the bucket: %v", err)
	}
}

// TestPresignedGet downloads an object with plain curl through a presigned URL, which stops
// working when it expires.
func TestPresignedGet(t *testing.T) {
	s := objectstoretest.Start(t)
	ctx := t.Context()
	c := s.Client()
	if err := c.EnsureBucket(ctx, "exports"); err != nil {
		t.Fatal(err)
	}
	_, want := randomFile(t, 5<<20)
	if _, err := c.PutObject(ctx, "exports", "disk.qcow2", bytes.NewReader(want), int64(len(want)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	u, err := c.PresignGet(ctx, "exports", "disk.qcow2", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	got, err := exec.CommandContext(ctx, "curl", "-sSf", u.String()).Output()
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("curl of the presigned URL: %v, %d bytes", err, len(got))
	}
	short, err := c.PresignGet(ctx, "exports", "disk.qcow2", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	code, _ := exec.CommandContext(ctx, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", short.String()).Output()
	if string(code) != "403" {
		t.Errorf("an expired URL answered %s, want 403", code)
	}
}
