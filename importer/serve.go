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
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/diskpipe/diskpipe/internal/pace"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// ServePath is where a clone source serves its disk, and ExtentsPath where it lists the
// disk's data extents (a JSON array of {"Off","Len"}; 404 when it cannot tell), which a raw
// copy reads alone: the holes of a sparse disk.img are not sent between nodes.
const (
	ServePath   = "/disk"
	ExtentsPath = "/extents"
)

// ServeLimits bound what a clone source gives a copy that does not read: a clone source is
// one of the few its disk may have at once (the manager's bound), so one left unread would
// keep other copies waiting.
type ServeLimits struct {
	// Idle ends the clone source (ReasonIdle) once no request with the token has been in
	// flight for this long; 0 never does. Requests without the token do not count, so that
	// nobody else keeps it alive.
	Idle time.Duration
	// Stall ends an answer one of whose writes its reader has not taken for this long.
	Stall time.Duration
	// MinRate bounds the clone source's life (ReasonIdle): an hour, and the time the whole
	// disk takes at MinRate bytes a second; 0 does not. Whoever holds the token cannot keep
	// it by reading a little now and then.
	MinRate int64
}

// lifetime is how long a clone source of a disk of size bytes serves at most; 0 for ever.
func (l ServeLimits) lifetime(size int64) time.Duration {
	if l.MinRate <= 0 {
		return 0
	}
	return serveGrace + time.Duration(float64(size)/float64(l.MinRate)*float64(time.Second))
}

// serveGrace is the hour a clone source's life has beyond its disk's time at MinRate.
var serveGrace = time.Hour

// Serve serves the disk at path (disk.img or a block device) read-only over HTTPS at
// ServePath, with Range support and the certificate cert, to the bearer of token, until ctx
// ends or, within limits, nobody reads. It is the source side of a host-assisted clone between
// namespaces: an importer in the target's namespace reads it like any HTTPS source, verifying
// cert (the manager makes a key and certificate for each copy and gives the importer the
// certificate alone), so that neither the token nor the disk crosses the node network in the
// clear.
func Serve(ctx context.Context, addr, path, token string, cert tls.Certificate, limits ServeLimits) error {
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
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	use := &usage{last: time.Now()}
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
	// reading serves r, a request with the token, counted as the copy's: the clone source is
	// not idle while it is in flight.
	reading := func(w http.ResponseWriter, r *http.Request, serve func(http.ResponseWriter)) {
		if !allowed(w, r) {
			return
		}
		done := use.begin()
		defer done()
		if limits.Stall > 0 {
			w = pace.NewWriter(w, limits.Stall)
		}
		serve(w)
	}
	mux := http.NewServeMux()
	mux.HandleFunc(ServePath, func(w http.ResponseWriter, r *http.Request) {
		reading(w, r, func(w http.ResponseWriter) {
			// ServeContent answers Range requests; each reads with its own offset (pread), so
			// that requests at once do not move one another's.
			http.ServeContent(largeWrites{w}, r, "disk", fi.ModTime(), &diskReader{f: f, size: size, holes: true})
		})
	})
	mux.HandleFunc(ExtentsPath, func(w http.ResponseWriter, r *http.Request) {
		reading(w, r, func(w http.ResponseWriter) { serveExtents(w, f, size) })
	})
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}}}
	plain, err := net.Listen("tcp", addr)
	if err != nil {
		return transfer.Permanent(transfer.ReasonInternal, "listening on %s: %w", addr, err)
	}
	ln := tls.NewListener(plain, srv.TLSConfig)
	// ended says why the clone source ended of itself: not read for Idle, or served its
	// lifetime.
	ended := make(chan error, 1)
	if life := limits.lifetime(size); limits.Idle > 0 || life > 0 {
		go func() {
			began := time.Now()
			every := time.Second // the lifetime alone
			if limits.Idle > 0 {
				every = max(min(limits.Idle/4, time.Second), time.Millisecond)
			}
			tick := time.NewTicker(every)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					switch {
					case limits.Idle > 0 && use.idleFor() >= limits.Idle:
						ended <- transfer.Transient(transfer.ReasonIdle, "no copy read the disk for %s: the clone source ends, giving its slot up to other copies", limits.Idle)
					case life > 0 && time.Since(began) >= life:
						ended <- transfer.Transient(transfer.ReasonIdle, "the clone source served for %s, an hour more than a copy of the whole disk (%d bytes) takes at %d bytes a second: it ends, giving its slot up to other copies",
							life.Round(time.Second), size, limits.MinRate)
					default:
						continue
					}
					cancel()
					return
				}
			}
		}()
	}
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
	select {
	case err := <-ended:
		return err
	default:
		return nil
	}
}

