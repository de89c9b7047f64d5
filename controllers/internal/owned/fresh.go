package owned

import (
	"context"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Fresh reads the object a reconcile acts on. A reconcile that acted on a copy older than this
// manager's own last write could do again what it already did (start an import that already
// finished), so the informer's cache is used only when it shows the version this manager last
// wrote or read from the apiserver, or an object it has not written at all; otherwise the
// object is read from the apiserver. Most reconciles (every first one) then cost no request.
type Fresh struct {
	Cache client.Reader
	API   client.Reader

	mu   sync.Mutex
	last map[types.NamespacedName]string // resourceVersion this manager last wrote or read
}

// Get reads key into obj.
func (f *Fresh) Get(ctx context.Context, key types.NamespacedName, obj client.Object) error {
	err := f.Cache.Get(ctx, key, obj)
	f.mu.Lock()
	last, known := f.last[key]
	f.mu.Unlock()
	if err == nil && (!known || obj.GetResourceVersion() == last) {
		return nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if err = f.API.Get(ctx, key, obj); err != nil {
		if apierrors.IsNotFound(err) {
			f.mu.Lock()
			delete(f.last, key)
			f.mu.Unlock()
		}
		return err
	}
	f.Saw(obj)
	return nil
}

// Saw records obj's version as this manager's latest: call it after every write.
func (f *Fresh) Saw(obj client.Object) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.last == nil {
		f.last = map[types.NamespacedName]string{}
	}
	f.last[client.ObjectKeyFromObject(obj)] = obj.GetResourceVersion()
}
