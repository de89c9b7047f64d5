package gateway

import (
	"context"
	"sync"

	authorizationv1 "k8s.io/api/authorization/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// action says whether the caller may take an action, and if not, why.
type action struct {
	Allowed bool   `json:"allowed"`
	Reason  string `json:"reason,omitempty"`
}

// itemVerbs are the actions a list item's hints say, by the verb RBAC names.
var itemVerbs = []string{"get", "update", "delete"}

// hints asks the apiserver, as the caller (SelfSubjectAccessReviews), what they may do with a
// kind in a namespace, once per pair in a request; an answer it cannot get is a refusal that
// says so, never a permission. They are hints for a page: the apiserver still decides each
// request.
type hints struct {
	c    client.Client
	user string

	mu   sync.Mutex
	seen map[hintKey]action
}

type hintKey struct {
	verb, ns string
	k        kind
}

func newHints(c client.Client, user string) *hints {
	return &hints{c: c, user: user, seen: map[hintKey]action{}}
}

// may says whether the caller may verb k in ns.
func (h *hints) may(ctx context.Context, verb string, k kind, ns string) action {
	key := hintKey{verb, ns, k}
	h.mu.Lock()
	a, ok := h.seen[key]
	h.mu.Unlock()
	if ok {
		return a
	}
	gvr := k.gvr()
	r := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: gvr.Group, Resource: gvr.Resource}}}
	switch err := h.c.Create(ctx, r); {
	case err != nil:
		a = action{Reason: "the apiserver could not say whether " + h.user + " may " + verb + " " + k.qualified() + ": " + err.Error()}
	case r.Status.Allowed:
		a = action{Allowed: true}
	default:
		a = action{Reason: denyReason(h.user, verb, k, ns)}
		if r.Status.Reason != "" {
			a.Reason += ": " + r.Status.Reason
		}
	}
	h.mu.Lock()
	h.seen[key] = a
	h.mu.Unlock()
	return a
}

// of are the item actions the caller may take on k in ns.
func (h *hints) of(ctx context.Context, k kind, ns string) map[string]action {
	out := map[string]action{}
	for _, verb := range itemVerbs {
		out[verb] = h.may(ctx, verb, k, ns)
	}
	return out
}
