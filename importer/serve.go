package importer

import (
	"context"
	"crypto/subtle"
	"errors"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// ServePath is where a clone source serves its disk.
const ServePath = "/disk"

// Serve serves the disk at path (disk.img or a block device) read-only over HTTP at
// ServePath, with Range support, to the bearer of token, until ctx ends. It is the source
// side of a host-assisted clone between namespaces: an importer in the target's namespace
// reads it like any HTTP source.
func Serve(ctx context.Context, addr, path, token string) error {
	if len(token) < 32 {
		return transfer.Permanent(transfer.ReasonInvalidArgument, "the clone token must be at least 32 characters")
	}
	f, err := os.Open(path) //nolint:gosec // the source volume
	if err != nil {
		return transfer.Permanent(transfer.ReasonSourceNotFound, "opening the source disk: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return transfer.Permanent(transfer.ReasonSourceNotFound, "reading the source disk: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc(ServePath, func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			http.Error(w, "a valid bearer token is required", http.StatusUnauthorized)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "read-only", http.StatusMethodNotAllowed)
			return
		}
		// ServeContent answers Range requests and sizes a block device by seeking to its end.
		http.ServeContent(w, r, "disk", fi.ModTime(), f)
	})
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return transfer.Permanent(transfer.ReasonInternal, "listening on %s: %w", addr, err)
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return transfer.Transient(transfer.ReasonInternal, "serving the source disk: %w", err)
	}
	return nil
}
