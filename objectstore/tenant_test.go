package objectstore_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/minio/minio-go/v7"

	"github.com/diskpipe/diskpipe/objectstore"
	"github.com/diskpipe/diskpipe/objectstore/objectstoretest"
)

// TestTenants: with their namespaces' keys and awscli, tenant B cannot list, read, overwrite or
// delete tenant A's objects, nor change A's bucket policy, and sees only its own buckets; what
// diskpipe does as B (a read check, an export's grant) is refused with the reason; A can share
// one object with B by its bucket policy, and an exporter A grants writes its one object.
func TestTenants(t *testing.T) {
	s := objectstoretest.Start(t)
	ctx := t.Context()
	root := s.Client()
	a, err := root.Tenant(ctx, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := root.Tenant(ctx, "team-b")
	if err != nil {
		t.Fatal(err)
	}
	if again, err := root.Tenant(ctx, "team-a"); err != nil || fmt.Sprint(again.Keys()) != fmt.Sprint(a.Keys()) {
		t.Fatalf("the same namespace's account again: %v, keys changed %v", err, fmt.Sprint(again.Keys()) != fmt.Sprint(a.Keys()))
	}
	aAccess, aSecret := a.Keys()
	bAccess, bSecret := b.Keys()
	if aAccess == s.AccessKey || aSecret == s.SecretKey || aAccess == bAccess {
		t.Fatal("a tenant's keys are the root keys or another tenant's")
	}
	asA := func(args ...string) (string, error) { return s.AWSAs(ctx, aAccess, aSecret, args...) }
	asB := func(args ...string) (string, error) { return s.AWSAs(ctx, bAccess, bSecret, args...) }
	// Small enough that the store's refusal arrives before the request is sent whole (for a
	// larger one it closes the connection, and awscli reports that instead).
	src, _ := randomFile(t, 4<<10)
	for _, args := range [][]string{{"s3", "mb", "s3://team-a-images"}, {"s3", "cp", "--only-show-errors", src, "s3://team-a-images/disk.qcow2"}} {
		if out, err := asA(args...); err != nil {
			t.Fatalf("tenant A: aws %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if out, err := asB("s3", "mb", "s3://team-b-images"); err != nil {
		t.Fatalf("tenant B makes its own bucket: %v\n%s", err, out)
	}

	for _, c := range []struct {
		what string
		args []string
	}{
		{"list A's bucket", []string{"s3", "ls", "s3://team-a-images/"}},
		{"read A's object", []string{"s3", "cp", "s3://team-a-images/disk.qcow2", t.TempDir() + "/x"}},
		{"overwrite A's object", []string{"s3", "cp", src, "s3://team-a-images/disk.qcow2"}},
		{"write into A's bucket", []string{"s3", "cp", src, "s3://team-a-images/planted.qcow2"}},
		{"delete A's object", []string{"s3", "rm", "s3://team-a-images/disk.qcow2"}},
		{"delete A's bucket", []string{"s3", "rb", "s3://team-a-images"}},
		{"change A's bucket policy", []string{"s3api", "put-bucket-policy", "--bucket", "team-a-images", "--policy",
			`{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":["` + bAccess + `"]},"Action":["s3:*"],"Resource":["arn:aws:s3:::team-a-images/*"]}]}`}},
	} {
		out, err := asB(c.args...)
		if err == nil {
			t.Errorf("tenant B could %s:\n%s", c.what, out)
		} else if !strings.Contains(out, "AccessDenied") && !strings.Contains(out, "Forbidden") && !strings.Contains(out, "403") {
			t.Errorf("%s: refused, but not as access denied:\n%s", c.what, out)
		}
	}
	if out, err := asB("s3", "ls"); err != nil || strings.Contains(out, "team-a-images") || !strings.Contains(out, "team-b-images") {
		t.Errorf("tenant B's bucket list is not its own buckets: %v\n%s", err, out)
	}
	if out, err := asA("s3", "ls", "s3://team-a-images/"); err != nil || !strings.Contains(out, "disk.qcow2") {
		t.Errorf("tenant A's object is gone or changed: %v\n%s", err, out)
	}

	// What diskpipe does as B: the refusal names the namespace and the way to share.
	err = b.CheckRead(ctx, "team-a-images", "disk.qcow2")
	if err == nil || !strings.Contains(err.Error(), "namespace team-b may not read s3://team-a-images/disk.qcow2 in the bundled object store") ||
		!strings.Contains(err.Error(), bAccess) {
		t.Errorf("B's read check of A's object: %v", err)
	}
	if err := b.EnsureBucket(ctx, "team-a-images"); err == nil || !strings.Contains(err.Error(), "namespace team-b may not use bucket team-a-images") {
		t.Errorf("B's export into A's bucket: %v", err)
	}
	if _, _, err := b.Scope(ctx, "export-of-b", "team-a-images", "disk.qcow2", objectstore.ScopedActions); err == nil ||
		!strings.Contains(err.Error(), "namespace team-b may not read the policy of bucket team-a-images") {
		t.Errorf("B granting an exporter A's object: %v", err)
	}
	if err := a.CheckRead(ctx, "team-a-images", "disk.qcow2"); err != nil {
		t.Errorf("A's own object: %v", err)
	}

	// A shares one object with B, by B's access key in its bucket policy (with a statement
	// for itself: the store applies the policy to the owner too).
	if out, err := asA("s3api", "put-bucket-policy", "--bucket", "team-a-images", "--policy", `{"Version":"2012-10-17","Statement":[`+
		`{"Effect":"Allow","Principal":{"AWS":["`+aAccess+`"]},"Action":["s3:*"],"Resource":["arn:aws:s3:::team-a-images","arn:aws:s3:::team-a-images/*"]},`+
		`{"Effect":"Allow","Principal":{"AWS":["`+bAccess+`"]},"Action":["s3:GetObject"],"Resource":["arn:aws:s3:::team-a-images/disk.qcow2"]}]}`); err != nil {
		t.Fatalf("A shares an object: %v\n%s", err, out)
	}
	if err := a.CheckRead(ctx, "team-a-images", "disk.qcow2"); err != nil {
		t.Errorf("A's own object once it shares it: %v", err)
	}
	if err := b.CheckRead(ctx, "team-a-images", "disk.qcow2"); err != nil {
		t.Errorf("B reads what A shared: %v", err)
	}
	if out, err := asB("s3", "cp", src, "s3://team-a-images/disk.qcow2"); err == nil {
		t.Errorf("sharing for reading let B overwrite:\n%s", out)
	}

	// An exporter A grants writes its one object; A's own policy statement stays.
	access, secret, err := a.Scope(ctx, "export-of-a", "team-a-images", "vm/disk.qcow2", objectstore.ScopedActions)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := s.AWSAs(ctx, access, secret, "s3", "cp", "--only-show-errors", src, "s3://team-a-images/vm/disk.qcow2"); err != nil {
		t.Errorf("the exporter A granted: %v\n%s", err, out)
	}
	if err := b.CheckRead(ctx, "team-a-images", "disk.qcow2"); err != nil {
		t.Errorf("the share after A granted an exporter: %v", err)
	}
	if err := a.Unscope(ctx, "export-of-a", "team-a-images"); err != nil {
		t.Fatal(err)
	}
}

// TestTenantAfterRotation: an account whose secret no longer matches the one derived from the
// root secret (the root keys were rotated) is set right the next time a manager makes its
// tenant's client, and the keys work again.
func TestTenantAfterRotation(t *testing.T) {
	s := objectstoretest.Start(t)
	ctx := t.Context()
	if _, err := s.Client().Tenant(ctx, "rotated"); err != nil {
		t.Fatal(err)
	}
	uid, _ := s.Namespaces.UID(ctx, "rotated")
	if err := s.Client().SetAccountSecret(ctx, objectstore.TenantAccess(uid), "derived-from-the-old-root-secret", "userplus"); err != nil {
		t.Fatal(err)
	}
	tenant, err := s.Client().Tenant(ctx, "rotated") // a manager that starts again: nothing cached
	if err != nil {
		t.Fatal(err)
	}
	access, secret := tenant.Keys()
	if out, err := s.AWSAs(ctx, access, secret, "s3", "mb", "s3://rotated"); err != nil {
		t.Fatalf("the tenant's keys after the account was set right: %v\n%s", err, out)
	}
}

// TestQuota: with --quota-per-namespace a namespace's buckets hold at most that many bytes, in
// single PUTs and in parts: the write that would cross it is refused with QuotaExceeded,
// naming the quota, and so is a copy (CopyObject, UploadPartCopy); deleting frees room; another namespace and the root account have their
// own room.
func TestQuota(t *testing.T) {
	s := objectstoretest.StartWith(t, "--quota-per-namespace", "1Mi")
	ctx := t.Context()
	aAccess, aSecret := tenantKeys(t, s, "quota-a")
	bAccess, bSecret := tenantKeys(t, s, "quota-b")
	asA := func(args ...string) (string, error) { return s.AWSAs(ctx, aAccess, aSecret, args...) }
	small, _ := randomFile(t, 600<<10)
	for _, args := range [][]string{{"s3", "mb", "s3://quota-a"}, {"s3", "mb", "s3://quota-a2"}, {"s3", "cp", "--only-show-errors", small, "s3://quota-a/one"}} {
		if out, err := asA(args...); err != nil {
			t.Fatalf("aws %v: %v\n%s", args, err, out)
		}
	}
	// 600 KiB more, in another bucket of the same namespace: over 1 MiB.
	out, err := asA("s3api", "put-object", "--bucket", "quota-a2", "--key", "two", "--body", small)
	if err == nil || !strings.Contains(out, "QuotaExceeded") || !strings.Contains(out, "1048576 bytes") {
		t.Errorf("a PUT over the quota: %v\n%s", err, out)
	}
	// A copy of what the namespace holds writes as many bytes: server-side, in one request or
	// in parts of a multipart upload. (The store's backend also refuses copies of sources over
	// its copy threshold, 0 bytes as configured: the quota's word comes first, and holds
	// whatever that threshold becomes.)
	if out, err := asA("s3api", "copy-object", "--bucket", "quota-a2", "--key", "copy", "--copy-source", "quota-a/one"); err == nil ||
		!strings.Contains(out, "QuotaExceeded") {
		t.Errorf("a copy over the quota: %v\n%s", err, out)
	}
	out, err = asA("s3api", "create-multipart-upload", "--bucket", "quota-a2", "--key", "parts", "--query", "UploadId", "--output", "text")
	if err != nil {
		t.Fatal(err, out)
	}
	if out, err := asA("s3api", "upload-part-copy", "--bucket", "quota-a2", "--key", "parts", "--upload-id", strings.TrimSpace(out),
		"--part-number", "1", "--copy-source", "quota-a/one"); err == nil || !strings.Contains(out, "QuotaExceeded") {
		t.Errorf("a part copied over the quota: %v\n%s", err, out)
	}
	big, _ := randomFile(t, 9<<20) // awscli sends it in parts
	if out, err := asA("s3", "cp", "--only-show-errors", big, "s3://quota-a/big"); err == nil {
		t.Errorf("an upload in parts over the quota:\n%s", out)
	}
	// Another namespace, and the root account, are not held by A's use.
	if out, err := s.AWSAs(ctx, bAccess, bSecret, "s3", "mb", "s3://quota-b"); err != nil {
		t.Fatal(err, out)
	}
	if out, err := s.AWSAs(ctx, bAccess, bSecret, "s3", "cp", "--only-show-errors", small, "s3://quota-b/one"); err != nil {
		t.Errorf("namespace B within its own quota: %v\n%s", err, out)
	}
	if out, err := s.AWS(ctx, s.SecretKey, "s3", "mb", "s3://root-bucket"); err != nil {
		t.Fatal(err, out)
	}
	if out, err := s.AWS(ctx, s.SecretKey, "s3", "cp", "--only-show-errors", big, "s3://root-bucket/big"); err != nil {
		t.Errorf("the root account has no quota: %v\n%s", err, out)
	}
	// Deleting frees room.
	if out, err := asA("s3", "rm", "s3://quota-a/one"); err != nil {
		t.Fatal(err, out)
	}
	if out, err := asA("s3api", "put-object", "--bucket", "quota-a2", "--key", "two", "--body", small); err != nil {
		t.Errorf("a PUT after room was freed: %v\n%s", err, out)
	}
}

// TestQuotaUnknownLength: a write that does not say how long it is (chunked transfer encoding,
// no Content-Length) cannot slip past the quota, which counts a write by its stated length,
// whether a PUT or an uploaded part; the bucket holds nothing of it. (The store's HTTP server
// refuses such a body before the quota sees it: 400 BadRequest.)
func TestQuotaUnknownLength(t *testing.T) {
	s := objectstoretest.StartWith(t, "--quota-per-namespace", "1Mi")
	ctx := t.Context()
	access, secret := tenantKeys(t, s, "quota-c")
	if out, err := s.AWSAs(ctx, access, secret, "s3", "mb", "s3://quota-c"); err != nil {
		t.Fatal(err, out)
	}
	upload, err := s.AWSAs(ctx, access, secret, "s3api", "create-multipart-upload", "--bucket", "quota-c", "--key", "parts", "--query", "UploadId", "--output", "text")
	if err != nil {
		t.Fatal(err, upload)
	}
	for _, path := range []string{"/quota-c/unsized", "/quota-c/parts?partNumber=1&uploadId=" + url.QueryEscape(strings.TrimSpace(upload))} {
		// 3 MiB, three times the quota, of a length only the end of the stream tells.
		body := struct{ io.Reader }{io.LimitReader(zeros{}, 3<<20)}
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, s.Endpoint+path, body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Amz-Content-Sha256", "UNSIGNED-PAYLOAD")
		if err := v4.NewSigner().SignHTTP(ctx, aws.Credentials{AccessKeyID: access, SecretAccessKey: secret}, req, "UNSIGNED-PAYLOAD", "s3", "us-east-1", time.Now()); err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			continue // the store closed the connection on the refused body: refused too
		}
		said, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Errorf("PUT %s of unknown length: %s, want a refusal\n%s", path, resp.Status, said)
		}
	}
	out, err := s.AWSAs(ctx, access, secret, "s3api", "list-objects-v2", "--bucket", "quota-c", "--query", "length(Contents || `[]`)")
	if err != nil || strings.TrimSpace(out) != "0" {
		t.Errorf("the bucket after the refused writes holds %s objects (%v), want 0", out, err)
	}
	out, err = s.AWSAs(ctx, access, secret, "s3api", "list-parts", "--bucket", "quota-c", "--key", "parts", "--upload-id", strings.TrimSpace(upload), "--query", "length(Parts || `[]`)")
	if err != nil || strings.TrimSpace(out) != "0" {
		t.Errorf("the upload after the refused part holds %s parts (%v), want 0", out, err)
	}
}

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// tenantKeys are namespace ns's keys in the store s, its account made.
func tenantKeys(t *testing.T, s *objectstoretest.Server, ns string) (access, secret string) {
	t.Helper()
	tenant, err := s.Client().Tenant(t.Context(), ns)
	if err != nil {
		t.Fatal(err)
	}
	return tenant.Keys()
}

// TestQuotaInFlight: writes of one namespace in flight together count against its quota:
// two of 600 KiB sent at once do not both pass 1 MiB.
func TestQuotaInFlight(t *testing.T) {
	s := objectstoretest.StartWith(t, "--quota-per-namespace", "1Mi")
	ctx := t.Context()
	tenant, err := s.Client().Tenant(ctx, "quota-f")
	if err != nil {
		t.Fatal(err)
	}
	if err := tenant.MakeBucket(ctx, "quota-f", minio.MakeBucketOptions{}); err != nil {
		t.Fatal(err)
	}
	// The first is sent through a socket whose send buffer is small (4 KiB, which also stops
	// the kernel from growing it): what it has written past the store's receive window has
	// been read by the store's handler, which has then reserved the first's size.
	small := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) { err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4<<10) }); cerr != nil {
			return cerr
		}
		return err
	}}).DialContext}}
	put := func(client *http.Client, key string, body io.Reader) (int, string) {
		u, err := tenant.PresignedPutObject(ctx, "quota-f", key, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, u.String(), body)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = 600 << 10
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	r, w := io.Pipe()
	first := make(chan int, 1)
	go func() { code, _ := put(small, "first", r); first <- code }()
	// 500 KiB of the first's body: more than the socket's buffers hold (a store that reads
	// nothing offers a window of some 64 KiB to 256 KiB), so its handler has started. (With
	// the default buffers, which grow to megabytes, a loaded machine once took the second
	// first.)
	if _, err := w.Write(make([]byte, 500<<10)); err != nil {
		t.Fatal(err)
	}
	code, msg := put(http.DefaultClient, "second", bytes.NewReader(make([]byte, 600<<10)))
	if code != http.StatusForbidden || !strings.Contains(msg, "QuotaExceeded") || !strings.Contains(msg, "614400 more are being written") {
		t.Errorf("a second write beside the first: %d %s", code, msg)
	}
	if _, err := w.Write(make([]byte, 100<<10)); err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	if code := <-first; code != http.StatusOK {
		t.Errorf("the first write: %d", code)
	}
}

