package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/internal/authn"
)

// Prefix is where the gateway serves its API.
const Prefix = "/kapis/virtualization.kubesphere.io/v1beta1"

// HostCluster is the name of the cluster the gateway runs in, for ?cluster=.
const HostCluster = "host"

// maxBody bounds a create's body.
const maxBody = 1 << 20

// maxNamespaces bounds the namespaces a cluster-wide view reads one by one, for a caller who
// may not list the resource in all namespaces at once.
const maxNamespaces = 512

// Server is the gateway.
type Server struct {
	// Host is the cluster the gateway runs in, where callers' tokens are reviewed (Reviews);
	// Members are those registered with it (LoadMembers), reached with ?cluster=.
	Host    *Cluster
	Members map[string]*Cluster
	// KubeSphere, when set, adds KubeSphere's member clusters (WatchKubeSphere).
	KubeSphere *KubeSphereClusters
	Reviews    *authn.Reviewer
	// Uploads is the upload proxy the console's uploads go to; nil: none are served.
	Uploads *UploadProxy
	// Pages serves the console's pages at /; nil: none.
	Pages http.Handler
	// Origins are the origins of other sites' pages allowed to call the gateway (CORS);
	// none: only pages of the gateway's own origin may, as browsers enforce.
	Origins []string

	// watches counts the watch streams open, by user.
	watches watchSlots
	// Audit gets an audit line for each change; Metrics counts every request.
	Audit   *slog.Logger
	Metrics *Metrics
}

// New is a gateway talking to the apiserver of cfg (its own service account's), with metrics
// registered in m.
func New(cfg *rest.Config, audit *slog.Logger, m *Metrics) (*Server, error) {
	host, err := NewCluster(HostCluster, cfg)
	if err != nil {
		return nil, err
	}
	return &Server{Host: host, Reviews: authn.New(host.Own, "the gateway"), Audit: audit, Metrics: m}, nil
}

// Handler serves the gateway's API, and /healthz.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.Handle("GET "+Prefix+"/projects/{namespace}/{resource}", s.route("list", s.list))
	mux.Handle("POST "+Prefix+"/projects/{namespace}/{resource}", s.route("create", s.create))
	mux.Handle("GET "+Prefix+"/projects/{namespace}/{resource}/{name}", s.route("get", s.get))
	mux.Handle("DELETE "+Prefix+"/projects/{namespace}/{resource}/{name}", s.route("delete", s.remove))
	mux.Handle("GET "+Prefix+"/{resource}", s.route("list", s.list))
	mux.Handle("GET "+Prefix+"/whoami", s.route("get", s.whoami))
	mux.Handle("GET "+Prefix+"/projects/{namespace}/exports/{name}/download", s.routeOf("exports", "get", s.exportDownload))
	mux.Handle("POST "+Prefix+"/projects/{namespace}/uploads", s.routeOf("uploads", "create", s.startUpload))
	mux.Handle("GET "+Prefix+"/projects/{namespace}/uploads/{name}", s.routeOf("uploads", "get", s.uploadState))
	mux.Handle("PUT "+Prefix+"/projects/{namespace}/uploads/{name}", s.routeOf("uploads", "upload", s.uploadPiece))
	mux.Handle("DELETE "+Prefix+"/projects/{namespace}/uploads/{name}", s.routeOf("uploads", "delete", s.remove))
	if s.Pages != nil { // the page, and the files it names (web's build puts them in assets/)
		mux.Handle("GET /{$}", s.Pages)
		mux.Handle("GET /assets/", s.Pages)
	}
	mux.Handle(Prefix+"/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeFailure(w, fail(http.StatusNotFound, "NotFound", "%s %s is not a route of the gateway", r.Method, r.URL.Path), traceID(r), "")
	}))
	return s.cors(mux)
}

// call is one request, authenticated.
type call struct {
	// cl is the cluster the call is for (?cluster=); all says it lists across every one.
	cl        *Cluster
	all       bool
	r         *http.Request
	w         http.ResponseWriter
	bearer    string // the caller's token, which only the upload proxy is given
	user      authenticationv1.UserInfo
	resource  string
	kinds     []kind
	namespace string // "" for the cluster-wide view
	trace     string
	audit     string // the change's audit id; "" for reads
	// namespaces are the cluster's, read once for a cluster-wide view that needs them.
	namespaces *corev1.NamespaceList
}

