package uploadproxy

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	uploadapi "github.com/diskpipe/diskpipe/apis/upload/v1alpha1"
	"github.com/diskpipe/diskpipe/internal/uploadtoken"
	"github.com/diskpipe/diskpipe/objectstore"
)

// TokenAPI serves upload.diskpipe.io/v1alpha1 as an aggregated API (registered with an
// APIService, served by the manager): creating an UploadTokenRequest returns a token for the
// upload proxy when the user may create the image's upload subresource; creating an
// ObjectStoreKeysRequest writes the namespace's keys of the bundled store into a Secret. The apiserver
// authenticates the user with whatever credential their kubeconfig holds, checks their right
// to create uploadtokenrequests, and forwards the request; Auth believes the user it names only
// from the apiserver's front-proxy certificate. Nothing is stored: a request returns its
// token, and there is nothing to get, list or delete.
type TokenAPI struct {
	Auth *FrontProxy
	// Client makes SubjectAccessReviews; Reader reads images from the apiserver, not a cache:
	// a user asks for a token right after making the image.
	Client client.Client
	Reader client.Reader
	// Key signs the tokens.
	Key *uploadtoken.Key
	// URL is the upload proxy's address outside the cluster; empty when it has none.
	URL string
	// Service is the upload proxy's Service.
	Service *uploadapi.ProxyService
	// Lifetime of a token (default uploadtoken.Lifetime).
	Lifetime time.Duration
	// Store, the bundled store's client with its root keys, makes namespaces' accounts for
	// ObjectStoreKeysRequests (storekeys.go); nil: the installation has none. StoreEndpoint is
	// its address for users.
	Store         *objectstore.Client
	StoreEndpoint string
	// Groups are further API groups of requests served beside upload.diskpipe.io: CDI's
	// upload.cdi.kubevirt.io (uploadproxy/cdiupload), with CDI's API served.
	Groups []RequestGroup
}

// TokenAPIPaths are the paths TokenAPI answers under (register it for each).
var TokenAPIPaths = []string{"/apis", "/apis/"}

// A RequestGroup is an API group of requests that are only created, each answered at once:
// nothing is stored.
type RequestGroup struct {
	GroupVersion schema.GroupVersion
	// Requests answer the creation of each kind (its resource: the kind in lower case, plural)
	// by user in namespace ns, of the object body holds.
	Requests map[string]func(ctx context.Context, ns string, body []byte, user authenticationv1.UserInfo) (any, error)
}

// TokenAPIService is the name of the APIService that registers TokenAPI with the apiserver.
var TokenAPIService = APIServiceName(uploadapi.GroupVersion)

// APIServiceName is the name of the APIService of gv.
func APIServiceName(gv schema.GroupVersion) string { return gv.Version + "." + gv.Group }

// maxRequestBody bounds what is read of a request: an UploadTokenRequest is a few hundred bytes.
const maxRequestBody = 64 << 10

func (a *TokenAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	user, err := a.Auth.Authenticate(ctx, r)
	if err != nil {
		writeStatus(ctx, w, err)
		return
	}
	own := RequestGroup{GroupVersion: uploadapi.GroupVersion, Requests: map[string]func(context.Context, string, []byte, authenticationv1.UserInfo) (any, error){
		"UploadTokenRequest": func(ctx context.Context, ns string, body []byte, user authenticationv1.UserInfo) (any, error) {
			req := &uploadapi.UploadTokenRequest{}
			if err := decode(body, req, ns, &req.TypeMeta, &req.ObjectMeta); err != nil {
				return nil, err
			}
			return req, a.token(ctx, ns, req, user)
		},
		"ObjectStoreKeysRequest": func(ctx context.Context, ns string, body []byte, user authenticationv1.UserInfo) (any, error) {
			req := &uploadapi.ObjectStoreKeysRequest{}
			if err := decode(body, req, ns, &req.TypeMeta, &req.ObjectMeta); err != nil {
				return nil, err
			}
			return req, a.storeKeys(ctx, ns, req, user)
		},
	}}
	mux := http.NewServeMux()
	var groups []metav1.APIGroup
	for _, g := range append([]RequestGroup{own}, a.Groups...) {
		groups = append(groups, g.serve(mux, user))
	}
	mux.HandleFunc("GET /apis", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, &metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}, Groups: groups})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeStatus(ctx, w, Fail(http.StatusNotFound, "%s is not served here", r.URL.Path))
	})
	mux.ServeHTTP(w, r)
}

