package contract_test

import (
	"flag"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/diskpipe/diskpipe/internal/contract"
)

// TestRoundTrip: every field of every pod kind, set, goes through the command line the
// controllers make and comes back the same from the flags the binary parses, over its
// defaults; a field added to one side is on the other.
func TestRoundTrip(t *testing.T) {
	for name, c := range map[string]struct {
		filled, parsed any
	}{
		"import": {fill(&contract.Import{}), ptr(contract.DefaultImport())},
		"export": {fill(&contract.Export{}), ptr(contract.DefaultExport())},
	} {
		args := contract.Args(c.filled)
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		contract.Bind(fs, c.parsed)
		if err := fs.Parse(args); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, strings.Join(args, " "))
		}
		if !reflect.DeepEqual(c.filled, c.parsed) {
			t.Errorf("%s: the binary parses\n%+v\nfrom %s\nwhere the controller meant\n%+v", name, c.parsed, strings.Join(args, " "), c.filled)
		}
		// Every field has a flag of its own, with a usage text.
		seen := map[string]bool{}
		fs.VisitAll(func(f *flag.Flag) {
			if f.Usage == "" {
				t.Errorf("%s: --%s has no usage text", name, f.Name)
			}
			seen[f.Name] = true
		})
		if n := countFlags(reflect.TypeOf(c.filled).Elem()); len(seen) != n {
			t.Errorf("%s: %d flags for %d fields", name, len(seen), n)
		}
	}
}

// TestArgsReadable: the command line is --name value in the order of the fields, only for
// what is set; an overhead of 0 is said.
func TestArgsReadable(t *testing.T) {
	zero := 0.0
	got := strings.Join(contract.Args(contract.Import{Source: "http", URL: "https://example.com/disk.img", Header: []string{"A: 1", "B: 2"},
		Grow: true, Target: "/data/disk.img", Overhead: &zero}), " ")
	want := "--source http --url https://example.com/disk.img --header A: 1 --header B: 2 --grow --target /data/disk.img --overhead 0"
	if got != want {
		t.Errorf("args\n%s\nwant\n%s", got, want)
	}
}

// TestOverlay: a source's flags laid over a mode's keep both, lists joined.
func TestOverlay(t *testing.T) {
	dst := contract.Import{Probe: true, HeaderFile: []string{"/a"}}
	contract.Overlay(&dst, contract.Import{Source: "http", URL: "u", HeaderFile: []string{"/b"}})
	if !dst.Probe || dst.Source != "http" || dst.URL != "u" || !slices.Equal(dst.HeaderFile, []string{"/a", "/b"}) {
		t.Errorf("overlaid: %+v", dst)
	}
}

func ptr[T any](v T) *T { return &v }

// fill sets every flagged field of *v to a value of its own, none a default.
func fill[T any](v *T) *T {
	n := 0
	var walk func(reflect.Value)
	walk = func(s reflect.Value) {
		for i := range s.NumField() {
			f, sf := s.Field(i), s.Type().Field(i)
			if sf.Tag.Get("flag") == "" {
				walk(f)
				continue
			}
			n++
			switch f.Interface().(type) {
			case string:
				f.SetString(fmt.Sprintf("value-%d", n))
			case bool:
				f.SetBool(true)
			case int, int64:
				f.SetInt(int64(1000 + n))
			case *float64:
				x := float64(n) / 100
				f.Set(reflect.ValueOf(&x))
			case time.Duration:
				f.SetInt(int64(time.Duration(n) * time.Second))
			case []string:
				f.Set(reflect.ValueOf([]string{fmt.Sprintf("first-%d", n), fmt.Sprintf("second-%d", n)}))
			default:
				panic(fmt.Sprintf("fill: %s has a type the test does not know", sf.Name))
			}
		}
	}
	walk(reflect.ValueOf(v).Elem())
	return v
}

func countFlags(t reflect.Type) int {
	n := 0
	for i := range t.NumField() {
		if sf := t.Field(i); sf.Tag.Get("flag") != "" {
			n++
		} else if sf.Type.Kind() == reflect.Struct {
			n += countFlags(sf.Type)
		}
	}
	return n
}