// handler answers a call with its status and envelope.
type handler func(ctx context.Context, c *call) (int, envelope, error)

// route authenticates the request, checks the path's names, runs h as the caller, and
// answers, counts and audits it; the resource is the path's.
func (s *Server) route(op string, h handler) http.Handler { return s.routeOf("", op, h) }

// routeOf is route for a path that names its resource itself (projects/{namespace}/uploads/...).
func (s *Server) routeOf(resource, op string, h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		c := &call{r: r, w: w, resource: r.PathValue("resource"), namespace: r.PathValue("namespace"), trace: traceID(r)}
		if resource != "" {
			c.resource = resource
		}
		if op == "create" || op == "delete" {
			c.audit = newID()
		}
		status, e, err := s.serve(r.Context(), c, h)
		var f *failure
		if err != nil {
			f = refusal(err, c.user.Username, op, kindOr(c), c.namespace) // an operation is named for its verb
			status = f.status
		}
		if s.Metrics != nil {
			s.Metrics.observe(op, c.resource, status, time.Since(start))
		}
		if c.audit != "" && c.user.Username != "" && s.Audit != nil {
			outcome := "Success"
			if f != nil {
				outcome = "Failure: " + f.message
			}
			s.Audit.Info("audit", "user", c.user.Username, "namespace", c.namespace, "operation", op, "resource", c.resource,
				"name", r.PathValue("name"), "status", status, "outcome", outcome, "traceID", c.trace, "auditID", c.audit)
		}
		if f != nil {
			writeFailure(w, f, c.trace, c.audit)
			return
		}
		if status == answered {
			return
		}
		e.TraceID, e.AuditID = c.trace, c.audit
		write(w, status, e)
	})
}

// answered is the status a handler returns when it wrote its answer itself (a stream).
const answered = -1

// HeaderToken carries the caller's token where Authorization cannot: through the apiserver's
// service proxy, which takes Authorization for itself. A page sends it on every request; a
// header, not a cookie, so that no other site's page can make a browser send it (CSRF).
const HeaderToken = "X-Diskpipe-Token"

// bearerOf is r's token: its Authorization: Bearer, else its X-Diskpipe-Token.
func bearerOf(r *http.Request) string {
	if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && b != "" {
		return b
	}
	return strings.TrimSpace(r.Header.Get(HeaderToken))
}

// serve authenticates c and runs h.
func (s *Server) serve(ctx context.Context, c *call, h handler) (int, envelope, error) {
	// A page of another site can make a browser POST a form (or text/plain) with no preflight,
	// and behind a console that turns its cookie into Authorization (KubeSphere's) it would be
	// sent as its user: a change's body is JSON, and says so, or is refused before anything.
	if mt, _, _ := mime.ParseMediaType(c.r.Header.Get("Content-Type")); c.r.Method == http.MethodPost && mt != "application/json" {
		return 0, envelope{}, fail(http.StatusUnsupportedMediaType, "UnsupportedMediaType", "a change's body is JSON, sent with Content-Type: application/json (not %q): the gateway takes no form, which another site's page could make a browser send", c.r.Header.Get("Content-Type"))
	}
	bearer := bearerOf(c.r)
	if bearer == "" {
		return 0, envelope{}, fail(http.StatusUnauthorized, "Unauthorized", "an Authorization: Bearer <token> header (or, through a proxy that takes Authorization, %s: <token>) with a Kubernetes (or KubeSphere) token is required", HeaderToken)
	}
	c.bearer = bearer
	user, err := s.Reviews.User(ctx, bearer)
	if e := (*authn.Error)(nil); errors.As(err, &e) {
		return 0, envelope{}, fail(e.Status, http.StatusText(e.Status), "%s", e.Message)
	} else if err != nil {
		return 0, envelope{}, fail(http.StatusBadGateway, "ServiceUnavailable", "%v", err)
	}
	c.user = user
	name := c.r.URL.Query().Get("cluster")
	if c.all = name == AllClusters; c.all {
		if c.r.Method != http.MethodGet || c.r.PathValue("name") != "" || c.r.URL.Query().Get("watch") != "" {
			return 0, envelope{}, fail(http.StatusBadRequest, "BadRequest", "?cluster=%s is for lists: name one cluster (%s) for anything else", AllClusters, strings.Join(s.clusterNames(), ", "))
		}
		c.cl = s.Host
	} else if c.cl, err = s.clusterOf(name); err != nil {
		return 0, envelope{}, err
	}
	if c.resource == "" { // a route of no resource: whoami
		return h(withCaller(ctx, user), c)
	}
	if c.kinds = resources[c.resource]; c.kinds == nil {
		return 0, envelope{}, fail(http.StatusNotFound, "NotFound", "the gateway serves no resource %q: it serves %s", c.resource, strings.Join(resourceNames(), ", "))
	}
	if c.namespace != "" {
		if errs := validation.IsDNS1123Label(c.namespace); len(errs) > 0 {
			return 0, envelope{}, fail(http.StatusBadRequest, "BadRequest", "%q is not a namespace's name: %s", c.namespace, strings.Join(errs, "; "))
		}
	}
	if name := c.r.PathValue("name"); name != "" {
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return 0, envelope{}, fail(http.StatusBadRequest, "BadRequest", "%q is not an object's name: %s", name, strings.Join(errs, "; "))
		}
	}
	if k := c.r.URL.Query().Get("kind"); k != "" {
		one, ok := kindNamed(c.kinds, k)
		if !ok {
			return 0, envelope{}, fail(http.StatusBadRequest, "BadRequest", "the %s are of the kinds %s, not %q", c.resource, strings.Join(kindNames(c.kinds), ", "), k)
		}
		c.kinds = []kind{one}
	}
	return h(withCaller(ctx, user), c)
}

