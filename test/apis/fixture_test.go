package apis_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/diskpipe/diskpipe/test/testenv"
)

// fixture is a YAML file of test/fixtures: comment lines "# expect: accepted|rejected" and
// "# message: <text the error must contain>", then one or more documents. The documents are
// applied in order; all but the last must be accepted, the last is judged.
type fixture struct {
	name     string
	accept   bool
	messages []string
	docs     [][]byte
}

func loadFixtures(t *testing.T, dir string) []fixture {
	t.Helper()
	paths, err := filepath.Glob(testenv.Path("test", "fixtures", dir, "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no fixtures in test/fixtures/%s: %v", dir, err)
	}
	sort.Strings(paths)
	var out []fixture
	for _, p := range paths {
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		f := fixture{name: strings.TrimSuffix(filepath.Base(p), ".yaml")}
		expect := ""
		sc := bufio.NewScanner(bytes.NewReader(raw))
		for sc.Scan() {
			line := sc.Text()
			if v, ok := strings.CutPrefix(line, "# expect: "); ok {
				expect = v
			}
			if v, ok := strings.CutPrefix(line, "# message: "); ok {
				f.messages = append(f.messages, v)
			}
		}
		switch expect {
		case "accepted":
			f.accept = true
		case "rejected":
			if len(f.messages) == 0 {
				t.Fatalf("%s: a rejected fixture must name the message it expects", p)
			}
		default:
			t.Fatalf("%s: no '# expect: accepted|rejected' line", p)
		}
		for _, d := range bytes.Split(raw, []byte("\n---\n")) {
			if len(bytes.TrimSpace(d)) > 0 {
				f.docs = append(f.docs, d)
			}
		}
		out = append(out, f)
	}
	return out
}

// decode reads one YAML document into an object.
func decode(t *testing.T, doc []byte) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(doc, &u.Object); err != nil {
		t.Fatalf("decoding fixture: %v", err)
	}
	return u
}

// missingFrom returns the first path of want that got lacks or holds differently: what the
// apiserver pruned or changed. Fields got has beyond want (defaults) are fine.
func missingFrom(want, got any, path string) string {
	want, got = normalize(want), normalize(got)
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return path
		}
		for k, v := range w {
			if p := missingFrom(v, g[k], path+"."+k); p != "" {
				return p
			}
		}
		return ""
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return path
		}
		for i := range w {
			if p := missingFrom(w[i], g[i], fmt.Sprintf("%s[%d]", path, i)); p != "" {
				return p
			}
		}
		return ""
	default:
		if !reflect.DeepEqual(want, got) {
			return fmt.Sprintf("%s (want %v, got %v)", path, want, got)
		}
		return ""
	}
}

// normalize round-trips v through JSON so numbers compare alike whichever decoder made them.
func normalize(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		return v
	}
	return out
}
