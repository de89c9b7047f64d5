// Package gateway is the console's REST gateway: the storage half of the KubeSphere
// virtualization plugin's API (seed 002), served under
// /kapis/virtualization.kubesphere.io/v1beta1/ for images and disks of diskpipe's kinds.
//
// Every request is the caller's. Its bearer token is reviewed with the apiserver (TokenReview,
// kept a while and rate-limited: internal/authn), and everything the gateway asks of the
// apiserver for it goes through one transport that impersonates that caller, user, UID,
// groups and extra alike (caller.go). A request with no caller in its context is refused by
// the transport itself, so no route can act with the gateway's own rights; those are used
// only to review tokens and to list the names of namespaces, for the cluster-wide view, whose
// contents are then read as the caller.
//
// Answers are the seed's envelope, {data, total, message, traceID, auditID} (answer.go). A
// refusal keeps the apiserver's status code and reason, and a 403 says in X-Deny-Reason which
// verb on which resource in which namespace the caller lacks. Each item of a list carries the
// actions its caller may take on it, asked of the apiserver with SelfSubjectAccessReviews
// (and the rules that name objects, with a SelfSubjectRulesReview) as the caller (actions.go), so a page disables what would fail and says why. Every change
// writes an audit line (user, namespace, operation, object, outcome, traceID, auditID), and
// every request counts in the gateway's metrics (audit.go).
package gateway
