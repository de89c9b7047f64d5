package export

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/status"
	"github.com/diskpipe/diskpipe/internal/contract"
	"github.com/diskpipe/diskpipe/internal/seal"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore"
)

// # Download links
//
// A presigned URL downloads the whole disk without any other credential, so it is written
// only where the namespace's viewers do not read: a Secret owned by the export
// (DownloadSecretName; keys "url" and "expiresAt"), which `view` cannot get, as KubeVirt keeps
// its VirtualMachineExport's token. The export's status says only which Secret and until when.
// For the bundled store the manager signs the URL itself; for the user's store a pod signs it
// with the user's keys and leaves it in its termination message, which viewers read too, so
// the pod seals it to the manager's key (internal/seal) and only the manager opens it.

// DownloadSecretName is the name of ex's download Secret: its name and a short hash of its
// UID, so that it is never a Secret of the user's that happens to share the name.
func DownloadSecretName(ex *hypercloud.VirtualMachineVolumeExport) string {
	sum := sha256.Sum256([]byte(ex.UID))
	name := ex.Name
	if len(name) > 253-len("-download-")-8 {
		name = name[:253-len("-download-")-8]
	}
	return name + "-download-" + hex.EncodeToString(sum[:])[:8]
}

// LabelDownload marks an export's download Secret with its UID. (LabelExport marks the
// children that go when the export ends; this one stays while the export does.)
const LabelDownload = "diskpipe.io/export-download"

// dropDownload deletes ex's download Secret, as ex goes (the garbage collector would too,
// later): its URL stops working with ex's account anyway.
func (r *Reconciler) dropDownload(ctx context.Context, ex *hypercloud.VirtualMachineVolumeExport) error {
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: DownloadSecretName(ex), Namespace: ex.Namespace}}
	if err := r.Delete(ctx, sec); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting the download Secret: %w", err)
	}
	return nil
}

// expiryOf is how long ex's download URLs work.
func expiryOf(ex *hypercloud.VirtualMachineVolumeExport) time.Duration {
	if e := ex.Spec.DownloadURLExpiry; e != nil && e.Duration > 0 {
		return min(e.Duration, maxExpiry)
	}
	return defaultExpiry
}

// sealKey is the public key a pod seals the URL it signs to.
func sealKey() (string, error) {
	k, err := owned.SealKey()
	if err != nil {
		return "", err
	}
	return seal.Public(k), nil
}

// sealContext names ex for the URL its pods seal (contract.DownloadSealContext): a URL sealed
// for another export, copied into a pod result of this one's, does not open.
func sealContext(ex *hypercloud.VirtualMachineVolumeExport) string {
	return ex.Namespace + "/" + ex.Name + "/" + string(ex.UID)
}

// fromPod writes the download URL a pod signed and sealed, and says whether there was one.
func (r *Reconciler) fromPod(ctx context.Context, ex *hypercloud.VirtualMachineVolumeExport, res *transfer.Result) (bool, error) {
	if res.SealedDownloadURL == "" || res.DownloadURLExpiresAt == nil {
		return false, nil
	}
	k, err := owned.SealKey()
	if err != nil {
		return false, err
	}
	u, err := seal.Open(k, res.SealedDownloadURL, contract.DownloadSealContext(sealContext(ex), *res.DownloadURLExpiresAt))
	if err != nil {
		// Sealed to another key (the manager's key was made again while the pod ran), or
		// for another export (copied into this one's pod): not taken.
		return false, fmt.Errorf("the pod's download URL: %w", err)
	}
	return true, r.writeDownload(ctx, ex, string(u), *res.DownloadURLExpiresAt)
}

// writeDownload writes url into ex's download Secret and names it in ex's status.
func (r *Reconciler) writeDownload(ctx context.Context, ex *hypercloud.VirtualMachineVolumeExport, url string, at time.Time) error {
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: DownloadSecretName(ex), Namespace: ex.Namespace,
		Labels: map[string]string{LabelDownload: string(ex.UID)}}, Type: corev1.SecretTypeOpaque,
		StringData: map[string]string{hypercloud.DownloadSecretKeyURL: url, hypercloud.DownloadSecretKeyExpiresAt: at.UTC().Format(time.RFC3339)}}
	if err := owned.Put(ctx, r.Client, ex, sec); err != nil {
		return fmt.Errorf("writing the download Secret: %w", err)
	}
	mt := metav1.NewTime(at)
	ex.Status.DownloadSecretName, ex.Status.DownloadURLExpiresAt = sec.Name, &mt
	return nil
}

