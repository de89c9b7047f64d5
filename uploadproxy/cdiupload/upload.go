// Package cdiupload serves CDI's upload API, for the unmodified `virtctl image-upload dv` and `pvc`: with CDI's API
// served by diskpipe (cdi.compatibility.enabled), a DataVolume of source upload, or a PVC made
// for an upload, has a claim of its name made for the upload, staged by a VirtualMachineImage
// of source upload, cdiclaims.UploadPVCImage(the claim's name), which the claim controls
// (controllers/cdi), and
//
//   - the manager's aggregated API answers CDI's UploadTokenRequest
//     (upload.cdi.kubevirt.io/v1beta1, spec.pvcName) with a token for that image; as with CDI,
//     the apiserver's check that the user may create uploadtokenrequests in the namespace is
//     the authorization;
//   - the upload proxy takes CDI's uploads (Authorization: Bearer <token>) into the same
//     resumable store as a PUT: the image as the body (POST /v1beta1/upload, /upload-async) or
//     as the form field "file" (/upload-form, /upload-form-async, as a browser sends it); the
//     v1alpha1 paths too, as CDI's proxy serves them. A synchronous upload is answered 200 once
//     the claim's disk is made (the staging image gone, the claim bound and annotated
//     cdi.kubevirt.io/storage.pod.phase: Succeeded), or with the import's failure, as CDI's
//     answers once its upload server has written the disk; an asynchronous one is answered 200
//     once the image is stored, and virtctl then waits on the claim's annotation. HEAD
//     /v1beta1/upload-async (virtctl's question whether to take that path) answers 200 to a
//     valid token.
package cdiupload

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	cdiupload "kubevirt.io/containerized-data-importer-api/pkg/apis/upload/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/internal/cdiclaims"
	"github.com/diskpipe/diskpipe/internal/uploadtoken"
	"github.com/diskpipe/diskpipe/uploadproxy"
)

// CDI's upload paths on the upload proxy.
const (
	PathCDIUpload          = "/v1beta1/upload"
	PathCDIUploadAsync     = "/v1beta1/upload-async"
	PathCDIUploadForm      = "/v1beta1/upload-form"
	PathCDIUploadFormAsync = "/v1beta1/upload-form-async"
)

// cdiPath is how a CDI upload path is served.
type cdiPath struct{ async, form bool }

var cdiPaths = map[string]cdiPath{
	PathCDIUpload: {}, "/v1alpha1/upload": {},
	PathCDIUploadAsync: {async: true}, "/v1alpha1/upload-async": {async: true},
	PathCDIUploadForm: {form: true}, "/v1alpha1/upload-form": {form: true},
	PathCDIUploadFormAsync: {async: true, form: true}, "/v1alpha1/upload-form-async": {async: true, form: true},
}

// Doors are CDI's upload paths on the upload proxy s (its Server.Doors).
func Doors(s *uploadproxy.Server) map[string]uploadproxy.Door {
	doors := map[string]uploadproxy.Door{}
	for path, how := range cdiPaths {
		doors[path] = func(w http.ResponseWriter, r *http.Request) error { return serve(s, how, w, r) }
	}
	return doors
}

// serve serves one of CDI's upload paths, as how says, on the upload proxy s.
func serve(s *uploadproxy.Server, how cdiPath, w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	switch {
	case r.Method == http.MethodHead && how.async:
		// virtctl asks whether to take the asynchronous path, as CDI's proxy answers it.
		_, err := s.TokenClaims(ctx, r)
		return err
	case r.Method != http.MethodPost:
		return uploadproxy.Fail(http.StatusMethodNotAllowed, "POST the image to %s", r.URL.Path)
	}
	c, err := s.TokenClaims(ctx, r)
	if err != nil {
		return err
	}
	var in io.Reader // the body, as a PUT's
	if how.form {
		in = &formBody{r: r}
	}
	// The upload goes into the store as a PUT's would; its answer is held: CDI answers 200.
	held := &heldResponse{ResponseWriter: w, header: http.Header{}}
	if err := s.Upload(held, r, in, -1, c); err != nil {
		return err
	}
	stored := strings.TrimSpace(held.body.String())
	if how.async {
		s.Log.Info("Upload stored; the disk is being made", "namespace", c.Namespace, "image", c.Name)
		_, _ = fmt.Fprintf(w, "%s: the disk is being made; the claim is annotated %s: Succeeded when it is\n", stored, cdiclaims.AnnPodPhase)
		return nil
	}
	s.Log.Info("Upload stored; waiting for the claim's disk", "namespace", c.Namespace, "image", c.Name)
	if err := waitMade(ctx, s.Kube, c.Namespace, c.Name); err != nil {
		return err
	}
	_, _ = fmt.Fprintf(w, "%s: the disk is made\n", stored)
	return nil
}

