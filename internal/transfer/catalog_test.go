package transfer

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"testing"
)

// TestCatalogHasEveryReason: every Reason constant of errors.go has its meaning and advice in
// the catalog, so the plugin and docs/troubleshooting.md can say what to do about it.
func TestCatalogHasEveryReason(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "errors.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	ast.Inspect(f, func(node ast.Node) bool {
		v, ok := node.(*ast.ValueSpec)
		if !ok || len(v.Values) != 1 {
			return true
		}
		if id, ok := v.Type.(*ast.Ident); !ok || id.Name != "Reason" {
			return true
		}
		lit, ok := v.Values[0].(*ast.BasicLit)
		if !ok {
			return true
		}
		reason, _ := strconv.Unquote(lit.Value)
		n++
		if Advice(reason) == "" {
			t.Errorf("reason %s has no advice in the catalog", reason)
		}
		return true
	})
	if n < 20 {
		t.Fatalf("found only %d reasons in errors.go", n)
	}
	seen := map[string]bool{}
	for _, d := range Catalog {
		if seen[d.Reason] || d.Meaning == "" || d.Advice == "" {
			t.Errorf("catalog entry %q: repeated, or without meaning or advice", d.Reason)
		}
		seen[d.Reason] = true
	}
}
