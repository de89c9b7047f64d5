package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	upload "github.com/diskpipe/diskpipe/apis/upload/v1alpha1"
	"github.com/diskpipe/diskpipe/uploadproxy"
)

// UploadTokens configure the UploadTokenRequest webhook.
type UploadTokens struct {
	// Key signs the tokens.
	Key *uploadproxy.TokenKey
	// URL is the upload proxy's address outside the cluster; empty when it has none.
	URL string
	// Service is the upload proxy's Service.
	Service *upload.ProxyService
	// Lifetime of a token (default uploadproxy.TokenLifetime).
	Lifetime time.Duration
}

// tokenIssuer answers a dry-run UploadTokenRequest with a token for its image, when the user
// who sent it may upload to that image. The apiserver has authenticated the user, with any
// kind of credential, and sends who they are in the admission request; nothing is stored,
// since only dry runs are admitted.
type tokenIssuer struct {
	// client makes SubjectAccessReviews; reader reads images from the apiserver, not the
	// cache: a user asks for a token right after making the image.
	client  client.Client
	reader  client.Reader
	decoder admission.Decoder
	cfg     UploadTokens
}

func (h *tokenIssuer) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.DryRun == nil || !*req.DryRun {
		return denied("UploadTokenRequests are only made with server-side dry run (kubectl create --dry-run=server, or kubectl diskpipe upload): a token is never stored")
	}
	r := &upload.UploadTokenRequest{}
	if err := h.decoder.Decode(req, r); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	resource := uploadproxy.Resources[r.Spec.Kind]
	img, err := uploadproxy.GetImage(ctx, h.reader, req.Namespace, resource, r.Spec.Name)
	if err == nil {
		err = uploadproxy.MayUpload(ctx, h.client, req.UserInfo, req.Namespace, resource, r.Spec.Name)
	}
	if code := uploadproxy.StatusOf(err); err != nil && code != http.StatusInternalServerError {
		resp := admission.Denied(err.Error())
		resp.Result.Code = int32(code) //nolint:gosec // an HTTP status
		return resp
	} else if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	key, err := h.cfg.Key.Ensure(ctx)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	lifetime := h.cfg.Lifetime
	if lifetime == 0 {
		lifetime = uploadproxy.TokenLifetime
	}
	expires := time.Now().Add(lifetime).Truncate(time.Second)
	token, err := uploadproxy.IssueToken(key, uploadproxy.Claims{Namespace: req.Namespace, Resource: resource, Name: r.Spec.Name,
		UID: img.UID, User: req.UserInfo.Username, Expires: expires.Unix()})
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	r.Status = upload.UploadTokenRequestStatus{Token: token, ExpirationTimestamp: &metav1.Time{Time: expires},
		Path: fmt.Sprintf("/v1/namespaces/%s/%s/%s", req.Namespace, resource, r.Spec.Name), URL: h.cfg.URL, Service: h.cfg.Service}
	out, err := json.Marshal(r)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, out)
}
