// Package objectstoretest runs diskpipe's bundled object store as a real process for tests,
// the way net/http/httptest runs a server: built from cmd/objectstore, on a free loopback
// port, over a temporary data directory, restartable with its data kept.
package objectstoretest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/objectstore"
	"github.com/diskpipe/diskpipe/objectstore/tenancy"
	"github.com/diskpipe/diskpipe/test/freeport"
	"github.com/diskpipe/diskpipe/test/repo"
)

// Server is a running store.
type Server struct {
	// Endpoint is the store's URL, http://127.0.0.1:PORT.
	Endpoint string
	// AccessKey and SecretKey are its root credentials.
	AccessKey, SecretKey string
	// Dir is its data directory.
	Dir string
	// Namespaces stand in for a cluster's: Client resolves namespaces' UIDs from them.
	Namespaces *Namespaces

	t    testing.TB
	addr string
	cmd  *exec.Cmd
	log  string
	args []string
}

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// build compiles cmd/objectstore once per test process into bin/test/objectstore. Each
// process builds to a name of its own and renames it into place, so that packages tested at
// once never run a half-written binary, and nothing is left in the temporary directory.
func build() (string, error) {
	buildOnce.Do(func() {
		root := repo.Root()
		dir := filepath.Join(root, "bin", "test")
		if buildErr = os.MkdirAll(dir, 0o755); buildErr != nil {
			return
		}
		binary = filepath.Join(dir, "objectstore")
		tmp := fmt.Sprintf("%s.%d", binary, os.Getpid())
		cmd := exec.Command("go", "build", "-o", tmp, "./cmd/objectstore")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			_ = os.Remove(tmp)
			buildErr = fmt.Errorf("building cmd/objectstore: %w\n%s", err, out)
			return
		}
		buildErr = os.Rename(tmp, binary)
	})
	return binary, buildErr
}

// Start runs a store for the test, stopped when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartIn(t, filepath.Join(t.TempDir(), "data"))
}

// StartIn runs a store whose data lives in dir.
func StartIn(t testing.TB, dir string) *Server {
	t.Helper()
	return startIn(t, dir)
}

// StartWith runs a store for the test with more flags of cmd/objectstore (--quota-per-namespace).
func StartWith(t testing.TB, args ...string) *Server {
	t.Helper()
	return startIn(t, filepath.Join(t.TempDir(), "data"), args...)
}

func startIn(t testing.TB, dir string, args ...string) *Server {
	t.Helper()
	bin, err := build()
	if err != nil {
		t.Fatal(err)
	}
	addr, err := freeport.Addr("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{
		Endpoint: "http://" + addr, AccessKey: "diskpipe-test", SecretKey: "diskpipe-test-secret",
		Dir: dir, Namespaces: &Namespaces{}, t: t, addr: addr, log: filepath.Join(t.TempDir(), "objectstore.log"), args: args,
	}
	s.start(bin)
	t.Cleanup(s.Stop)
	return s
}

func (s *Server) start(bin string) {
	s.t.Helper()
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		s.t.Fatal(err)
	}
	s.cmd = exec.Command(bin, append([]string{"--data-dir", s.Dir, "--listen", s.addr}, s.args...)...) //nolint:gosec // the test's own store
	s.cmd.Env = append(os.Environ(), "DISKPIPE_S3_ACCESS_KEY="+s.AccessKey, "DISKPIPE_S3_SECRET_KEY="+s.SecretKey)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	logf.Close()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(s.Endpoint + objectstore.HealthPath) //nolint:gosec // loopback
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	b, _ := os.ReadFile(s.log)
	s.t.Fatalf("the object store did not become healthy:\n%s", b)
}

// Stop stops the store gracefully.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
	s.cmd = nil
}

// Kill stops the store at once, as a crash or a network cut would.
func (s *Server) Kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

// Restart stops the store and starts it again on the same address and data.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	bin, err := build()
	if err != nil {
		s.t.Fatal(err)
	}
	s.start(bin)
}

