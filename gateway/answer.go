package gateway

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// envelope is every answer, as the seed's gateway wraps them.
type envelope struct {
	Data    any    `json:"data"`
	Total   *int   `json:"total,omitempty"`
	Message string `json:"message"`
	// Reason is the API's reason of a refusal (Forbidden, NotFound, AlreadyExists, Invalid, ...).
	Reason  string `json:"reason,omitempty"`
	TraceID string `json:"traceID"`
	AuditID string `json:"auditID,omitempty"`
	// Actions are, on a list, what the caller may do beside its items (create), by verb.
	Actions map[string]action `json:"actions,omitempty"`
	// Unreachable are, on a list across clusters, those that could not be asked, and why.
	Unreachable map[string]string `json:"unreachable,omitempty"`
}

// HeaderDenyReason says, on a 403, what right the caller lacks.
const HeaderDenyReason = "X-Deny-Reason"

// HeaderTraceID carries a request's trace id, given by the client or made by the gateway.
const HeaderTraceID = "X-Trace-Id"

// failure is an answer that is not a success: its status, the API's reason, a message a person
// can act on, and for a 403 the right lacked.
type failure struct {
	status  int
	reason  string
	message string
	deny    string
}

func (f *failure) Error() string { return f.message }

// fail is a failure of status.
func fail(status int, reason, format string, args ...any) *failure {
	return &failure{status: status, reason: reason, message: fmt.Sprintf(format, args...)}
}

// refusal is err as the caller is answered: the apiserver's status and reason kept, a 403
// naming the verb on what, in ns ("" for all namespaces), that user lacks.
func refusal(err error, user, verb string, k kind, ns string) *failure {
	if f := (*failure)(nil); errors.As(err, &f) {
		return f
	}
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return fail(http.StatusBadGateway, "ServiceUnavailable", "the apiserver could not be asked: %v", err)
	}
	s := st.Status()
	f := &failure{status: int(s.Code), reason: string(s.Reason), message: s.Message}
	if f.status == 0 {
		f.status = http.StatusInternalServerError
	}
	if s.Reason == metav1.StatusReasonForbidden {
		f.deny = denyReason(user, verb, k, ns)
	}
	return f
}

// denyReason says that user may not verb k's resource in ns.
func denyReason(user, verb string, k kind, ns string) string {
	where := "in namespace " + ns
	if ns == "" {
		where = "in all namespaces"
	}
	return fmt.Sprintf("%s may not %s %s %s", user, verb, k.qualified(), where)
}

// traceIDs are what a client may give as its trace id: 8 to 64 of [0-9A-Za-z-].
var traceIDs = regexp.MustCompile(`^[0-9A-Za-z-]{8,64}$`)

// traceID is r's trace id: its X-Trace-Id or the trace of its traceparent when well formed,
// else a new one.
func traceID(r *http.Request) string {
	if id := r.Header.Get(HeaderTraceID); traceIDs.MatchString(id) {
		return id
	}
	if tp := r.Header.Get("traceparent"); len(tp) == 55 && traceIDs.MatchString(tp[3:35]) {
		return tp[3:35]
	}
	return newID()
}

// newID is 16 random bytes in hex.
func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// write answers w with status and e as JSON.
func write(w http.ResponseWriter, status int, e envelope) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(HeaderTraceID, e.TraceID)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(e)
}

// writeFailure answers w with f.
func writeFailure(w http.ResponseWriter, f *failure, trace, audit string) {
	if f.deny != "" {
		w.Header().Set(HeaderDenyReason, f.deny)
	}
	write(w, f.status, envelope{Message: f.message, Reason: f.reason, TraceID: trace, AuditID: audit})
}
