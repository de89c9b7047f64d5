package owned

import (
	"context"
	"errors"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Fresh reads the object a reconcile acts on. A reconcile that acted on a copy older than this
// manager's own last write could do again what it already did (start an import that already
// finished), so the informer's cache is used only when it shows the version this manager last
// wrote or read from the apiserver (or a newer one), or an object it has not written at all.
// A cache still behind that write makes Get return ErrBehind: the watch event that brings the
// write queues the object again, so the reconcile ends without a request. Most reconciles then
// cost no request at all.
type Fresh struct {
	Cache client.Reader
	API   client.Reader

	mu   sync.Mutex
	last map[types.NamespacedName]string // resourceVersion this manager last wrote or read
}

// ErrBehind says the cache has not yet seen this manager's last write of the object.
var ErrBehind = errors.New("the informer's cache is behind this manager's last write")

// IgnoreBehind is err, or nil for ErrBehind: a reconcile that meets ErrBehind ends, and the
// watch event it waits for queues the object again.
func IgnoreBehind(err error) error {
	if errors.Is(err, ErrBehind) {
		return nil
	}
	return err
}

// Get reads key into obj.
func (f *Fresh) Get(ctx context.Context, key types.NamespacedName, obj client.Object) error {
	err := f.Cache.Get(ctx, key, obj)
	f.mu.Lock()
	last, known := f.last[key]
	f.mu.Unlock()
	if err == nil {
		if !known {
			return nil
		}
		// Versions of one resource compare as integers (resourceversion.CompareResourceVersion);
		// one that does not is read from the apiserver.
		switch cmp, cerr := resourceversion.CompareResourceVersion(obj.GetResourceVersion(), last); {
		case cerr != nil:
		case cmp == 0:
			return nil
		case cmp > 0:
			f.Saw(obj)
			return nil
		default:
			return ErrBehind
		}
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
