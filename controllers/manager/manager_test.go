package manager_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/manager"
	"github.com/diskpipe/diskpipe/test/freeport"
	"github.com/diskpipe/diskpipe/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.RunTests(m, &env) }

func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := freeport.Addr("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func get(url string) (int, string, error) {
	resp, err := http.Get(url) //nolint:gosec // a test URL on loopback
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestManagerStarts runs the manager against the real apiserver: its probes answer, its
// metrics are served, and it takes the leader Lease, which it gives up when stopped.
func TestManagerStarts(t *testing.T) {
	g := NewWithT(t)
	opts := manager.Options{MetricsAddr: freeAddr(t), ProbeAddr: freeAddr(t), LeaderElection: true, LeaderElectionNamespace: "default",
		OwnerKeySecret: types.NamespacedName{Namespace: "default", Name: "diskpipe-owner-key"}}
	mgr, err := manager.New(env.Config, opts)
	g.Expect(err).NotTo(HaveOccurred())
	// The key children are marked with was made, and is read again, not replaced, by the next start.
	ownerKey := &corev1.Secret{}
	g.Expect(env.Client.Get(t.Context(), opts.OwnerKeySecret, ownerKey)).To(Succeed())
	g.Expect(ownerKey.Data["key"]).To(HaveLen(32))
	g.Expect(owned.LoadKey(t.Context(), env.Client, opts.OwnerKeySecret)).To(Succeed())
	again := &corev1.Secret{}
	g.Expect(env.Client.Get(t.Context(), opts.OwnerKeySecret, again)).To(Succeed())
	g.Expect(again.Data).To(Equal(ownerKey.Data))

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()

	for _, path := range []string{"/healthz", "/readyz"} {
		g.Eventually(func() (int, error) {
			code, _, err := get("http://" + opts.ProbeAddr + path)
			return code, err
		}, 30*time.Second, 100*time.Millisecond).Should(Equal(http.StatusOK), path)
	}
	g.Eventually(func() (string, error) {
		_, body, err := get("http://" + opts.MetricsAddr + "/metrics")
		return body, err
	}, 30*time.Second, 100*time.Millisecond).Should(ContainSubstring("controller_runtime_"))

	lease := &coordinationv1.Lease{}
	key := client.ObjectKey{Namespace: "default", Name: manager.LeaderElectionID}
	g.Eventually(func() (string, error) {
		if err := env.Client.Get(ctx, key, lease); err != nil {
			return "", err
		}
		return *lease.Spec.HolderIdentity, nil
	}, 30*time.Second, 100*time.Millisecond).ShouldNot(BeEmpty())

	cancel()
	g.Eventually(done, 30*time.Second).Should(Receive(BeNil()))
	g.Expect(env.Client.Get(t.Context(), key, lease)).To(Succeed())
	g.Expect(lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" ||
		strings.TrimSpace(*lease.Spec.HolderIdentity) == "").To(BeTrue(), "the lease was released on stop")
}