// whoami answers who the caller is, as the apiserver's TokenReview says, and the clusters
// the gateway serves (what the caller may do in each is each cluster's to say).
func (s *Server) whoami(_ context.Context, c *call) (int, envelope, error) {
	return http.StatusOK, envelope{Data: map[string]any{"username": c.user.Username, "groups": c.user.Groups, "clusters": s.clusterNames()}}, nil
}

// item is one object of an answer: the cluster it is in, its kind, the object as the
// apiserver gave it, and what the caller may do with it.
type item struct {
	Cluster string            `json:"cluster"`
	Kind    string            `json:"kind"`
	Object  map[string]any    `json:"object"`
	Actions map[string]action `json:"actions"`
}

// list lists c's resource, of every kind of it the caller may list, filtered, sorted and
// paged; a kind they may not list is left out and said in the message (all of them: 403).
func (s *Server) list(ctx context.Context, c *call) (int, envelope, error) {
	q := c.r.URL.Query()
	if q.Get("watch") == "true" {
		return s.watch(ctx, c)
	}
	var sel labels.Selector
	if ls := q.Get("labelSelector"); ls != "" {
		var err error
		if sel, err = labels.Parse(ls); err != nil {
			return 0, envelope{}, fail(http.StatusBadRequest, "BadRequest", "labelSelector: %v", err)
		}
	}
	page, limit, err := paging(q.Get("page"), q.Get("limit"))
	if err != nil {
		return 0, envelope{}, err
	}
	clusters := []*Cluster{c.cl}
	unreachable := map[string]string{}
	if c.all {
		clusters = []*Cluster{s.Host}
		for _, m := range s.members() {
			clusters = append(clusters, m)
		}
		slices.SortFunc(clusters[1:], func(a, b *Cluster) int { return strings.Compare(a.Name, b.Name) })
		maps.Copy(unreachable, s.brokenMembers())
	}
	var items []item
	var left []string
	var firstRefusal error
	refused, failed := 0, 0
	hints := map[string]*hints{}
	for _, cl := range clusters {
		c.cl, c.namespaces = cl, nil
		hints[cl.Name] = newHints(cl.AsCaller, c.user.Username)
		got, l, refusal, err := s.listCluster(ctx, c, sel)
		switch {
		case err != nil && !c.all:
			return 0, envelope{}, err
		case err != nil:
			unreachable[cl.Name] = clip(err.Error())
			failed++
			continue
		case refusal != nil:
			refused++
			if firstRefusal == nil {
				firstRefusal = refusal
			}
		}
		for _, reason := range l {
			if c.all {
				reason = cl.Name + ": " + reason
			}
			left = append(left, reason)
		}
		items = append(items, got...)
	}
	if refused+failed == len(clusters) && firstRefusal != nil {
		return 0, envelope{}, firstRefusal
	}
	if err := sortItems(items, q.Get("sortBy"), q.Get("ascending")); err != nil {
		return 0, envelope{}, err
	}
	total := len(items)
	if limit > 0 {
		from := min((page-1)*limit, total)
		items = items[from:min(from+limit, total)]
	}
	for i := range items { // the page's only: each cluster, namespace and kind asked once
		k, _ := kindNamed(c.kinds, items[i].Kind)
		items[i].Actions = hints[items[i].Cluster].of(ctx, k, metaString(items[i].Object, "namespace"), metaString(items[i].Object, "name"))
	}
	e := envelope{Data: nonNil(items), Total: &total}
	if len(unreachable) > 0 {
		e.Unreachable = unreachable
	}
	if len(left) > 0 {
		e.Message = "not shown: " + strings.Join(left, "; ")
	}
	if len(unreachable) > 0 {
		var names []string
		for n := range unreachable {
			names = append(names, n)
		}
		slices.Sort(names)
		e.Message = strings.TrimPrefix(e.Message+"; not reached: "+strings.Join(names, ", "), "; ")
	}
	if c.namespace != "" && !c.all {
		h := hints[c.cl.Name]
		e.Actions = map[string]action{}
		for _, k := range c.kinds {
			e.Actions["create "+k.gvk.Kind] = h.may(ctx, "create", k, c.namespace)
		}
	}
	return http.StatusOK, e, nil
}

