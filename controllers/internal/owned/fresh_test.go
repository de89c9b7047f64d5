package owned

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// versions is a reader holding one ConfigMap's resourceVersion ("" for none) and counting reads.
type versions struct {
	rv    string
	reads int
}

func (v *versions) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	v.reads++
	if v.rv == "" {
		return apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, key.Name)
	}
	obj.SetName(key.Name)
	obj.SetNamespace(key.Namespace)
	obj.SetResourceVersion(v.rv)
	return nil
}

func (v *versions) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }

// TestFresh: the cache is trusted for an object this manager has not written and when it shows
// the manager's last write; a cache that lags behind that write is passed over for the apiserver.
func TestFresh(t *testing.T) {
	ctx := context.Background()
	key := types.NamespacedName{Namespace: "ns", Name: "img"}
	cache, api := &versions{rv: "5"}, &versions{rv: "5"}
	f := &Fresh{Cache: cache, API: api}
	get := func(wantRV string, wantAPIReads int) {
		t.Helper()
		obj := &corev1.ConfigMap{}
		if err := f.Get(ctx, key, obj); err != nil {
			t.Fatal(err)
		}
		if obj.ResourceVersion != wantRV || api.reads != wantAPIReads {
			t.Fatalf("read version %q with %d apiserver reads, want %q with %d", obj.ResourceVersion, api.reads, wantRV, wantAPIReads)
		}
	}

	get("5", 0) // never written: the cache
	api.rv = "7"
	f.Saw(&corev1.ConfigMap{ObjectMeta: objectMeta(key, "7")}) // this manager wrote version 7
	get("7", 1)                                                // the cache still shows 5: the apiserver
	cache.rv = "7"
	get("7", 1) // the cache caught up
	cache.rv, api.rv = "9", "9"
	get("9", 2) // someone else wrote: read once from the apiserver, then trusted
	get("9", 2)

	api.rv = ""
	cache.rv = ""
	if err := f.Get(ctx, key, &corev1.ConfigMap{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a deleted object: %v, want NotFound", err)
	}
	if _, known := f.last[key]; known {
		t.Fatal("a deleted object's version is still remembered")
	}
}

func objectMeta(key types.NamespacedName, rv string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, ResourceVersion: rv}
}
