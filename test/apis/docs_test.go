package apis_test

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	upload "github.com/diskpipe/diskpipe/apis/upload/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/manager"
	"github.com/diskpipe/diskpipe/test/testenv"
)

var scheme = manager.NewScheme()

// TestDocsExamples applies every YAML example of README.md and docs/*.md with kubectl
// (server-side dry run), so that a field renamed or a rule added breaks the docs' build, not
// a reader's manifest.
func TestDocsExamples(t *testing.T) {
	pages, _ := filepath.Glob(testenv.Path("docs", "*.md"))
	pages = append(pages, testenv.Path("README.md"))
	block := regexp.MustCompile("(?ms)^```yaml\n(.*?)^```")
	heredoc := regexp.MustCompile("(?ms)<<'EOF'\n(.*?)^EOF")
	n := 0
	for _, p := range pages {
		text, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var docs [][]byte
		for _, m := range block.FindAllSubmatch(text, -1) {
			docs = append(docs, m[1])
		}
		for _, m := range heredoc.FindAllSubmatch(text, -1) { // the README's kubectl apply -f - <<'EOF'
			docs = append(docs, m[1])
		}
		for i, doc := range docs {
			if !bytes.Contains(doc, []byte("apiVersion:")) {
				continue // a fragment (values, a spec excerpt)
			}
			n++
			_, kind, _ := strings.Cut(string(doc), "kind:")
			name := filepath.Base(p) + "#" + strings.TrimSpace(strings.SplitN(kind, "\n", 2)[0])
			t.Run(name, func(t *testing.T) {
				if bytes.Contains(doc, []byte("apiVersion: "+upload.GroupVersion.String())) {
					// Served by the manager's aggregated API, not this apiserver: checked against
					// the Go types, strictly.
					typed, err := scheme.New(upload.GroupVersion.WithKind(strings.TrimSpace(strings.SplitN(kind, "\n", 2)[0])))
					if err == nil {
						err = yaml.UnmarshalStrict(doc, typed)
					}
					if err != nil {
						t.Errorf("example %d of %s is not a valid %s request: %v\n%s", i, p, upload.GroupVersion, err, doc)
					}
					return
				}
				obj := decode(t, doc)
				ns := namespaceFor(t, obj)
				if _, stderr, err := env.Kubectl(t.Context(), doc, "apply", "--dry-run=server", "--namespace", ns, "-f", "-"); err != nil {
					t.Errorf("example %d of %s is refused: %s\n%s", i, p, stderr, doc)
				}
			})
		}
	}
	if n < 8 {
		t.Fatalf("found only %d examples in the docs", n)
	}
}
