// Package testenv starts a real kube-apiserver and etcd (built from Go modules into bin/ by the
// Makefile) with diskpipe's CRDs installed from the Helm chart, for integration tests.
package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/diskpipe/diskpipe/controllers/manager"
)

// Env is a running control plane.
type Env struct {
	env *envtest.Environment
	// Config reaches the apiserver as an administrator.
	Config *rest.Config
	// Client is a direct (uncached) client with diskpipe's scheme; unknown fields are errors.
	Client client.Client
	// Kubeconfig is the path of a kubeconfig file for kubectl.
	Kubeconfig string
	dir        string
	onStop     []func()
}

// OnStop runs f before the control plane stops: for what runs against it for the whole test
// binary, such as a manager.
func (e *Env) OnStop(f func()) { e.onStop = append(e.onStop, f) }

// RepoRoot is the root of the diskpipe checkout.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Path joins elem to the repository root.
func Path(elem ...string) string {
	return filepath.Join(append([]string{RepoRoot()}, elem...)...)
}

// Start starts etcd and kube-apiserver and installs the CRDs of charts/diskpipe/crds and the
// VolumeSnapshot CRDs of test/crds/snapshot (generated from external-snapshotter's types).
func Start() (*Env, error) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		if err := os.Setenv("KUBEBUILDER_ASSETS", Path("bin")); err != nil {
			return nil, err
		}
	}
	for _, b := range []string{"kube-apiserver", "etcd", "kubectl"} {
		p := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), b)
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("%s is missing: run 'make tools' (or 'make test'), which builds it from Go modules: %w", p, err)
		}
	}
	snapshots := envtest.CRDInstallOptions{Paths: []string{Path("test", "crds", "snapshot")}, ErrorIfPathMissing: true}
	if err := envtest.ReadCRDFiles(&snapshots); err != nil {
		return nil, fmt.Errorf("reading the VolumeSnapshot CRDs: %w", err)
	}
	for _, crd := range snapshots.CRDs {
		// snapshot.storage.k8s.io is a protected group: the apiserver wants the approval the
		// upstream CRDs carry.
		metav1.SetMetaDataAnnotation(&crd.ObjectMeta, "api-approved.kubernetes.io", "https://github.com/kubernetes-csi/external-snapshotter/pull/814")
	}
	e := &envtest.Environment{
		CRDDirectoryPaths:     []string{Path("charts", "diskpipe", "crds")},
		CRDs:                  snapshots.CRDs,
		ErrorIfCRDPathMissing: true,
		Scheme:                manager.NewScheme(),
	}
	cfg, err := e.Start()
	if err != nil {
		return nil, fmt.Errorf("starting kube-apiserver and etcd: %w", err)
	}
	env := &Env{env: e, Config: cfg}
	stop := func(err error) (*Env, error) { return nil, errors.Join(err, env.Stop()) }

	if env.Client, err = client.New(cfg, client.Options{Scheme: e.Scheme, FieldValidation: metav1.FieldValidationStrict}); err != nil {
		return stop(fmt.Errorf("creating client: %w", err))
	}
	if env.dir, err = os.MkdirTemp("", "diskpipe-testenv-"); err != nil {
		return stop(err)
	}
	user, err := e.ControlPlane.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return stop(fmt.Errorf("adding kubectl user: %w", err))
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return stop(fmt.Errorf("writing kubeconfig: %w", err))
	}
	env.Kubeconfig = filepath.Join(env.dir, "kubeconfig")
	if err := os.WriteFile(env.Kubeconfig, kc, 0o600); err != nil {
		return stop(err)
	}
	return env, nil
}

// Stop stops the control plane and removes its files.
func (e *Env) Stop() error {
	for i := len(e.onStop) - 1; i >= 0; i-- {
		e.onStop[i]()
	}
	err := e.env.Stop()
	if e.dir != "" {
		err = errors.Join(err, os.RemoveAll(e.dir))
	}
	return err
}

// Kubectl runs bin/kubectl against the apiserver with stdin as its input, and returns its
// standard output and standard error.
func (e *Env) Kubectl(ctx context.Context, stdin []byte, args ...string) (stdout, stderr string, err error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl"),
		append([]string{"--kubeconfig", e.Kubeconfig}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(stdin), &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// CreateNamespace creates a namespace with a name generated from prefix and returns its name.
// Like kube-controller-manager, which envtest does not run, it gives the namespace its default
// ServiceAccount, without which the apiserver admits no pod.
func (e *Env) CreateNamespace(ctx context.Context, prefix string) (string, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"}}
	if err := e.Client.Create(ctx, ns); err != nil {
		return "", fmt.Errorf("creating namespace: %w", err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns.Name}}
	if err := e.Client.Create(ctx, sa); err != nil {
		return "", fmt.Errorf("creating the default service account: %w", err)
	}
	return ns.Name, nil
}

// EnsureNamespace creates the namespace name unless it exists.
func (e *Env) EnsureNamespace(ctx context.Context, name string) error {
	err := e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if client.IgnoreAlreadyExists(err) != nil {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}

// RunTests is a package's TestMain: it starts a control plane into *env, runs the tests, stops
// it, and exits.
func RunTests(m *testing.M, env **Env) {
	e, err := Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*env = e
	code := m.Run()
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	os.Exit(code)
}

// TempDir returns a new directory removed when the control plane stops, for what lives as
// long as it (a store shared by a binary's tests).
func (e *Env) TempDir() string {
	d, err := os.MkdirTemp("", "diskpipe-test-")
	if err != nil {
		panic(err)
	}
	e.OnStop(func() { _ = os.RemoveAll(d) })
	return d
}

// InstallWebhooks installs cfg with its services replaced by a local URL and a serving
// certificate made for the test, and returns where a manager must serve them.
func (e *Env) InstallWebhooks(cfg *admissionregistrationv1.ValidatingWebhookConfiguration) (host string, port int, certDir string, err error) {
	o := &envtest.WebhookInstallOptions{ValidatingWebhooks: []*admissionregistrationv1.ValidatingWebhookConfiguration{cfg}}
	if err := o.Install(e.Config); err != nil {
		return "", 0, "", fmt.Errorf("installing webhooks: %w", err)
	}
	e.OnStop(func() { _ = o.Cleanup() })
	return o.LocalServingHost, o.LocalServingPort, o.LocalServingCertDir, nil
}

// User returns a client authenticated as a new user of the given name and groups.
func (e *Env) User(name string, groups ...string) (client.Client, error) {
	u, err := e.env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return nil, err
	}
	return client.New(u.Config(), client.Options{Scheme: e.Client.Scheme()})
}