// # Serving the disk
//
// A clone source's bytes go out over TLS, so the kernel cannot send the file itself (sendfile
// sends plain bytes, and Go has no kernel TLS): each answer is read and encrypted here. What
// keeps that cheap: a hole of the disk (a reader that asks for the whole disk, not only its
// extents) is sent as zeros without being read, so no page of the cache is filled with
// zeros for it; and the answer is copied in serveBuffer pieces, where ServeContent's own copy
// made a read and a write for every 32 KiB.

// serveBuffer is the piece an answer is read and written in.
const serveBuffer = 1 << 20

var serveBuffers = sync.Pool{New: func() any { b := make([]byte, serveBuffer); return &b }}

// largeWrites copies what ServeContent sends (io.Copy finds ReadFrom) in serveBuffer pieces.
type largeWrites struct{ http.ResponseWriter }

func (l largeWrites) ReadFrom(r io.Reader) (int64, error) {
	buf := serveBuffers.Get().(*[]byte)
	defer serveBuffers.Put(buf)
	return io.CopyBuffer(struct{ io.Writer }{l.ResponseWriter}, r, *buf)
}

func (l largeWrites) Unwrap() http.ResponseWriter { return l.ResponseWriter }

// diskReader reads the first size bytes of the disk f from its own position (pread, so that
// answers at once do not move one another's), a hole as zeros without reading it while holes
// is set (SEEK_DATA tells them; a block device or a file system that does not has none).
type diskReader struct {
	f     *os.File
	size  int64
	pos   int64
	holes bool
}

func (d *diskReader) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekCurrent:
		off += d.pos
	case io.SeekEnd:
		off += d.size
	}
	if off < 0 {
		return d.pos, errors.New("seek before the start of the disk")
	}
	d.pos = off
	return off, nil
}

func (d *diskReader) Read(p []byte) (int, error) {
	if d.pos >= d.size {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), d.size-d.pos)]
	if d.holes {
		if data, ok := d.next(unix.SEEK_DATA); !ok {
			d.holes = false
		} else if data > d.pos { // in a hole
			n := min(int64(len(p)), data-d.pos)
			clear(p[:n])
			d.pos += n
			return int(n), nil
		} else if hole, ok := d.next(unix.SEEK_HOLE); ok && hole > d.pos {
			p = p[:min(int64(len(p)), hole-d.pos)]
		}
	}
	n, err := d.f.ReadAt(p, d.pos)
	d.pos += int64(n)
	if errors.Is(err, io.EOF) && n > 0 {
		err = nil
	}
	return n, err
}

// next is where the next data (SEEK_DATA) or hole (SEEK_HOLE) starts from d.pos: d.size when
// there is none before the end; false when the file system cannot tell. The descriptor's own
// offset moves, which no read of the disk uses.
func (d *diskReader) next(whence int) (int64, bool) {
	rc, err := d.f.SyscallConn()
	if err != nil {
		return 0, false
	}
	var off int64
	var serr error
	if err := rc.Control(func(fd uintptr) { off, serr = unix.Seek(int(fd), d.pos, whence) }); err != nil { //nolint:gosec // a descriptor fits
		return 0, false
	}
	switch {
	case errors.Is(serr, unix.ENXIO): // none after pos
		return d.size, true
	case serr != nil:
		return 0, false
	}
	return min(off, d.size), true
}

// serveExtents answers ExtentsPath: the data extents of the disk f of size bytes.
func serveExtents(w http.ResponseWriter, f *os.File, size int64) {
	extents := fileExtents(f, size)
	if extents == nil {
		http.Error(w, "the disk's extents are not known: read all of it", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(extents)
}

// usage tells how long a clone source has had no request of its copy in flight.
type usage struct {
	mu     sync.Mutex
	active int
	last   time.Time
}

// begin counts a request in flight until its done is called.
func (u *usage) begin() (done func()) {
	u.mu.Lock()
	u.active++
	u.mu.Unlock()
	return func() {
		u.mu.Lock()
		u.active--
		u.last = time.Now()
		u.mu.Unlock()
	}
}

// idleFor is how long no request has been in flight (0 while one is).
func (u *usage) idleFor() time.Duration {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.active > 0 {
		return 0
	}
	return time.Since(u.last)
}
