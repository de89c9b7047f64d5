package gateway

import (
	"context"
	"slices"
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
// says so, never a permission. What the namespace refuses, a rule naming objects
// (resourceNames) may still allow for one of them: those are read once per namespace
// (SelfSubjectRulesReview) and matched to each object's name. They are hints for a page: the
// apiserver still decides each request.
type hints struct {
	c    client.Client
	user string

	mu    sync.Mutex
	seen  map[hintKey]action
	rules map[string][]authorizationv1.ResourceRule // by namespace: the caller's rules that name objects
}

type hintKey struct {
	verb, ns string
	k        kind
}

func newHints(c client.Client, user string) *hints {
	return &hints{c: c, user: user, seen: map[hintKey]action{}, rules: map[string][]authorizationv1.ResourceRule{}}
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

// of are the item actions the caller may take on the object name of k in ns.
func (h *hints) of(ctx context.Context, k kind, ns, name string) map[string]action {
	out := map[string]action{}
	for _, verb := range itemVerbs {
		a := h.may(ctx, verb, k, ns)
		if !a.Allowed && name != "" && h.named(ctx, ns, verb, k, name) {
			a = action{Allowed: true}
		}
		out[verb] = a
	}
	return out
}

// named says whether one of the caller's rules in ns that name objects allows verb on the
// object name of k.
func (h *hints) named(ctx context.Context, ns, verb string, k kind, name string) bool {
	h.mu.Lock()
	rules, ok := h.rules[ns]
	h.mu.Unlock()
	if !ok {
		r := &authorizationv1.SelfSubjectRulesReview{Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: ns}}
		if err := h.c.Create(ctx, r); err == nil { // none read: the namespace's refusal stands
			for _, rule := range r.Status.ResourceRules {
				if len(rule.ResourceNames) > 0 {
					rules = append(rules, rule)
				}
			}
		}
		h.mu.Lock()
		h.rules[ns] = rules
		h.mu.Unlock()
	}
	gvr := k.gvr()
	for _, r := range rules {
		if anyOf(r.Verbs, verb) && anyOf(r.APIGroups, gvr.Group) && anyOf(r.Resources, gvr.Resource) && slices.Contains(r.ResourceNames, name) {
			return true
		}
	}
	return false
}

// anyOf says whether a rule's list holds v, or RBAC's wildcard.
func anyOf(list []string, v string) bool {
	return slices.Contains(list, v) || slices.Contains(list, "*")
}
