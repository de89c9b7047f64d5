package policy_test

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	cdipolicy "github.com/diskpipe/diskpipe/controllers/cdi/policy"
	"github.com/diskpipe/diskpipe/test/testenv"
)

// TestDocsTables keeps docs/cdi.md's two tables true: each part of a DataVolume that the
// policy refuses is a row of "Refused with", and no row names what it does not refuse; and
// every source of CDI's API (each field of DataVolumeSource, from the module) is either a row
// of the served sources or refused, so that a source a newer CDI adds is decided and written
// down, not silently dropped.
func TestDocsTables(t *testing.T) {
	b, err := os.ReadFile(testenv.Path("docs", "cdi.md"))
	if err != nil {
		t.Fatal(err)
	}
	// rows are the first cells of the table whose header is head.
	rows := func(head string) []string {
		_, rest, ok := strings.Cut(string(b), head)
		if !ok {
			t.Fatalf("docs/cdi.md has no table %q", head)
		}
		var cells []string
		for _, line := range strings.Split(rest, "\n")[2:] {
			line = strings.TrimSpace(line)
			if !strings.HasPrefix(line, "|") {
				break
			}
			cells = append(cells, strings.TrimSpace(strings.Split(line, "|")[1]))
		}
		return cells
	}
	// words are the backquoted term a cell begins with, its dots and colons as spaces; "" for
	// a row of something else (an annotation).
	field := regexp.MustCompile("^`([^`]+)`")
	words := func(cell string) string {
		m := field.FindStringSubmatch(cell)
		if m == nil {
			return ""
		}
		return strings.Join(strings.FieldsFunc(m[1], func(r rune) bool { return r == '.' || r == ':' || r == ' ' }), " ")
	}
	var documented []string
	for _, cell := range rows("| Field | Refused with |") {
		if w := words(cell); w != "" {
			documented = append(documented, w)
		} else {
			t.Errorf("docs/cdi.md: the refused row %q names no field", cell)
		}
	}
	// The policy's reasons begin with what they refuse: "source gcs (...) is not served ...".
	parenthesis := regexp.MustCompile(` \([^)]*\)`)
	var refused []string
	for _, v := range cdipolicy.CDIPolicy().Spec.Validations {
		what, _, ok := strings.Cut(v.Message, " not served")
		if !ok || !strings.Contains(v.Expression, "variables.spec.") || strings.Contains(v.Expression, "cdiconfigs") {
			continue // one of CDI's own rules, or about another kind than a DataVolume
		}
		what = strings.TrimSuffix(strings.TrimSuffix(what, " is"), " are")
		refused = append(refused, parenthesis.ReplaceAllString(what, ""))
	}
	slices.Sort(documented)
	slices.Sort(refused)
	if !slices.Equal(documented, refused) {
		t.Errorf("docs/cdi.md's refused fields\n  %q\ndiffer from the policy's\n  %q", documented, refused)
	}

	served := map[string]bool{}
	for _, cell := range rows("| Source | How diskpipe makes it |") {
		if w := words(cell); w != "" {
			served[strings.Fields(w)[0]] = true
		}
	}
	src := reflect.TypeFor[cdiv1.DataVolumeSource]()
	for i := range src.NumField() {
		name, _, _ := strings.Cut(src.Field(i).Tag.Get("json"), ",")
		if !served[name] && !slices.Contains(refused, "source "+name) {
			t.Errorf("CDI's source %q is neither a row of docs/cdi.md's served sources nor refused by the policy", name)
		}
		if served[name] && slices.Contains(refused, "source "+name) {
			t.Errorf("CDI's source %q is both served and refused", name)
		}
	}
}