// serve serves g's discovery and its requests for user on mux, and returns g's APIGroup.
func (g RequestGroup) serve(mux *http.ServeMux, user authenticationv1.UserInfo) metav1.APIGroup {
	gv := g.GroupVersion
	group := metav1.APIGroup{TypeMeta: metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}, Name: gv.Group,
		Versions:         []metav1.GroupVersionForDiscovery{{GroupVersion: gv.String(), Version: gv.Version}},
		PreferredVersion: metav1.GroupVersionForDiscovery{GroupVersion: gv.String(), Version: gv.Version}}
	resources := &metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"}, GroupVersion: gv.String()}
	for _, kind := range slices.Sorted(maps.Keys(g.Requests)) {
		answer := g.Requests[kind]
		resource := strings.ToLower(kind) + "s"
		resources.APIResources = append(resources.APIResources, metav1.APIResource{Name: resource, SingularName: strings.ToLower(kind),
			Namespaced: true, Kind: kind, Verbs: metav1.Verbs{"create"}})
		handleCreate(mux, "/apis/"+gv.String()+"/namespaces/{namespace}/"+resource, kind,
			func(ctx context.Context, ns string, body []byte) (any, error) { return answer(ctx, ns, body, user) })
	}
	mux.HandleFunc("GET /apis/"+gv.Group, func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, &group) })
	mux.HandleFunc("GET /apis/"+gv.String(), func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, http.StatusOK, resources) })
	return group
}

// handleCreate serves POST to path (namespaces/{namespace}/...) with answer, the only verb of
// requests of kind.
func handleCreate(mux *http.ServeMux, path, kind string, answer func(ctx context.Context, ns string, body []byte) (any, error)) {
	mux.HandleFunc("POST "+path, func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, maxRequestBody+1))
		if err == nil && len(body) > maxRequestBody {
			err = Fail(http.StatusBadRequest, "the request is larger than %d bytes", maxRequestBody)
		}
		var out any
		if err == nil {
			out, err = answer(r.Context(), r.PathValue("namespace"), body)
		}
		if err != nil {
			writeStatus(r.Context(), w, err)
			return
		}
		writeJSON(w, http.StatusCreated, out)
	})
	mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
		writeStatus(r.Context(), w, Fail(http.StatusMethodNotAllowed, "%ss are only created: none is stored, so there is nothing to get, list or delete", kind))
	})
}

// decode reads a request of kind into obj and completes its metadata as the apiserver would
// for a created object: the namespace of the path, a name from generateName.
func decode(body []byte, obj any, ns string, tm *metav1.TypeMeta, om *metav1.ObjectMeta) error {
	kind := strings.TrimPrefix(fmt.Sprintf("%T", obj), "*v1alpha1.")
	if len(body) > 0 {
		if err := json.Unmarshal(body, obj); err != nil {
			return Fail(http.StatusBadRequest, "invalid %s: %v", kind, err)
		}
	}
	switch {
	case tm.APIVersion != "" && tm.APIVersion != uploadapi.GroupVersion.String(), tm.Kind != "" && tm.Kind != kind:
		return Fail(http.StatusBadRequest, "invalid %s: it is a %s %s, not an %s %s", kind, tm.APIVersion, tm.Kind, uploadapi.GroupVersion, kind)
	case om.Namespace != "" && om.Namespace != ns:
		return Fail(http.StatusBadRequest, "invalid %s: metadata.namespace %q is not the request's namespace %q", kind, om.Namespace, ns)
	}
	tm.APIVersion, tm.Kind = uploadapi.GroupVersion.String(), kind
	om.Namespace, om.CreationTimestamp = ns, metav1.Now()
	if om.Name == "" {
		om.Name = om.GenerateName + utilrand.String(5)
	}
	return nil
}