// listCluster lists c's resource in c's cluster, of each of its kinds the caller may list
// there: the items, the kinds left out and why, the refusal when every kind was refused, or
// an error of the cluster's (it could not be asked).
func (s *Server) listCluster(ctx context.Context, c *call, sel labels.Selector) ([]item, []string, error, error) {
	q := c.r.URL.Query()
	var items []item
	var left []string
	var firstRefusal error
	for _, k := range c.kinds {
		objs, err := s.listKind(ctx, c, k, sel)
		if apierrors.IsForbidden(err) {
			left = append(left, denyReason(c.user.Username, "list", k, c.namespace))
			if firstRefusal == nil {
				firstRefusal = refusal(err, c.user.Username, "list", k, c.namespace)
			}
			continue
		} else if err != nil {
			return nil, nil, nil, refusal(err, c.user.Username, "list", k, c.namespace)
		}
		for _, o := range objs {
			if name := q.Get("name"); name != "" && !strings.Contains(o.GetName(), name) {
				continue
			}
			if _, upload, _ := unstructured.NestedMap(o.Object, "spec", "source", "upload"); c.resource == "uploads" && !upload {
				continue
			}
			items = append(items, item{Cluster: c.cl.Name, Kind: k.gvk.Kind, Object: o.Object})
		}
	}
	if len(left) < len(c.kinds) {
		firstRefusal = nil
	}
	return items, left, firstRefusal, nil
}

// listKind lists k as the caller, in c's namespace or in all: at once where the caller may,
// else namespace by namespace (their names read with the gateway's rights), keeping those the
// caller may list. Forbidden when they may list it in none.
func (s *Server) listKind(ctx context.Context, c *call, k kind, sel labels.Selector) ([]unstructured.Unstructured, error) {
	opts := []client.ListOption{}
	if sel != nil {
		opts = append(opts, client.MatchingLabelsSelector{Selector: sel})
	}
	one := func(ns string) ([]unstructured.Unstructured, error) {
		l := &unstructured.UnstructuredList{}
		l.SetGroupVersionKind(k.gvk.GroupVersion().WithKind(k.gvk.Kind + "List"))
		if err := c.cl.AsCaller.List(ctx, l, append(opts, client.InNamespace(ns))...); err != nil {
			return nil, err
		}
		return l.Items, nil
	}
	all, err := one(c.namespace)
	if c.namespace != "" || !apierrors.IsForbidden(err) {
		return all, err
	}
	if c.namespaces == nil { // once a request, for all of its kinds
		nss := &corev1.NamespaceList{}
		if err := c.cl.Own.List(ctx, nss); err != nil {
			return nil, fail(http.StatusBadGateway, "ServiceUnavailable", "the gateway could not list the namespaces to look in: %v", err)
		}
		c.namespaces = nss
	}
	nss := c.namespaces
	if len(nss.Items) > maxNamespaces {
		return nil, fail(http.StatusForbidden, "Forbidden", "%s may not list %s in all namespaces, and the cluster has more namespaces than the %d the gateway looks in one by one: ask in a namespace (projects/{namespace}/%s)",
			c.user.Username, k.qualified(), maxNamespaces, c.resource)
	}
	var out []unstructured.Unstructured
	some := false
	for _, ns := range nss.Items {
		got, err := one(ns.Name)
		if apierrors.IsForbidden(err) {
			continue
		} else if err != nil {
			return nil, err
		}
		some = true
		out = append(out, got...)
	}
	if !some {
		return nil, err // the first refusal, for all namespaces
	}
	return out, nil
}