// formPreamble bounds what a form may send before its field "file": the proxy holds it in
// memory as it parses it.
const formPreamble = 1 << 20

// formBody is the form field "file" of r, a multipart upload, of a size the form does not say.
// The form is read at the first Read, when the proxy took a writer's slot for the request and
// bounds its body's pace (uploadproxy.Server.Upload): not before.
type formBody struct {
	r    *http.Request
	file io.Reader
	err  error
}

func (f *formBody) Read(p []byte) (int, error) {
	if f.file == nil && f.err == nil {
		f.file, f.err = formFile(f.r)
	}
	if f.err != nil {
		return 0, f.err
	}
	return f.file.Read(p)
}

// formFile is the form field "file" of r.
func formFile(r *http.Request) (io.Reader, error) {
	head := &preamble{ReadCloser: r.Body, left: formPreamble}
	r.Body = head
	mr, err := r.MultipartReader()
	if err != nil {
		return nil, uploadproxy.Fail(http.StatusBadRequest, "a form upload is multipart/form-data with the image in the field \"file\": %v", err)
	}
	for {
		p, err := mr.NextPart()
		switch {
		case err == io.EOF:
			return nil, uploadproxy.Fail(http.StatusBadRequest, "the form has no field \"file\"")
		case err != nil && head.left == 0:
			return nil, uploadproxy.Fail(http.StatusRequestEntityTooLarge, "the form sends more than %d bytes before its field \"file\": send the image first", formPreamble)
		case err != nil:
			return nil, uploadproxy.Fail(http.StatusBadRequest, "reading the form: %v", err)
		}
		if p.FormName() == "file" {
			head.left = -1
			return p, nil
		}
	}
}

// preamble reads a body, at most left bytes while left is not -1.
type preamble struct {
	io.ReadCloser
	left int
}

func (p *preamble) Read(b []byte) (int, error) {
	if p.left < 0 {
		return p.ReadCloser.Read(b)
	}
	if p.left == 0 {
		return 0, io.ErrUnexpectedEOF
	}
	n, err := p.ReadCloser.Read(b[:min(len(b), p.left)])
	p.left -= n
	return n, err
}

// waitMade waits until the staging image ns/name has made its claim's disk (the claim's
// controller deletes it then, UploadPVCReconciler), or failed.
func waitMade(ctx context.Context, kube client.Reader, ns, name string) error {
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		img := &hypercloud.VirtualMachineImage{}
		err := kube.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, img)
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		case img.Status.Phase == common.PhaseFailed:
			return uploadproxy.Fail(http.StatusUnprocessableEntity, "the upload was stored, and its import failed: %s", readyMessage(img))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func readyMessage(img *hypercloud.VirtualMachineImage) string {
	for _, c := range img.Status.Conditions {
		if c.Type == common.ConditionReady {
			return c.Reason + ": " + c.Message
		}
	}
	return string(img.Status.Phase)
}

// heldResponse keeps a PUT's success answer for serve to send later; headers go through.
type heldResponse struct {
	http.ResponseWriter
	header http.Header
	code   int
	body   strings.Builder
}

func (h *heldResponse) Header() http.Header         { return h.header }
func (h *heldResponse) WriteHeader(code int)        { h.code = code }
func (h *heldResponse) Write(b []byte) (int, error) { return h.body.Write(b) }
func (h *heldResponse) Unwrap() http.ResponseWriter { return h.ResponseWriter }

// GroupVersion is CDI's upload API, served by the manager's token API.
var GroupVersion = cdiupload.SchemeGroupVersion

// Tokens is CDI's upload.cdi.kubevirt.io served by the token API a (its TokenAPI.Groups):
// UploadTokenRequest, answered with a token for the image that stages the upload to
// spec.pvcName (a DataVolume's, or a PVC's), which must not be made yet.
func Tokens(a *uploadproxy.TokenAPI) uploadproxy.RequestGroup {
	return uploadproxy.RequestGroup{GroupVersion: GroupVersion, Requests: map[string]func(context.Context, string, []byte, authenticationv1.UserInfo) (any, error){
		"UploadTokenRequest": func(ctx context.Context, ns string, body []byte, user authenticationv1.UserInfo) (any, error) {
			return token(ctx, a, ns, body, user)
		},
	}}
}

