package objectstore_test

import (
	"strings"
	"testing"

	"github.com/diskpipe/diskpipe/objectstore"
	"github.com/diskpipe/diskpipe/objectstore/objectstoretest"
)

// TestScopedCredentials: an export's keys, used with awscli, upload its one object (in parts)
// and nothing else — no listing, no other object read or written, no bucket made, no root
// keys — and stop working once the export's account is removed; a second export's grant in
// the same bucket leaves the first's alone.
func TestScopedCredentials(t *testing.T) {
	s := objectstoretest.Start(t)
	ctx := t.Context()
	root := s.Client()
	aws3(t, s, "mb", "s3://exports")
	src, _ := randomFile(t, 12<<20) // over awscli's 8 MiB multipart threshold
	aws3(t, s, "cp", src, "s3://exports/other/secret.img")

	access, secret, err := root.Scope(ctx, "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "exports", "vm/disk.qcow2", objectstore.ScopedActions)
	if err != nil {
		t.Fatal(err)
	}
	again, secret2, err := root.Scope(ctx, "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "exports", "vm/disk.qcow2", objectstore.ScopedActions)
	if err != nil || again != access || secret2 != secret {
		t.Fatalf("scoping the same export again: %v, keys changed %v", err, again != access || secret2 != secret)
	}
	if access == s.AccessKey || secret == s.SecretKey {
		t.Fatal("the scoped keys are the root keys")
	}
	_, _, err = root.Scope(ctx, "second-export", "exports", "vm/other.qcow2", objectstore.ScopedActions)
	if err != nil {
		t.Fatal(err)
	}
	as := func(args ...string) (string, error) {
		return s.AWSAs(ctx, access, secret, append([]string{"s3"}, args...)...)
	}

	if out, err := as("cp", "--only-show-errors", src, "s3://exports/vm/disk.qcow2"); err != nil {
		t.Fatalf("the export's own object, in parts: %v\n%s", err, out)
	}
	tag := []string{"put-object-tagging", "--bucket", "exports", "--tagging", "TagSet=[{Key=sha256,Value=0123}]", "--key"}
	if out, err := s.AWSAs(ctx, access, secret, append(append([]string{"s3api"}, tag...), "vm/disk.qcow2")...); err != nil {
		t.Errorf("tagging its own object (the exporter's sha256 tag): %v\n%s", err, out)
	}
	if out, err := s.AWSAs(ctx, access, secret, append(append([]string{"s3api"}, tag...), "other/secret.img")...); err == nil {
		t.Errorf("the scoped keys tagged another object:\n%s", out)
	}
	for _, c := range []struct {
		what string
		args []string
	}{
		{"list the bucket", []string{"ls", "s3://exports/"}},
		{"read another object", []string{"cp", "s3://exports/other/secret.img", t.TempDir() + "/x"}},
		{"read its own object back", []string{"cp", "s3://exports/vm/disk.qcow2", t.TempDir() + "/y"}},
		{"write another object", []string{"cp", src, "s3://exports/vm/disk2.qcow2"}},
		{"overwrite another object", []string{"cp", src, "s3://exports/other/secret.img"}},
		{"delete another object", []string{"rm", "s3://exports/other/secret.img"}},
		{"make a bucket", []string{"mb", "s3://mine"}},
	} {
		out, err := as(c.args...)
		if err == nil {
			t.Errorf("the scoped keys could %s:\n%s", c.what, out)
		} else if !strings.Contains(out, "AccessDenied") && !strings.Contains(out, "Forbidden") && !strings.Contains(out, "403") {
			t.Errorf("%s: refused, but not as access denied:\n%s", c.what, out)
		}
	}

	if out, err := as("ls"); err != nil || strings.Contains(out, "exports") {
		t.Errorf("listing the buckets shows more than the account's own (none): %v\n%s", err, out)
	}

	if err := root.Unscope(ctx, "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "exports"); err != nil {
		t.Fatal(err)
	}
	if err := root.Unscope(ctx, "1b4e28ba-2fa1-11d2-883f-0016d3cca427", "exports"); err != nil {
		t.Fatalf("removing it twice: %v", err)
	}
	if out, err := as("cp", "--only-show-errors", src, "s3://exports/vm/disk.qcow2"); err == nil || !strings.Contains(out, "InvalidAccessKeyId") {
		t.Errorf("the keys of a removed account still work, or fail for another reason (%v):\n%s", err, out)
	}
	policy := aws3api(t, s, "get-bucket-policy", "--bucket", "exports")
	if strings.Contains(policy, objectstore.ScopedAccess("1b4e28ba-2fa1-11d2-883f-0016d3cca427")) || !strings.Contains(policy, objectstore.ScopedAccess("second-export")) {
		t.Errorf("the bucket policy after removing the first grant:\n%s", policy)
	}
	if left, err := root.ScopedAccounts(ctx); err != nil || len(left) != 1 || left[0] != objectstore.ScopedAccess("second-export") {
		t.Errorf("accounts left: %v %v, want the second export's", left, err)
	}
	if err := root.Unscope(ctx, "second-export", "exports"); err != nil {
		t.Fatal(err)
	}
	if left, err := root.ScopedAccounts(ctx); err != nil || len(left) != 0 {
		t.Errorf("accounts left after removing both: %v %v", left, err)
	}
	if out, err := s.AWS(ctx, s.SecretKey, "s3api", "get-bucket-policy", "--bucket", "exports"); err == nil {
		t.Errorf("a policy is left after every grant was removed:\n%s", out)
	}
}

func aws3api(t *testing.T, s *objectstoretest.Server, args ...string) string {
	t.Helper()
	out, err := s.AWS(t.Context(), s.SecretKey, append([]string{"s3api"}, args...)...)
	if err != nil {
		t.Fatalf("aws s3api %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}
