package uploadproxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
	"github.com/diskpipe/diskpipe/internal/uploadproto"
	"github.com/diskpipe/diskpipe/internal/uploadtoken"
)

// Resources are the images' resources by kind (uploadproto's).
var Resources = uploadproto.Resources

// Image is what an upload needs of its image.
type Image struct {
	UID      string
	Checksum string
}

// GetImage reads the image an upload is for: a *httpError (404, 409) when there is none or
// it does not take uploads.
func GetImage(ctx context.Context, c client.Reader, ns, resource, name string) (Image, error) {
	var (
		obj client.Object
		src func() (*common.UploadSource, common.Checksum)
	)
	switch resource {
	case "imagetemplates":
		t := &virtualmachine.ImageTemplate{}
		obj, src = t, func() (*common.UploadSource, common.Checksum) { return t.Spec.Source.Upload, t.Spec.Source.Checksum }
	case "virtualmachineimages":
		v := &hypercloud.VirtualMachineImage{}
		obj, src = v, func() (*common.UploadSource, common.Checksum) { return v.Spec.Source.Upload, v.Spec.Source.Checksum }
	default:
		return Image{}, Fail(http.StatusNotFound, "%s is not an image resource", resource)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return Image{}, Fail(http.StatusNotFound, "%s %s/%s does not exist", resource, ns, name)
		}
		return Image{}, err
	}
	if obj.GetDeletionTimestamp() != nil {
		return Image{}, Fail(http.StatusConflict, "%s %s/%s is being deleted: it takes no upload", resource, ns, name)
	}
	upload, sum := src()
	if upload == nil {
		return Image{}, Fail(http.StatusConflict, "%s %s/%s does not take uploads: its source is not upload", resource, ns, name)
	}
	return Image{UID: string(obj.GetUID()), Checksum: string(sum)}, nil
}

// MayUpload asks the apiserver whether user may `create` the image's `upload` subresource;
// a refusal is a *httpError (403) naming the right.
func MayUpload(ctx context.Context, c client.Client, user authenticationv1.UserInfo, ns, resource, name string) error {
	group := hypercloud.GroupVersion.Group
	if resource == "imagetemplates" {
		group = virtualmachine.GroupVersion.Group
	}
	return review(ctx, c, user, &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "create", Group: group,
		Resource: resource, Subresource: "upload", Name: name},
		fmt.Sprintf("%s may not upload to %s %s/%s: it needs create on %s/upload", user.Username, resource, ns, name, resource))
}

// caller is who sends a request: a Kubernetes user, or the holder of an upload token for
// one image (uid).
type caller struct {
	user string
	uid  string
}

// authorize learns who the caller is and checks their right to upload to the image: an
// upload token (checked here, the right having been checked when it was issued), or a
// Kubernetes bearer token (a TokenReview and a SubjectAccessReview).
func (s *Server) authorize(ctx context.Context, r *http.Request, ns, resource, name string) (caller, error) {
	bearer, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	token := r.Header.Get(uploadtoken.Header)
	if token == "" && strings.HasPrefix(bearer, uploadtoken.Prefix) {
		token = bearer
	}
	if token != "" {
		c, err := s.verify(ctx, token)
		if err != nil {
			return caller{}, err
		}
		if c.Namespace != ns || c.Resource != resource || c.Name != name {
			return caller{}, Fail(http.StatusForbidden, "the upload token is for %s %s/%s, not %s %s/%s", c.Resource, c.Namespace, c.Name, resource, ns, name)
		}
		return caller{user: c.User, uid: c.UID}, nil
	}
	if bearer == "" {
		return caller{}, Fail(http.StatusUnauthorized, "an upload token (%s header, from kubectl diskpipe upload or an UploadTokenRequest) or an Authorization: Bearer <token> header with a Kubernetes token is required", uploadtoken.Header)
	}
	s.reviewsOnce.Do(func() { s.reviews = newReviews(s.Kube, s.Tokens) })
	user, err := s.reviews.user(ctx, bearer)
	if err != nil {
		return caller{}, err
	}
	if err := MayUpload(ctx, s.Kube, user, ns, resource, name); err != nil {
		return caller{}, err
	}
	return caller{user: user.Username}, nil
}

// TokenClaims are the claims of the upload token a door's request bears (Authorization:
// Bearer <token>), verified.
func (s *Server) TokenClaims(ctx context.Context, r *http.Request) (uploadtoken.Claims, error) {
	token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if token == "" {
		return uploadtoken.Claims{}, Fail(http.StatusUnauthorized, "an upload token is required (Authorization: Bearer <token>, from an UploadTokenRequest)")
	}
	return s.verify(ctx, token)
}

// verify checks an upload token and returns its claims.
func (s *Server) verify(ctx context.Context, token string) (uploadtoken.Claims, error) {
	if s.TokenKey == nil {
		return uploadtoken.Claims{}, Fail(http.StatusUnauthorized, "this upload proxy takes no upload tokens (it was started without --token-secret): use a Kubernetes token")
	}
	key, err := s.TokenKey.Get(ctx)
	if err != nil {
		return uploadtoken.Claims{}, fmt.Errorf("reading the upload token key: %w", err)
	}
	c, err := uploadtoken.Verify(key, token, time.Now())
	if err != nil {
		return uploadtoken.Claims{}, Fail(http.StatusUnauthorized, "%v", err)
	}
	return c, nil
}

// httpError is a failure with its status code.
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

// Fail is an error answered with code (the proxy's, a door's, the token API's).
func Fail(code int, format string, args ...any) error {
	return &httpError{code: code, msg: fmt.Sprintf(format, args...)}
}

// StatusOf is the HTTP status of an error of this package (500 for others).
func StatusOf(err error) int {
	var he *httpError
	if errors.As(err, &he) {
		return he.code
	}
	return http.StatusInternalServerError
}
