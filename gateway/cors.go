package gateway

import (
	"net/http"
	"slices"
	"strings"

	"github.com/diskpipe/diskpipe/internal/uploadproto"
)

// corsHeaders are the request headers a page of an allowed origin may send, and those it may read.
var (
	corsAllowed = []string{"Authorization", HeaderToken, "Content-Type", "Content-Range", uploadproto.HeaderDigest, HeaderTraceID, "traceparent"}
	corsExposed = []string{HeaderDenyReason, HeaderTraceID, uploadproto.HeaderOffset, uploadproto.HeaderComplete, uploadproto.HeaderPartSize, uploadproto.HeaderLength, "Retry-After"}
)

// cors lets pages of s.Origins call the gateway, and no other site's: a request from another
// origin gets no CORS headers, so the browser keeps its answer from the page, and its
// preflight is refused. The gateway's own pages need none of it.
func (s *Server) cors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		allowed := origin != "" && slices.Contains(s.Origins, origin)
		w.Header().Add("Vary", "Origin") // a cache must not give one origin's answer to another
		if allowed {
			w.Header().Set("Access-Control-Allow-Origin", origin)
			w.Header().Set("Access-Control-Expose-Headers", strings.Join(corsExposed, ", "))
		}
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			if !allowed {
				http.Error(w, "the origin "+origin+" is not one the gateway takes calls from (gateway.corsOrigins)", http.StatusForbidden)
				return
			}
			w.Header().Set("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE")
			w.Header().Set("Access-Control-Allow-Headers", strings.Join(corsAllowed, ", "))
			w.Header().Set("Access-Control-Max-Age", "600")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		next.ServeHTTP(w, r)
	})
}
