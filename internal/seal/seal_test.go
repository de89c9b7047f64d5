package seal

import (
	"bytes"
	"encoding/base64"
	"strings"
	"testing"
)

func TestSealOpen(t *testing.T) {
	k, err := Key(bytes.Repeat([]byte{7}, 32))
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Key(bytes.Repeat([]byte{7}, 32))
	if Public(k) != Public(again) {
		t.Fatal("the same secret derived two keys")
	}
	msg := []byte("https://store.example/exports/disk.qcow2?X-Amz-Signature=abc")
	ctx := []byte("vmve/vms/backup/u1")
	a, err := Seal(Public(k), msg, ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Seal(Public(k), msg, ctx)
	if a == b {
		t.Fatal("two sealings of one message are the same")
	}
	if strings.Contains(a, "X-Amz") {
		t.Fatal("the sealed text shows the message")
	}
	for _, s := range []string{a, b} {
		got, err := Open(k, s, ctx)
		if err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("Open = %q, %v", got, err)
		}
	}

	other, _ := Key(bytes.Repeat([]byte{8}, 32))
	if _, err := Open(other, a, ctx); err == nil {
		t.Fatal("another key opened it")
	}
	if _, err := Open(k, a, []byte("vmve/mallory/loot/u2")); err == nil {
		t.Fatal("it opened for another context")
	}
	raw, _ := base64.RawURLEncoding.DecodeString(a)
	raw[len(raw)-1] ^= 1
	if _, err := Open(k, base64.RawURLEncoding.EncodeToString(raw), ctx); err == nil {
		t.Fatal("an altered sealing opened")
	}
	for _, bad := range []string{"", "!!", base64.RawURLEncoding.EncodeToString([]byte("short"))} {
		if _, err := Open(k, bad, ctx); err == nil {
			t.Fatalf("Open(%q) opened", bad)
		}
	}
	if _, err := Seal("not a key", msg, ctx); err == nil {
		t.Fatal("sealed to a key that is not one")
	}
	if _, err := Key([]byte("short")); err == nil {
		t.Fatal("a short secret made a key")
	}
}
