package importer

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// ServePath is where a clone source serves its disk, and ExtentsPath where it lists the
// disk's data extents (a JSON array of {"Off","Len"}; 404 when it cannot tell), which a raw
// copy reads alone: the holes of a sparse disk.img are not sent between nodes.
const (
	ServePath   = "/disk"
	ExtentsPath = "/extents"
)

// Serve serves the disk at path (disk.img or a block device) read-only over HTTPS at
// ServePath, with Range support and the certificate cert, to the bearer of token, until ctx
// ends. It is the source side of a host-assisted clone between namespaces: an importer in the
// target's namespace reads it like any HTTPS source, verifying cert (the manager makes a key
// and certificate for each copy and gives the importer the certificate alone), so that neither
// the token nor the disk crosses the node network in the clear.
func Serve(ctx context.Context, addr, path, token string, cert tls.Certificate) error {
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
	// allowed says whether r may read: a GET or HEAD with the token.
	allowed := func(w http.ResponseWriter, r *http.Request) bool {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			http.Error(w, "a valid bearer token is required", http.StatusUnauthorized)
			return false
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "read-only", http.StatusMethodNotAllowed)
			return false
		}
		return true
	}
	size, err := f.Seek(0, io.SeekEnd) // a block device's size too
	if err != nil {
		return transfer.Permanent(transfer.ReasonSourceNotFound, "reading the size of the source disk: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc(ServePath, func(w http.ResponseWriter, r *http.Request) {
		if allowed(w, r) {
			// ServeContent answers Range requests; each reads with its own offset (pread), so
			// that requests at once do not move one another's.
			http.ServeContent(w, r, "disk", fi.ModTime(), io.NewSectionReader(f, 0, size))
		}
	})
	mux.HandleFunc(ExtentsPath, func(w http.ResponseWriter, r *http.Request) {
		if !allowed(w, r) {
			return
		}
		extents := fileExtents(f, size)
		if extents == nil {
			http.Error(w, "the disk's extents are not known: read all of it", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(extents)
	})
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}}}
	plain, err := net.Listen("tcp", addr)
	if err != nil {
		return transfer.Permanent(transfer.ReasonInternal, "listening on %s: %w", addr, err)
	}
	ln := tls.NewListener(plain, srv.TLSConfig)
	shut := make(chan struct{})
	go func() {
		defer close(shut)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return transfer.Transient(transfer.ReasonInternal, "serving the source disk: %w", err)
	}
	<-shut // the requests under way are answered (or given up) before the disk is closed
	return nil
}