// TestBucketsAndObjectsBounded: a namespace owns as many buckets, and stores as many files,
// as the store lets one; more are refused, saying so. Root's are not bounded.
func TestBucketsAndObjectsBounded(t *testing.T) {
	s := objectstoretest.StartWith(t, "--max-buckets-per-namespace=2", "--max-objects-per-namespace=3")
	ctx := t.Context()
	access, secret := tenantKeys(t, s, "bounded")
	as := func(args ...string) (string, error) { return s.AWSAs(ctx, access, secret, args...) }
	for _, b := range []string{"bounded-1", "bounded-2"} {
		if out, err := as("s3", "mb", "s3://"+b); err != nil {
			t.Fatal(err, out)
		}
	}
	if out, err := as("s3", "mb", "s3://bounded-3"); err == nil || !strings.Contains(out, "TooManyBuckets") || !strings.Contains(out, "owns 2 buckets") {
		t.Errorf("a third bucket: %v\n%s", err, out)
	}
	tenant, err := s.Client().Tenant(ctx, "bounded")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		_, err := tenant.PutObject(ctx, fmt.Sprintf("bounded-%d", i%2+1), fmt.Sprintf("o%d", i), bytes.NewReader(nil), 0, minio.PutObjectOptions{})
		switch {
		case i < 3 && err != nil:
			t.Fatalf("object %d: %v", i, err)
		case i == 3 && (minio.ToErrorResponse(err).Code != "QuotaExceeded" || !strings.Contains(err.Error(), "stores 3 files")):
			t.Errorf("a fourth object: %v", err)
		}
	}
	root := s.Client()
	for _, b := range []string{"root-1", "root-2", "root-3"} {
		if err := root.MakeBucket(ctx, b, minio.MakeBucketOptions{}); err != nil {
			t.Errorf("root's bucket %s: %v", b, err)
		}
	}
}
