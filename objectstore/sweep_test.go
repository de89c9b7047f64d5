package objectstore_test

import (
	"context"
	"strings"
	"testing"

	"github.com/diskpipe/diskpipe/objectstore"
	"github.com/diskpipe/diskpipe/objectstore/objectstoretest"
)

// TestNamespaceMadeAgain: a namespace deleted and made again under its name is another tenant:
// it cannot reach the buckets of the one before. The sweep then removes the gone namespace's
// account where it owns nothing (dropping it from the policies that share with it, which stay
// editable) and disables it where it still owns buckets, whose objects stay; the keys of a
// gone namespace stop working either way.
func TestNamespaceMadeAgain(t *testing.T) {
	s := objectstoretest.Start(t)
	ctx := t.Context()
	root := s.Client()
	tenant := func(ns string) (access, secret string) {
		t.Helper()
		c, err := root.Tenant(ctx, ns)
		if err != nil {
			t.Fatal(err)
		}
		return c.Keys()
	}
	aws := func(keys [2]string, args ...string) (string, error) { return s.AWSAs(ctx, keys[0], keys[1], args...) }
	must := func(out string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	src, _ := randomFile(t, 4<<10)
	var old, idle, owner [2]string
	old[0], old[1] = tenant("reused")
	idle[0], idle[1] = tenant("idle")
	owner[0], owner[1] = tenant("owner")
	must(aws(old, "s3", "mb", "s3://reused-images"))
	must(aws(old, "s3", "cp", "--only-show-errors", src, "s3://reused-images/disk.raw"))
	// owner shares an object with idle, by idle's key.
	must(aws(owner, "s3", "mb", "s3://owner-images"))
	must(aws(owner, "s3", "cp", "--only-show-errors", src, "s3://owner-images/disk.raw"))
	must(aws(owner, "s3api", "put-bucket-policy", "--bucket", "owner-images", "--policy", `{"Version":"2012-10-17","Statement":[`+
		`{"Effect":"Allow","Principal":{"AWS":["`+owner[0]+`"]},"Action":["s3:*"],"Resource":["arn:aws:s3:::owner-images","arn:aws:s3:::owner-images/*"]},`+
		`{"Effect":"Allow","Principal":{"AWS":["`+idle[0]+`"]},"Action":["s3:GetObject"],"Resource":["arn:aws:s3:::owner-images/disk.raw"]}]}`))

	// A list of no namespaces is a wrong answer: nothing is touched.
	if done, err := root.SweepTenants(ctx, func(context.Context) (map[string]string, error) { return nil, nil }); err == nil || len(done.Removed) > 0 {
		t.Fatalf("a sweep with no namespaces listed: %+v, %v", done, err)
	}
	s.Namespaces.Delete("reused")
	s.Namespaces.Delete("idle")
	var again [2]string
	again[0], again[1] = tenant("reused")
	if again[0] == old[0] {
		t.Fatal("a namespace made again under a used name got the old one's account")
	}
	for _, args := range [][]string{{"s3", "ls", "s3://reused-images/"}, {"s3", "cp", "s3://reused-images/disk.raw", t.TempDir() + "/x"}} {
		if out, err := aws(again, args...); err == nil || !strings.Contains(out, "AccessDenied") && !strings.Contains(out, "403") {
			t.Errorf("the new namespace: aws %s: want AccessDenied (403), got %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	done, err := root.SweepTenants(ctx, s.Namespaces.Live)
	if err != nil {
		t.Fatal(err)
	}
	if len(done.Moved) != 0 || strings.Join(done.Removed, ",") != idle[0] || strings.Join(done.Disabled[old[0]], ",") != "reused-images" {
		t.Fatalf("sweep: %+v; want %s removed and %s disabled with reused-images", done, idle[0], old[0])
	}
	for name, keys := range map[string][2]string{"removed": idle, "disabled": old} {
		if out, err := aws(keys, "s3", "ls"); err == nil {
			t.Errorf("the keys of a gone namespace's %s account still work:\n%s", name, out)
		}
	}
	// What the gone namespace stored is kept, for an administrator.
	must(s.AWS(ctx, s.SecretKey, "s3", "cp", "--only-show-errors", "s3://reused-images/disk.raw", t.TempDir()+"/kept"))
	policy, err := root.GetBucketPolicy(ctx, "owner-images")
	if err != nil || strings.Contains(policy, idle[0]) || !strings.Contains(policy, owner[0]) {
		t.Errorf("owner's policy after the sweep (%v): want only owner's statement\n%s", err, policy)
	}
	// The policy stays the owner's to edit.
	must(aws(owner, "s3api", "put-bucket-policy", "--bucket", "owner-images", "--policy", `{"Version":"2012-10-17","Statement":[`+
		`{"Effect":"Allow","Principal":{"AWS":["`+owner[0]+`"]},"Action":["s3:*"],"Resource":["arn:aws:s3:::owner-images","arn:aws:s3:::owner-images/*"]},`+
		`{"Effect":"Allow","Principal":{"AWS":["`+again[0]+`"]},"Action":["s3:GetObject"],"Resource":["arn:aws:s3:::owner-images/disk.raw"]}]}`))
	must(aws(again, "s3", "cp", "--only-show-errors", "s3://owner-images/disk.raw", t.TempDir()+"/shared"))

	// A second sweep finds nothing more to do.
	if done, err := root.SweepTenants(ctx, s.Namespaces.Live); err != nil || len(done.Removed)+len(done.Moved) != 0 || len(done.Disabled) != 1 {
		t.Errorf("a second sweep: %+v, %v", done, err)
	}
}

// TestLegacyAccountMoves: the account a namespace had when accounts were named after
// namespaces is moved by the sweep to the one named after its UID: its buckets and what others
// shared with it follow, the Secret's old keys stop working.
func TestLegacyAccountMoves(t *testing.T) {
	s := objectstoretest.Start(t)
	ctx := t.Context()
	root := s.Client()
	must := func(out string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	legacy := [2]string{objectstore.LegacyTenantAccess("team-old"), "the-secret-before"}
	if err := root.CreateAccount(ctx, legacy[0], legacy[1], "userplus"); err != nil {
		t.Fatal(err)
	}
	src, _ := randomFile(t, 4<<10)
	as := func(keys [2]string, args ...string) (string, error) { return s.AWSAs(ctx, keys[0], keys[1], args...) }
	must(as(legacy, "s3", "mb", "s3://old-images"))
	must(as(legacy, "s3", "cp", "--only-show-errors", src, "s3://old-images/disk.raw"))
	owner, err := root.Tenant(ctx, "sharer")
	if err != nil {
		t.Fatal(err)
	}
	o := [2]string{}
	o[0], o[1] = owner.Keys()
	must(as(o, "s3", "mb", "s3://sharer-images"))
	must(as(o, "s3", "cp", "--only-show-errors", src, "s3://sharer-images/disk.raw"))
	must(as(o, "s3api", "put-bucket-policy", "--bucket", "sharer-images", "--policy", `{"Version":"2012-10-17","Statement":[`+
		`{"Effect":"Allow","Principal":{"AWS":["`+o[0]+`"]},"Action":["s3:*"],"Resource":["arn:aws:s3:::sharer-images","arn:aws:s3:::sharer-images/*"]},`+
		`{"Effect":"Allow","Principal":{"AWS":"`+legacy[0]+`"},"Action":"s3:GetObject","Resource":"arn:aws:s3:::sharer-images/disk.raw",`+
		`"Condition":{"IpAddress":{"aws:SourceIp":["127.0.0.0/8"]}}}]}`))
	if _, err := s.Namespaces.UID(ctx, "team-old"); err != nil {
		t.Fatal(err)
	}
	// Another namespace of before uses the store before any sweep: its buckets come with it.
	first := [2]string{objectstore.LegacyTenantAccess("team-first"), "its-secret-before"}
	if err := root.CreateAccount(ctx, first[0], first[1], "userplus"); err != nil {
		t.Fatal(err)
	}
	must(as(first, "s3", "mb", "s3://first-images"))
	firstTenant, err := root.Tenant(ctx, "team-first")
	if err != nil {
		t.Fatal(err)
	}
	f := [2]string{}
	f[0], f[1] = firstTenant.Keys()
	must(as(f, "s3", "ls", "s3://first-images"))

	done, err := root.SweepTenants(ctx, s.Namespaces.Live)
	if err != nil {
		t.Fatal(err)
	}
	tenant, err := root.Tenant(ctx, "team-old")
	if err != nil {
		t.Fatal(err)
	}
	now := [2]string{}
	now[0], now[1] = tenant.Keys()
	if done.Moved["team-old"] != now[0] || done.Moved["team-first"] != f[0] || len(done.Removed)+len(done.Disabled)+len(done.Stuck) != 0 {
		t.Fatalf("sweep: %+v; want team-old moved to %s and team-first to %s", done, now[0], f[0])
	}
	// The share names the new account, and keeps its condition.
	policy, err := root.GetBucketPolicy(ctx, "sharer-images")
	if err != nil || strings.Contains(policy, legacy[0]) || !strings.Contains(policy, now[0]) || !strings.Contains(policy, "127.0.0.0/8") {
		t.Errorf("the sharer's policy after the move (%v):\n%s", err, policy)
	}
	must(as(now, "s3", "cp", "--only-show-errors", "s3://old-images/disk.raw", t.TempDir()+"/own"))
	must(as(now, "s3", "cp", "--only-show-errors", src, "s3://old-images/more.raw"))
	must(as(now, "s3", "cp", "--only-show-errors", "s3://sharer-images/disk.raw", t.TempDir()+"/shared"))
	if out, err := as(legacy, "s3", "ls"); err == nil {
		t.Errorf("the old keys still work:\n%s", out)
	}
}