// get reads one object as the caller: of ?kind=, else of whichever of the resource's kinds
// holds the name (two that both do: 409, say which).
func (s *Server) get(ctx context.Context, c *call) (int, envelope, error) {
	o, k, err := s.find(ctx, c)
	if err != nil {
		return 0, envelope{}, err
	}
	h := newHints(c.cl.AsCaller, c.user.Username)
	return http.StatusOK, envelope{Data: item{Cluster: c.cl.Name, Kind: k.gvk.Kind, Object: o.Object, Actions: h.of(ctx, k, c.namespace, c.r.PathValue("name"))}}, nil
}

// find reads the object of c's name.
func (s *Server) find(ctx context.Context, c *call) (*unstructured.Unstructured, kind, error) {
	name := c.r.PathValue("name")
	var found []*unstructured.Unstructured
	var kinds []kind
	var refused error
	for _, k := range c.kinds {
		o := &unstructured.Unstructured{}
		o.SetGroupVersionKind(k.gvk)
		switch err := c.cl.AsCaller.Get(ctx, client.ObjectKey{Namespace: c.namespace, Name: name}, o); {
		case err == nil:
			found, kinds = append(found, o), append(kinds, k)
		case apierrors.IsNotFound(err):
		case apierrors.IsForbidden(err):
			if refused == nil {
				refused = refusal(err, c.user.Username, "get", k, c.namespace)
			}
		default:
			return nil, kind{}, refusal(err, c.user.Username, "get", k, c.namespace)
		}
	}
	switch {
	case len(found) == 1:
		return found[0], kinds[0], nil
	case len(found) > 1:
		return nil, kind{}, fail(http.StatusConflict, "Conflict", "%s/%s is both a %s and a %s: say which with ?kind=", c.namespace, name, kinds[0].gvk.Kind, kinds[1].gvk.Kind)
	case refused != nil:
		return nil, kind{}, refused
	}
	return nil, kind{}, fail(http.StatusNotFound, "NotFound", "there is no %s named %s in namespace %s", strings.Join(kindNames(c.kinds), " or "), name, c.namespace)
}

// create makes the object of the body, as the caller, in the path's namespace.
func (s *Server) create(ctx context.Context, c *call) (int, envelope, error) {
	o, k, err := s.decode(c)
	if err != nil {
		return 0, envelope{}, err
	}
	return s.createAs(ctx, c, o, k)
}

// createAs makes o, of kind k, as the caller.
func (s *Server) createAs(ctx context.Context, c *call, o *unstructured.Unstructured, k kind) (int, envelope, error) {
	c.kinds = []kind{k}
	if err := c.cl.AsCaller.Create(ctx, o); err != nil {
		return 0, envelope{}, refusal(err, c.user.Username, "create", k, c.namespace)
	}
	h := newHints(c.cl.AsCaller, c.user.Username)
	return http.StatusCreated, envelope{Data: item{Cluster: c.cl.Name, Kind: k.gvk.Kind, Object: o.Object, Actions: h.of(ctx, k, c.namespace, o.GetName())}}, nil
}

