package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestCallerClient: the caller's client sends every request as the caller of its context
// (user, UID, groups, extra), never a request without one, and never one that impersonates
// already. One step, against a plain HTTP server that records what it was sent.
func TestCallerClient(t *testing.T) {
	var mu sync.Mutex
	var seen []http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"NamespaceList","apiVersion":"v1","items":[]}`))
	}))
	defer srv.Close()
	c, err := callerClient(&rest.Config{Host: srv.URL, BearerToken: "the-gateways-own"}, client.Options{Scheme: clientgoscheme.Scheme, Mapper: mapper()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.List(t.Context(), &corev1.NamespaceList{}); err == nil || !strings.Contains(err.Error(), "acts for no caller") {
		t.Fatalf("a request with no caller: %v", err)
	}
	if len(seen) != 0 {
		t.Fatalf("a request with no caller reached the apiserver: %v", seen)
	}
	ctx := withCaller(context.Background(), authenticationv1.UserInfo{Username: "alice", UID: "u-1", Groups: []string{"dev", "system:authenticated"},
		Extra: map[string]authenticationv1.ExtraValue{"scopes.example.com/scope": {"read-only"}}})
	if err := c.List(ctx, &corev1.NamespaceList{}); err != nil {
		t.Fatal(err)
	}
	h := seen[0]
	if h.Get("Impersonate-User") != "alice" || h.Get("Impersonate-Uid") != "u-1" || strings.Join(h.Values("Impersonate-Group"), ",") != "dev,system:authenticated" ||
		h.Get("Impersonate-Extra-Scopes.example.com%2fscope") != "read-only" || h.Get("Authorization") != "Bearer the-gateways-own" {
		t.Errorf("headers sent: %v", h)
	}
	if _, err := callerClient(&rest.Config{Host: srv.URL, Impersonate: rest.ImpersonationConfig{UserName: "root"}}, client.Options{}); err == nil {
		t.Error("a configuration that impersonates already is taken")
	}
}
