// Package uploads is the bundled store's layout of uploads, which the upload proxy writes and
// the manager reads and removes: one bucket of the store's root account, an object per image
// named by its UID, a marker once the upload is whole and verified, the state of an unfinished
// one beside it.
package uploads

import (
	"context"
	"fmt"

	"github.com/minio/minio-go/v7"

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
