// Package chart tests charts/diskpipe: helm lint and template with default and non-default
// values, every rendered object validated by the real apiserver (server-side dry-run), the
// values schema, RBAC proved with SubjectAccessReviews, restricted Pod Security, the webhook
// configuration against the manager's, and the alert rules evaluated by Prometheus's engine.
package chart

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/diskpipe/diskpipe/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.RunTests(m, &env) }

// valueSets are the values the chart is rendered with: its defaults and each file of testdata.
func valueSets(t *testing.T) map[string][]string {
	t.Helper()
	sets := map[string][]string{"default": nil}
	files, err := filepath.Glob(filepath.Join("testdata", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no values in testdata: %v", err)
	}
	for _, f := range files {
		sets[strings.TrimSuffix(filepath.Base(f), ".yaml")] = []string{"-f", f}
	}
	return sets
}

func render(t *testing.T, ns string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	objs, _, err := testenv.RenderChart(t.Context(), testenv.ChartRelease, ns, args...)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func toYAML(t *testing.T, objs ...*unstructured.Unstructured) []byte {
	t.Helper()
	var b strings.Builder
	for _, o := range objs {
		y, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	return []byte(b.String())
}

// find is the first object of kind.
func find(objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind {
			return o
		}
	}
	return nil
}

func kinds(objs []*unstructured.Unstructured) map[string]int {
	n := map[string]int{}
	for _, o := range objs {
		n[o.GetKind()]++
	}
	return n
}

func kubectl(ctx context.Context, t *testing.T, stdin []byte, args ...string) string {
	t.Helper()
	out, stderr, err := env.Kubectl(ctx, stdin, args...)
	if err != nil {
		t.Fatalf("kubectl %v: %v\n%s%s", args, err, out, stderr)
	}
	return out
}

func readFile(t *testing.T, elem ...string) []byte {
	t.Helper()
	b, err := os.ReadFile(testenv.Path(elem...))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