// presign writes the download URL of an export to the bundled store.
func (r *Reconciler) presign(ctx context.Context, ex *hypercloud.VirtualMachineVolumeExport, d *destination) error {
	expiry := expiryOf(ex)
	signer := d.client
	if d.presigner != nil {
		signer = d.presigner
	}
	if d.kind == "bundled" && r.StoreConfig != nil && r.StoreConfig.Scoped {
		// Signed by an account of the export's own that may read its one object: deleting the
		// export deletes the account, and every URL it signed stops working at once.
		access, secret, err := d.client.Scope(ctx, downloadAccount(ex), d.bucket, d.object, []string{"s3:GetObject"})
		if err != nil {
			return err
		}
		if signer, err = signer.WithKeys(access, secret); err != nil {
			return err
		}
	}
	at := time.Now().Add(expiry)
	u, err := signer.PresignGet(ctx, d.bucket, d.object, expiry)
	if err != nil {
		return err
	}
	return r.writeDownload(ctx, ex, u.String(), at)
}

// downloadAccount names the bundled store's account whose keys sign an export's download URL.
func downloadAccount(ex *hypercloud.VirtualMachineVolumeExport) string { return "dl-" + string(ex.UID) }

// DownloadAccess is the access key of that account, for tests and the chaos suite's count of
// accounts left over.
func DownloadAccess(ex *hypercloud.VirtualMachineVolumeExport) string {
	return objectstore.ScopedAccess(downloadAccount(ex))
}

// needsRenewal: a Ready export whose URL someone asked to renew.
func needsRenewal(ex *hypercloud.VirtualMachineVolumeExport) bool {
	_, asked := ex.Annotations[hypercloud.AnnotationRenewDownloadURL]
	return asked
}

// legacy: an export that a diskpipe before download Secrets made, with the URL in its status
// (an expiry and no Secret).
func legacy(ex *hypercloud.VirtualMachineVolumeExport) bool {
	return ex.Status.DownloadSecretName == "" && ex.Status.DownloadURLExpiresAt != nil
}

// legacyURL removes the download URL that a diskpipe before download Secrets wrote into the
// status, and its expiry (the typed object no longer has the field, so only a patch that names
// it does).
var legacyURL = client.RawPatch(types.MergePatchType, []byte(`{"status":{"downloadURL":null,"downloadURLExpiresAt":null}}`))

// migrate takes a legacy export's URL out of its status, and asks for a new one in a Secret
// as a user would (the annotation): whether or not that renewal succeeds, it is asked once.
func (r *Reconciler) migrate(ctx context.Context, ex *hypercloud.VirtualMachineVolumeExport) error {
	if err := r.Status().Patch(ctx, ex, legacyURL); err != nil {
		return err
	}
	patch := client.MergeFrom(ex.DeepCopy())
	metav1.SetMetaDataAnnotation(&ex.ObjectMeta, hypercloud.AnnotationRenewDownloadURL, "true")
	return r.Patch(ctx, ex, patch)
}

// renew presigns a fresh download URL, writes it, and clears the annotation that asked; for
// the user's store, a pod signs it (false while it runs).
func (r *Reconciler) renew(ctx context.Context, ex *hypercloud.VirtualMachineVolumeExport) (bool, error) {
	d, err := r.destination(ctx, ex, false)
	if err != nil {
		return false, err
	}
	base := ex.DeepCopy()
	if d.client != nil {
		err = r.presign(ctx, ex, d)
	} else {
		res, aerr := r.storeAction(ctx, ex, d, "presign")
		if errors.As(aerr, new(*owned.ErrNotOwned)) {
			r.Pods.Events.Eventf(ex, nil, corev1.EventTypeWarning, status.ReasonNameTaken, "RenewURL", "No new download URL: %v", aerr)
			return true, r.clearRenew(ctx, ex, base)
		}
		if res == nil || aerr != nil {
			return false, aerr
		}
		if ok, oerr := r.fromPod(ctx, ex, res); oerr != nil {
			return false, oerr
		} else if !res.Succeeded || !ok {
			// The old URL stays; the user reads why and may ask again.
			r.Pods.Events.Eventf(ex, nil, corev1.EventTypeWarning, string(res.Reason), "RenewURL", "No new download URL: %s", res.Message)
		}
	}
	if err != nil {
		return false, err
	}
	return true, r.clearRenew(ctx, ex, base)
}

// clearRenew writes ex's status (read as base) and removes the annotation that asked for a
// new URL.
func (r *Reconciler) clearRenew(ctx context.Context, ex, base *hypercloud.VirtualMachineVolumeExport) error {
	if err := r.Status().Patch(ctx, ex, client.MergeFrom(base)); err != nil {
		return err
	}
	patch := client.MergeFrom(ex.DeepCopy())
	delete(ex.Annotations, hypercloud.AnnotationRenewDownloadURL)
	return r.Patch(ctx, ex, patch)
}