// Client returns a diskpipe client with the root credentials, which knows namespaces by
// s.Namespaces (a test of a cluster resolves them with tenancy.UIDs instead).
func (s *Server) Client() *objectstore.Client {
	s.t.Helper()
	c, err := objectstore.NewClient(s.ClientConfig())
	if err != nil {
		s.t.Fatal(err)
	}
	c.ResolveNamespaces(s.Namespaces.UID)
	return c
}

// ClientOf is Client for a test with a cluster: it knows namespaces by their UIDs in the
// cluster r reads, as the manager does.
func (s *Server) ClientOf(r client.Reader) *objectstore.Client {
	s.t.Helper()
	c := s.Client()
	c.ResolveNamespaces(tenancy.UIDs(r))
	return c
}

// Namespaces are namespaces without a cluster: each name has a UID from its first use until
// it is made again.
type Namespaces struct {
	mu   sync.Mutex
	uids map[string]string
}

// UID is namespace ns's UID; it is an objectstore.NamespaceUIDs.
func (n *Namespaces) UID(_ context.Context, ns string) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.uids == nil {
		n.uids = map[string]string{}
	}
	if n.uids[ns] == "" {
		n.uids[ns] = uuid.NewString()
	}
	return n.uids[ns], nil
}

// Delete deletes namespace ns: a later use of its name is another namespace.
func (n *Namespaces) Delete(ns string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.uids, ns)
}

// Live lists the namespaces, UID → name, as tenancy.Live does a cluster's.
func (n *Namespaces) Live(context.Context) (map[string]string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	live := map[string]string{}
	for ns, uid := range n.uids {
		live[uid] = ns
	}
	return live, nil
}

// ClientConfig is the configuration that reaches the store as root.
func (s *Server) ClientConfig() objectstore.ClientConfig {
	return objectstore.ClientConfig{Endpoint: s.Endpoint, AccessKey: s.AccessKey, SecretKey: s.SecretKey, BucketLookup: "Path", Scoped: true}
}

// AWS runs Debian's awscli (/usr/bin/aws, not a pip-installed one earlier on PATH) against the
// store and returns its combined output.
func (s *Server) AWS(ctx context.Context, secret string, args ...string) (string, error) {
	return s.AWSAs(ctx, s.AccessKey, secret, args...)
}

// AWSAs is AWS with another account's keys.
func (s *Server) AWSAs(ctx context.Context, access, secret string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "/usr/bin/aws", append([]string{"--endpoint-url", s.Endpoint, "--no-cli-pager"}, args...)...)
	cmd.Env = append(os.Environ(), "AWS_ACCESS_KEY_ID="+access, "AWS_SECRET_ACCESS_KEY="+secret,
		"AWS_DEFAULT_REGION=us-east-1", "AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// StartShared runs a store for a whole test binary, for a TestMain or a manager shared by its
// tests: it lives until stop is called. A failure to start panics.
func StartShared(dir string) (s *Server, stop func()) {
	tb := &processTB{dir: dir}
	s = StartIn(tb, filepath.Join(dir, "data"))
	return s, func() {
		for i := len(tb.cleanups) - 1; i >= 0; i-- {
			tb.cleanups[i]()
		}
	}
}

// processTB is the part of testing.TB a store uses, for one that outlives any test.
type processTB struct {
	testing.TB
	dir      string
	cleanups []func()
	n        int
}

func (p *processTB) Helper()                   {}
func (p *processTB) Cleanup(f func())          { p.cleanups = append(p.cleanups, f) }
func (p *processTB) Fatal(args ...any)         { panic(fmt.Sprint(args...)) }
func (p *processTB) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (p *processTB) TempDir() string {
	p.n++
	d := filepath.Join(p.dir, fmt.Sprintf("tmp%d", p.n))
	if err := os.MkdirAll(d, 0o755); err != nil {
		panic(err)
	}
	return d
}
