package owned

import (
	"context"
	"crypto/ecdh"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/internal/seal"
	"github.com/diskpipe/diskpipe/internal/secretkey"
)

// # Marks
//
// A controller ownerReference is no proof that diskpipe made a child: a tenant may create, in
// their own namespace, an object under the name diskpipe is about to use, with an
// ownerReference to their own object (its UID is in its metadata), and diskpipe would adopt it
// and act on what it says (a PVC pre-bound to another namespace's volume, say). So each child
// diskpipe makes carries, from its creation, the annotation AnnotationMade: an HMAC, under a
// key only the manager holds, of the child's kind, namespace and name and of its owner's UID.
// A child is diskpipe's (Mine) when its mark is right: no one without the key can make one for
// a name diskpipe has not used yet.
//
// The mark does not name the child's own UID (the apiserver gives it only once the child
// exists, and writing it then would need the right to patch pods and snapshots everywhere).
// So the owner of a namespace who deletes a child diskpipe made may make another under its
// name with its mark: they steer nothing they do not own by that, since whatever the manager
// does with its own rights on a child's word is checked against what the child cannot forge
// (a volume is handed over only from the claim its claimRef names, by UID).
//
// Children made before the key existed (by a diskpipe without marks) carry none, and a key
// made again (its Secret deleted) does not know the marks of the old one: a child older than
// the key is taken as diskpipe's whatever its mark. (What an older replica makes in the moments
// of an upgrade between the new one's first start and its taking the lead is refused as
// NameTaken: that is the price of a window no tenant can use.)

// AnnotationMade is the mark of a child diskpipe made.
const AnnotationMade = "diskpipe.io/made"

type markKey struct {
	key   []byte
	since time.Time
	// seal is derived from key once (seal.Key), or why it could not be.
	seal    *ecdh.PrivateKey
	sealErr error
}

var currentKey atomic.Pointer[markKey]

// UseKey sets the key children are marked with; children older than since are taken as made
// by an earlier diskpipe.
func UseKey(key []byte, since time.Time) {
	k := &markKey{key: append([]byte(nil), key...), since: since}
	k.seal, k.sealErr = seal.Key(k.key)
	currentKey.Store(k)
}

// LoadKey reads the marking key from the Secret name, making it (32 random bytes) if there
// is none, and uses it.
func LoadKey(ctx context.Context, c client.Client, name types.NamespacedName) error {
	sec, err := secretkey.Ensure(ctx, c, name, "the key children are marked with")
	if err != nil {
		return err
	}
	UseKey(sec.Data[secretkey.Field], sec.CreationTimestamp.Time)
	return nil
}

// mark is the mark of obj, made for the object of UID owner, under k.
func (k *markKey) mark(kind string, obj client.Object, owner types.UID) string {
	h := hmac.New(sha256.New, k.key)
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s", kind, obj.GetNamespace(), obj.GetName(), owner)
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// SealKey is the private key pods seal their secrets to (internal/seal), derived from the
// marking key, so that every replica holds the same one.
func SealKey() (*ecdh.PrivateKey, error) {
	k := currentKey.Load()
	if k == nil {
		return nil, errors.New("no key: the manager has not loaded its key")
	}
	return k.seal, k.sealErr
}

// HasKey reports whether a key was set (UseKey, LoadKey).
func HasKey() bool { return currentKey.Load() != nil }

func key() *markKey {
	if k := currentKey.Load(); k != nil {
		return k
	}
	panic("owned: no marking key: the manager calls owned.LoadKey (or a test owned.UseKey) before it starts")
}

// Stamp marks obj, of kind, about to be created, as made for the object of UID owner (its
// owner, or the object a pod in another namespace works for).
func Stamp(kind string, obj client.Object, owner types.UID) {
	ann := maps.Clone(obj.GetAnnotations())
	if ann == nil {
		ann = map[string]string{}
	}
	ann[AnnotationMade] = key().mark(kind, obj, owner)
	obj.SetAnnotations(ann)
}

// Marked reports whether obj, of kind, read from the cluster, was made by diskpipe for the
// object of UID owner: it carries the mark Stamp gave it, or is older than the key.
func Marked(kind string, obj client.Object, owner types.UID) bool {
	k := key()
	if obj.GetCreationTimestamp().Time.Before(k.since) {
		return true
	}
	got, ok := obj.GetAnnotations()[AnnotationMade]
	return ok && hmac.Equal([]byte(got), []byte(k.mark(kind, obj, owner)))
}

// Mine reports whether obj, of kind, read from the cluster, is a child diskpipe made for
// owner: controlled by owner, and Marked for it.
func Mine(kind string, obj, owner client.Object) bool {
	return metav1.IsControlledBy(obj, owner) && Marked(kind, obj, owner.GetUID())
}

// MineUnder is Mine for a child owner may have made with CreateUnder: Controls, rather than
// controlled by owner.
func MineUnder(kind string, obj, owner client.Object) bool {
	return Controls(owner, obj) && Marked(kind, obj, owner.GetUID())
}

// Controls reports whether owner controls obj: as its controller, or as an owner of obj beside
// obj's controller when that is owner's own controller (a child made with CreateUnder).
func Controls(owner, obj client.Object) bool {
	if metav1.IsControlledBy(obj, owner) {
		return true
	}
	above, ctl := metav1.GetControllerOf(owner), metav1.GetControllerOf(obj)
	return above != nil && ctl != nil && above.UID == ctl.UID && slices.ContainsFunc(obj.GetOwnerReferences(), func(r metav1.OwnerReference) bool {
		return r.UID == owner.GetUID()
	})
}

// MadeFor is the owner, among obj's ownerReferences (its controller or another), of one of
// kinds that obj, of kind, is Marked for: the object diskpipe made obj for; nil when there is
// none.
func MadeFor(kind string, obj client.Object, kinds ...string) *metav1.OwnerReference {
	for _, r := range obj.GetOwnerReferences() {
		if slices.Contains(kinds, r.Kind) && Marked(kind, obj, r.UID) {
			return &r
		}
	}
	return nil
}
