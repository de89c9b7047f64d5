package objectstore_test

import (
	"strings"
	"testing"

	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore/objectstoretest"
)

// TestNamesTenantsCannotTake: a namespace cannot make a bucket under a name diskpipe keeps for
// itself (the upload proxy's), so it cannot be first to own the bucket every upload goes to;
// and a bucket of another account is found out by whoever checks its owner, as the upload
// proxy does for its own and an export for its target: a bucket a tenant made and shared with
// its victim is not the victim's to export into.
func TestNamesTenantsCannotTake(t *testing.T) {
	s := objectstoretest.Start(t)
	ctx := t.Context()
	root := s.Client()
	mallory, err := root.Tenant(ctx, "mallory")
	if err != nil {
		t.Fatal(err)
	}
	victim, err := root.Tenant(ctx, "victim")
	if err != nil {
		t.Fatal(err)
	}
	mAccess, mSecret := mallory.Keys()
	vAccess, _ := victim.Keys()
	asMallory := func(args ...string) (string, error) { return s.AWSAs(ctx, mAccess, mSecret, args...) }

	for _, bucket := range []string{"diskpipe-uploads", "diskpipe-anything"} {
		out, err := asMallory("s3", "mb", "s3://"+bucket)
		if err == nil || !strings.Contains(out, "AccessDenied") || !strings.Contains(out, `reserved for diskpipe`) {
			t.Errorf("a tenant made %s: %v\n%s", bucket, err, out)
		}
	}
	if err := root.EnsureBucket(ctx, "diskpipe-uploads"); err != nil {
		t.Fatalf("the root account makes diskpipe's own bucket: %v", err)
	}
	if err := root.CheckOwnBucket(ctx, "diskpipe-uploads", transfer.ReasonTargetForbidden); err != nil {
		t.Fatalf("diskpipe's own bucket: %v", err)
	}

	// A bucket of a common name, made first by mallory and shared with the victim.
	if out, err := asMallory("s3", "mb", "s3://exports"); err != nil {
		t.Fatal(err, out)
	}
	policy := `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":["` + vAccess +
		`"]},"Action":["s3:*"],"Resource":["arn:aws:s3:::exports","arn:aws:s3:::exports/*"]}]}`
	if out, err := asMallory("s3api", "put-bucket-policy", "--bucket", "exports", "--policy", policy); err != nil {
		t.Fatal(err, out)
	}
	if err := victim.EnsureBucket(ctx, "exports"); err != nil {
		t.Fatalf("the victim sees the shared bucket: %v", err)
	}
	err = victim.CheckOwnBucket(ctx, "exports", transfer.ReasonTargetForbidden)
	if transfer.ReasonOf(err) != transfer.ReasonTargetForbidden || !strings.Contains(err.Error(), "bucket exports belongs to another namespace ("+mAccess+
		"), not to namespace victim") {
		t.Errorf("the victim's check of a bucket mallory owns: %v", err)
	}
	if err := mallory.CheckOwnBucket(ctx, "exports", transfer.ReasonTargetForbidden); err != nil {
		t.Errorf("mallory's own bucket: %v", err)
	}
	if err := victim.CheckOwnBucket(ctx, "no-such-bucket", transfer.ReasonTargetForbidden); err != nil {
		t.Errorf("a bucket that does not exist yet: %v", err)
	}
	if owner, err := root.BucketOwner(ctx, "exports"); err != nil || owner != mAccess {
		t.Errorf("the owner of exports: %q, %v", owner, err)
	}

	// diskpipe's own bucket given to a tenant (as one made before names were reserved would
	// be): the upload proxy and the manager refuse it when they start, saying what to do. (A
	// client that found the bucket its own remembers that for a while: only the store's admin
	// can give a bucket away once made.)
	if err := root.ChangeBucketOwner(ctx, "diskpipe-uploads", mAccess); err != nil {
		t.Fatal(err)
	}
	err = s.Client().CheckOwnBucket(ctx, "diskpipe-uploads", transfer.ReasonSourceForbidden)
	if transfer.ReasonOf(err) != transfer.ReasonSourceForbidden || !strings.Contains(err.Error(), "not to the store's root account") ||
		!strings.Contains(err.Error(), "change-bucket-owner") {
		t.Errorf("diskpipe's bucket owned by a tenant: %v", err)
	}
}