// token answers an UploadTokenRequest with its token.
func (a *TokenAPI) token(ctx context.Context, ns string, req *uploadapi.UploadTokenRequest, user authenticationv1.UserInfo) error {
	if Resources[req.Spec.Kind] == "" {
		return Fail(http.StatusBadRequest, "invalid UploadTokenRequest: spec.kind %q is not VirtualMachineImage or ImageTemplate", req.Spec.Kind)
	}
	if errs := validation.IsDNS1123Subdomain(req.Spec.Name); len(errs) > 0 {
		return Fail(http.StatusBadRequest, "invalid UploadTokenRequest: spec.name %q: %s", req.Spec.Name, errs[0])
	}
	resource := Resources[req.Spec.Kind]
	img, err := GetImage(ctx, a.Reader, ns, resource, req.Spec.Name)
	if err == nil {
		err = MayUpload(ctx, a.Client, user, ns, resource, req.Spec.Name)
	}
	if err != nil {
		return err
	}
	token, expires, err := a.Key.IssueFor(ctx, uploadtoken.Claims{Namespace: ns, Resource: resource, Name: req.Spec.Name,
		UID: img.UID, User: user.Username}, a.Lifetime)
	if err != nil {
		return err
	}
	req.Status = uploadapi.UploadTokenRequestStatus{Token: token, ExpirationTimestamp: &metav1.Time{Time: expires},
		Path: fmt.Sprintf("/v1/namespaces/%s/%s/%s", ns, resource, req.Spec.Name), URL: a.URL, Service: a.Service}
	return nil
}

// writeStatus answers with err as a Kubernetes Status, which kubectl and client-go show as
// the error's message; errors of no status of this package are logged and answered 500.
func writeStatus(ctx context.Context, w http.ResponseWriter, err error) {
	code := StatusOf(err)
	msg := err.Error()
	if code == http.StatusInternalServerError {
		log.FromContext(ctx).Error(err, "Could not answer an UploadTokenRequest")
	}
	reason := metav1.StatusReasonUnknown
	for c, r := range map[int]metav1.StatusReason{http.StatusBadRequest: metav1.StatusReasonBadRequest,
		http.StatusUnauthorized: metav1.StatusReasonUnauthorized, http.StatusForbidden: metav1.StatusReasonForbidden,
		http.StatusNotFound: metav1.StatusReasonNotFound, http.StatusConflict: metav1.StatusReasonConflict,
		http.StatusMethodNotAllowed: metav1.StatusReasonMethodNotAllowed, http.StatusInternalServerError: metav1.StatusReasonInternalError} {
		if c == code {
			reason = r
		}
	}
	writeJSON(w, code, &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status: metav1.StatusFailure, Message: msg, Reason: reason, Code: int32(code)}) //nolint:gosec // an HTTP status
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	out, err := json.Marshal(v)
	if err != nil {
		code, out = http.StatusInternalServerError, []byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","code":500}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(out)
}

// APIService registers TokenAPI's group gv (upload.diskpipe.io's, or one of Groups) with the
// apiserver, served by the Service namespace/name on port with caBundle (the chart's
// templates/webhook.yaml is the same, a test compares).
func APIService(gv schema.GroupVersion, namespace, name string, port int32, caBundle []byte) *unstructured.Unstructured {
	spec := map[string]any{"group": gv.Group, "version": gv.Version, "groupPriorityMinimum": int64(1000), "versionPriority": int64(15),
		"service": map[string]any{"namespace": namespace, "name": name, "port": int64(port)}}
	if len(caBundle) > 0 {
		spec["caBundle"] = base64.StdEncoding.EncodeToString(caBundle)
	}
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": APIServiceName(gv)}, "spec": spec}}
}