// remove deletes the object of c's name, as the caller. With the resource's kinds to choose
// from, a name both hold is refused (409, say which); otherwise each kind is asked to delete
// it, so that the apiserver's answer, which refuses a caller without the right before it
// looks for the object, is the caller's answer.
func (s *Server) remove(ctx context.Context, c *call) (int, envelope, error) {
	if len(c.kinds) > 1 {
		// Which kind holds the name, where the caller may read it; the delete itself is the
		// apiserver's to allow or refuse.
		_, k, err := s.find(ctx, c)
		if f := (*failure)(nil); errors.As(err, &f) && f.status == http.StatusConflict {
			return 0, envelope{}, err
		} else if err == nil {
			c.kinds = []kind{k}
		}
	}
	name := c.r.PathValue("name")
	var refused error
	for _, k := range c.kinds {
		o := &unstructured.Unstructured{}
		o.SetGroupVersionKind(k.gvk)
		o.SetNamespace(c.namespace)
		o.SetName(name)
		switch err := c.cl.AsCaller.Delete(ctx, o); {
		case err == nil:
			c.kinds = []kind{k}
			return http.StatusOK, envelope{Data: item{Cluster: c.cl.Name, Kind: k.gvk.Kind, Object: o.Object},
				Message: "deleting " + k.gvk.Kind + " " + c.namespace + "/" + name}, nil
		case apierrors.IsNotFound(err):
		case apierrors.IsForbidden(err):
			if refused == nil {
				refused = refusal(err, c.user.Username, "delete", k, c.namespace)
			}
		default:
			return 0, envelope{}, refusal(err, c.user.Username, "delete", k, c.namespace)
		}
	}
	if refused != nil {
		return 0, envelope{}, refused
	}
	return 0, envelope{}, fail(http.StatusNotFound, "NotFound", "there is no %s named %s in namespace %s", strings.Join(kindNames(c.kinds), " or "), name, c.namespace)
}

// paging reads ?page= (from 1) and ?limit= (0: all).
func paging(page, limit string) (int, int, error) {
	p, l := 1, 0
	var err error
	if page != "" {
		if p, err = strconv.Atoi(page); err != nil || p < 1 {
			return 0, 0, fail(http.StatusBadRequest, "BadRequest", "page is a whole number from 1, not %q", page)
		}
	}
	if limit != "" {
		if l, err = strconv.Atoi(limit); err != nil || l < 1 || l > 1000 {
			return 0, 0, fail(http.StatusBadRequest, "BadRequest", "limit is a whole number from 1 to 1000, not %q", limit)
		}
	}
	return p, l, nil
}

// sortItems sorts items by ?sortBy=: createTime (the default), newest first unless
// ?ascending=true; or name, a to z unless ?ascending=false; then by namespace and name.
func sortItems(items []item, by, ascending string) error {
	key := func(i item) string { return metaString(i.Object, "creationTimestamp") }
	up := ascending == "true"
	switch by {
	case "", "createTime":
	case "name":
		key = func(i item) string { return metaString(i.Object, "name") }
		up = ascending != "false"
	default:
		return fail(http.StatusBadRequest, "BadRequest", "sortBy is createTime or name, not %q", by)
	}
	slices.SortStableFunc(items, func(a, b item) int {
		c := strings.Compare(key(a), key(b))
		if !up {
			c = -c
		}
		if c == 0 {
			c = strings.Compare(metaString(a.Object, "namespace")+"/"+metaString(a.Object, "name"), metaString(b.Object, "namespace")+"/"+metaString(b.Object, "name"))
		}
		return c
	})
	return nil
}

func metaString(o map[string]any, field string) string {
	s, _, _ := unstructured.NestedString(o, "metadata", field)
	return s
}

func nonNil(items []item) []item {
	if items == nil {
		return []item{}
	}
	return items
}

func resourceNames() []string {
	var out []string
	for r := range resources {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

func kindNames(ks []kind) []string {
	var out []string
	for _, k := range ks {
		out = append(out, k.gvk.Kind)
	}
	return out
}

func kindAPIs(ks []kind) []string {
	var out []string
	for _, k := range ks {
		out = append(out, fmt.Sprintf("%s %s", k.gvk.GroupVersion(), k.gvk.Kind))
	}
	return out
}

// kindOr is c's one kind, for a refusal's message; the first of its resource's otherwise.
func kindOr(c *call) kind {
	if len(c.kinds) > 0 {
		return c.kinds[0]
	}
	return kind{}
}

// clip is a member's error as callers see it: what a member's server answered is its own, at
// most a line's worth.
func clip(msg string) string {
	const most = 300
	if len(msg) <= most {
		return msg
	}
	return strings.ToValidUTF8(msg[:most], "") + "…"
}
