package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Helm runs bin/helm (built from its Go module by `make tools`) and returns its standard
// output; a failure's error carries helm's standard error.
func Helm(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	bin := Path("bin", "helm")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%s is missing: run 'make tools' (or 'make test'): %w", bin, err)
	}
	cmd := exec.CommandContext(ctx, bin, args...) //nolint:gosec // the pinned helm
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(os.TempDir(), "diskpipe-helm"),
		"HELM_CONFIG_HOME="+filepath.Join(os.TempDir(), "diskpipe-helm"), "HELM_DATA_HOME="+filepath.Join(os.TempDir(), "diskpipe-helm"))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("helm %v: %w: %s", args, err, errb.String())
	}
	return out.Bytes(), nil
}

// ChartPath is the chart's directory.
func ChartPath() string { return Path("charts", "diskpipe") }

// RenderChart renders the chart with `helm template` as release in namespace; args add
// values (-f, --set) or select templates (--show-only).
func RenderChart(ctx context.Context, release, namespace string, args ...string) ([]*unstructured.Unstructured, []byte, error) {
	out, err := Helm(ctx, append([]string{"template", release, ChartPath(), "--namespace", namespace}, args...)...)
	if err != nil {
		return nil, nil, err
	}
	objs, err := SplitYAML(out)
	return objs, out, err
}

// SplitYAML decodes a multi-document YAML stream, skipping empty documents.
func SplitYAML(data []byte) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("decoding the rendered chart: %w", err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// ChartRelease is the release name under which tests install the chart's RBAC: its objects
// are then named like a default install's (diskpipe-manager, diskpipe-importer, ...).
const ChartRelease = "diskpipe"

// ThickOverhead is the chart value both test clusters install with: their StorageClass
// "thick" keeps 20 % of a filesystem volume for the filesystem (test/e2e/knobs_test.go).
const ThickOverhead = "filesystemOverhead.storageClasses.thick=0.2"

// ApplyChartRBAC applies the chart's service accounts, roles and bindings, rendered for a
// release in namespace, and returns the manager's user name: a process acting as that user
// has exactly the rights an installed manager has. Each of set is a chart value (--set).
func (e *Env) ApplyChartRBAC(ctx context.Context, namespace string, set ...string) (string, error) {
	if err := e.EnsureNamespace(ctx, namespace); err != nil {
		return "", err
	}
	args := []string{"--show-only", "templates/serviceaccounts.yaml",
		"--show-only", "templates/rbac/role.yaml", "--show-only", "templates/rbac/bindings.yaml", "--show-only", "templates/rbac/users.yaml"}
	for _, v := range set {
		args = append(args, "--set", v)
	}
	_, out, err := RenderChart(ctx, ChartRelease, namespace, args...)
	if err != nil {
		return "", err
	}
	if stdout, stderr, err := e.Kubectl(ctx, out, "apply", "--server-side", "--field-manager=helm", "-f", "-"); err != nil {
		return "", fmt.Errorf("applying the chart's RBAC: %w: %s%s", err, stdout, stderr)
	}
	return "system:serviceaccount:" + namespace + ":" + ChartRelease + "-manager", nil
}
