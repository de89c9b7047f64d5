// Package apis_test checks diskpipe's CRDs against a real kube-apiserver: the seed documents'
// examples, every CEL rule with fixtures that must pass and must fail, and the printer columns
// that kubectl shows.
package apis_test

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.RunTests(m, &env) }

// TestSeedExamples applies every YAML example of seeds 000 and 003 with kubectl, as written.
// Accepted examples must be stored with every field they set; rejected ones must fail with
// a message that names the field and the rule, and leave nothing behind.
func TestSeedExamples(t *testing.T) {
	for _, f := range loadFixtures(t, "seeds") {
		t.Run(f.name, func(t *testing.T) {
			ctx := t.Context()
			if len(f.docs) != 1 {
				t.Fatalf("a seed fixture holds one example, found %d", len(f.docs))
			}
			obj := decode(t, f.docs[0])
			ns := namespaceFor(t, obj)

			_, stderr, err := env.Kubectl(ctx, f.docs[0], "apply", "--namespace", ns, "-f", "-")
			stored := obj.DeepCopy()
			getErr := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: obj.GetName()}, stored)

			if !f.accept {
				if err == nil {
					t.Fatalf("kubectl apply accepted an example that must be rejected")
				}
				t.Logf("kubectl apply: %s", stderr)
				for _, m := range f.messages {
					if !strings.Contains(stderr, m) {
						t.Errorf("kubectl's error lacks %q:\n%s", m, stderr)
					}
				}
				if !apierrors.IsNotFound(getErr) {
					t.Errorf("a rejected example left an object behind (get: %v)", getErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("kubectl apply: %v\n%s", err, stderr)
			}
			if strings.Contains(stderr, "Warning") {
				t.Errorf("kubectl warned: %s", stderr)
			}
			if getErr != nil {
				t.Fatalf("getting the applied object: %v", getErr)
			}
			if p := missingFrom(obj.Object["spec"], stored.Object["spec"], "spec"); p != "" {
				t.Errorf("the apiserver did not keep %s", p)
			}
		})
	}
}

// TestCELRules applies each CEL fixture's documents in order through the API (create, then
// update) and judges the last one.
func TestCELRules(t *testing.T) {
	for _, f := range loadFixtures(t, "cel") {
		t.Run(f.name, func(t *testing.T) {
			ctx := t.Context()
			ns, err := env.CreateNamespace(ctx, "cel")
			if err != nil {
				t.Fatal(err)
			}
			var last error
			for i, doc := range f.docs {
				last = createOrUpdate(ctx, ns, decode(t, doc))
				if last != nil && i < len(f.docs)-1 {
					t.Fatalf("setup document %d was rejected: %v", i+1, last)
				}
			}
			if f.accept {
				if last != nil {
					t.Fatalf("rejected, want accepted: %v", last)
				}
				return
			}
			if last == nil {
				t.Fatalf("accepted, want rejected with %q", f.messages)
			}
			if !apierrors.IsInvalid(last) {
				t.Errorf("want an Invalid error, got %v", last)
			}
			for _, m := range f.messages {
				if !strings.Contains(last.Error(), m) {
					t.Errorf("error lacks %q:\n%v", m, last)
				}
			}
		})
	}
}

func createOrUpdate(ctx context.Context, ns string, obj *unstructured.Unstructured) error {
	obj.SetNamespace(ns)
	existing := obj.DeepCopy()
	err := env.Client.Get(ctx, client.ObjectKeyFromObject(obj), existing)
	if apierrors.IsNotFound(err) {
		return env.Client.Create(ctx, obj)
	}
	if err != nil {
		return err
	}
	obj.SetResourceVersion(existing.GetResourceVersion())
	return env.Client.Update(ctx, obj)
}

// namespaceFor returns the namespace an example names, created if need be, or a fresh one.
func namespaceFor(t *testing.T, obj *unstructured.Unstructured) string {
	t.Helper()
	if ns := obj.GetNamespace(); ns != "" {
		if err := env.EnsureNamespace(t.Context(), ns); err != nil {
			t.Fatal(err)
		}
		return ns
	}
	ns, err := env.CreateNamespace(t.Context(), "seed")
	if err != nil {
		t.Fatal(err)
	}
	return ns
}
