// Package uploads is the bundled store's layout of uploads, which the upload proxy writes and
// the manager reads and removes: one bucket of the store's root account, an object per image
// named by its UID, a marker once the upload is whole and verified, the state of an unfinished
// one beside it.
package uploads

import (
	"context"
	"fmt"
	"strings"

	"github.com/minio/minio-go/v7"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
	"github.com/diskpipe/diskpipe/objectstore"
)

// Bucket is where uploads are kept: a name only the store's root account may take
// (objectstore.ReservedPrefix).
const Bucket = objectstore.ReservedPrefix + "uploads"

// ObjectKey is the object an image's upload is stored as: a function of the image's UID, so
// that nobody can point an image at another's object.
func ObjectKey(namespace, resource, name, uid string) string {
	return fmt.Sprintf("%s/%s/%s-%s", namespace, resource, name, uid)
}

// MarkerKey is written once the upload at key is whole and verified.
func MarkerKey(key string) string { return key + ".complete" }

// StateKey holds the state of the unfinished upload at key.
func StateKey(key string) string { return key + ".state" }

// Remove deletes what an upload at key left in the store (through store, the root's client):
// its marker first, so that nothing half-removed is taken for a whole upload, then the object,
// the state and unfinished parts. For an image being deleted. No bucket: nothing to remove.
func Remove(ctx context.Context, store *objectstore.Client, key string) error {
	for _, k := range []string{MarkerKey(key), key, StateKey(key)} {
		err := store.RemoveObject(ctx, Bucket, k, minio.RemoveObjectOptions{})
		if minio.ToErrorResponse(err).Code == "NoSuchBucket" {
			return nil
		}
		if err != nil {
			return objectstore.Classify(err, "removing the upload "+objectstore.ObjectURL(Bucket, k))
		}
	}
	_, err := store.AbortUploads(ctx, Bucket, key)
	return err
}

// keyOf is the upload key an object of the bucket belongs to (its marker and state belong to
// the upload), and the image it names: namespace, resource, name and UID.
func keyOf(object string) (key, namespace, resource, name, uid string, ok bool) {
	key = strings.TrimSuffix(strings.TrimSuffix(object, ".complete"), ".state")
	parts := strings.Split(key, "/")
	if len(parts) != 3 || len(parts[2]) < 38 || parts[2][len(parts[2])-37] != '-' {
		return "", "", "", "", "", false
	}
	last := parts[2]
	return key, parts[0], parts[1], last[:len(last)-37], last[len(last)-36:], true
}

// Sweep removes the uploads whose image is gone: one deleted while its upload was written
// (the write came after its cleanup), or before this version cleaned uploads up. Whether an
// image is there is asked of reader, which must read the apiserver, not a cache: an upload
// only begins for an image the proxy found, so one missing now is gone. It returns the keys it
// removed.
func Sweep(ctx context.Context, store *objectstore.Client, reader client.Reader) ([]string, error) {
	keys := map[string]bool{}
	for obj := range store.ListObjects(ctx, Bucket, minio.ListObjectsOptions{Recursive: true}) {
		if minio.ToErrorResponse(obj.Err).Code == "NoSuchBucket" {
			return nil, nil
		}
		if obj.Err != nil {
			return nil, objectstore.Classify(obj.Err, "listing the uploads")
		}
		keys[obj.Key] = true
	}
	core := minio.Core{Client: store.Client}
	parts, err := core.ListMultipartUploads(ctx, Bucket, "", "", "", "", 1000)
	if err != nil {
		return nil, objectstore.Classify(err, "listing the unfinished uploads")
	}
	for _, up := range parts.Uploads {
		keys[up.Key] = true
	}
	seen := map[string]bool{}
	var removed []string
	for object := range keys {
		key, ns, resource, name, uid, ok := keyOf(object)
		if !ok || seen[key] {
			continue
		}
		seen[key] = true
		there, err := imageThere(ctx, reader, ns, resource, name, uid)
		if err != nil {
			return removed, err
		}
		if there {
			continue
		}
		if err := Remove(ctx, store, key); err != nil {
			return removed, err
		}
		removed = append(removed, key)
	}
	return removed, nil
}

// imageThere says whether the image an upload is for is there, the same one (uid).
func imageThere(ctx context.Context, reader client.Reader, ns, resource, name, uid string) (bool, error) {
	var obj client.Object
	switch resource {
	case "virtualmachineimages":
		obj = &hypercloud.VirtualMachineImage{}
	case "imagetemplates":
		obj = &virtualmachine.ImageTemplate{}
	default:
		return true, nil // not an upload's key: left alone
	}
	err := reader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj)
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("looking for %s %s/%s: %w", resource, ns, name, err)
	}
	return string(obj.GetUID()) == uid, nil
}