// token answers CDI's UploadTokenRequest.
func token(ctx context.Context, a *uploadproxy.TokenAPI, ns string, body []byte, user authenticationv1.UserInfo) (*cdiupload.UploadTokenRequest, error) {
	req := &cdiupload.UploadTokenRequest{}
	if err := json.Unmarshal(body, req); err != nil {
		return nil, uploadproxy.Fail(http.StatusBadRequest, "invalid UploadTokenRequest: %v", err)
	}
	gv := cdiupload.SchemeGroupVersion
	if (req.APIVersion != "" && req.APIVersion != gv.String()) || (req.Kind != "" && req.Kind != "UploadTokenRequest") {
		return nil, uploadproxy.Fail(http.StatusBadRequest, "invalid UploadTokenRequest: it is a %s %s, not a %s UploadTokenRequest", req.APIVersion, req.Kind, gv)
	}
	if req.Namespace != "" && req.Namespace != ns {
		return nil, uploadproxy.Fail(http.StatusBadRequest, "invalid UploadTokenRequest: metadata.namespace %q is not the request's namespace %q", req.Namespace, ns)
	}
	if errs := validation.IsDNS1123Subdomain(req.Spec.PvcName); len(errs) > 0 {
		return nil, uploadproxy.Fail(http.StatusBadRequest, "invalid UploadTokenRequest: spec.pvcName %q: %s", req.Spec.PvcName, errs[0])
	}
	name, notYet, err := uploadImageFor(ctx, a.Reader, ns, req.Spec.PvcName)
	if err != nil {
		return nil, err
	}
	img, err := uploadproxy.GetImage(ctx, a.Reader, ns, "virtualmachineimages", name)
	if uploadproxy.StatusOf(err) == http.StatusNotFound {
		return nil, uploadproxy.Fail(http.StatusConflict, "%s", notYet)
	} else if err != nil {
		return nil, err
	}
	token, _, err := a.Key.IssueFor(ctx, uploadtoken.Claims{Namespace: ns, Resource: "virtualmachineimages", Name: name,
		UID: img.UID, User: user.Username}, a.Lifetime)
	if err != nil {
		return nil, err
	}
	req.APIVersion, req.Kind, req.Namespace, req.CreationTimestamp = gv.String(), "UploadTokenRequest", ns, metav1.Now()
	req.Status.Token = token
	return req, nil
}

// uploadImageFor is the image that stages CDI's upload to pvcName: that of a DataVolume of
// source upload, or of a PVC made for an upload (virtctl image-upload pvc); notYet is what to
// say while the image is not made yet.
func uploadImageFor(ctx context.Context, kube client.Reader, ns, pvcName string) (name, notYet string, err error) {
	dv := &cdiv1.DataVolume{}
	switch err := kube.Get(ctx, client.ObjectKey{Namespace: ns, Name: pvcName}, dv); {
	case err == nil:
		if dv.Spec.Source == nil || dv.Spec.Source.Upload == nil {
			return "", "", uploadproxy.Fail(http.StatusConflict, "DataVolume %s/%s does not take uploads: its source is not upload", ns, dv.Name)
		}
		if dv.Status.Phase == cdiv1.Succeeded {
			return "", "", uploadproxy.Fail(http.StatusConflict, "DataVolume %s/%s is already uploaded", ns, dv.Name)
		}
		return cdiclaims.UploadPVCImage(dv.Name), fmt.Sprintf("DataVolume %s/%s is not ready for its upload yet: wait for its phase UploadReady", ns, dv.Name), nil
	case !apierrors.IsNotFound(err):
		return "", "", err
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if err := kube.Get(ctx, client.ObjectKey{Namespace: ns, Name: pvcName}, pvc); apierrors.IsNotFound(err) {
		return "", "", uploadproxy.Fail(http.StatusNotFound, "no DataVolume or PVC %s/%s: diskpipe takes CDI uploads to a DataVolume of source upload "+
			"(virtctl image-upload dv) or to a PVC made for one (virtctl image-upload pvc)", ns, pvcName)
	} else if err != nil {
		return "", "", err
	}
	if !cdiclaims.IsUploadPVC(pvc) {
		return "", "", uploadproxy.Fail(http.StatusConflict, "PVC %s/%s does not take uploads: it was not made for one (virtctl image-upload pvc NAME --size ... makes one)", ns, pvcName)
	}
	if pvc.Annotations[cdiclaims.AnnPodPhase] == string(corev1.PodSucceeded) {
		return "", "", uploadproxy.Fail(http.StatusConflict, "PVC %s/%s is already uploaded", ns, pvcName)
	}
	return cdiclaims.UploadPVCImage(pvc.Name), fmt.Sprintf("PVC %s/%s is not ready for its upload yet: wait for its annotation %s: \"true\"", ns, pvcName, cdiclaims.AnnPodReady), nil
}
