package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gofiber/fiber/v3"

	"github.com/diskpipe/diskpipe/internal/pace"
	"github.com/diskpipe/diskpipe/objectstore"
)

// # The store's front
//
// versitygw serves the S3 API on a loopback port only the store's pod reaches; the store's
// port is this front, which passes each request on to it and bounds what any one
// client may hold of the store, which every tenant shares:
//
//   - connections: MaxConnections in all, MaxConnectionsPerSource from one address (a pod's);
//     a connection over either is answered 503 SlowDown (S3 clients retry it), naming the
//     bound, and closed; when the store is full, a connection of the address that holds the
//     most, on which no request is being served, is closed first, so a client holding idle
//     connections makes room for others;
//   - time: a request's headers must come within HeaderTimeout, an idle connection is closed
//     after IdleTimeout, a request body must come at MinBytesPerSecond at least, measured
//     over BodyWindow of waiting, or the request is ended with 408 RequestTimeout, and each
//     write of an answer must be taken within BodyWindow (a client that does not read its
//     download is cut);
//   - one request at a time on a connection: HTTP/1.1 only, also over TLS.
//
// Bucket policies see the client's address as aws:SourceIp (the front tells the gateway);
// aws:SecureTransport is false, as the front, not the gateway, serves TLS.
//
// An address is what connects: behind an ingress controller or a NodePort's SNAT, many clients
// share one, so raise MaxConnectionsPerSource there.

// headerPeer tells the gateway who connected, for aws:SourceIp in bucket policies (peer): the
// front sets it on every request, over what a client sent.
const headerPeer = "X-Diskpipe-Peer"

// peer is the gateway's middleware that takes the client's address from headerPeer: what
// comes to the gateway comes from the front (or from the store's own pod).
func peer(c fiber.Ctx) error {
	if addr, err := net.ResolveTCPAddr("tcp", c.Get(headerPeer)); err == nil {
		c.RequestCtx().SetRemoteAddr(addr)
	}
	c.Request().Header.Del(headerPeer)
	return c.Next()
}

// Defaults of the front's bounds.
const (
	DefaultMaxConnections          = 256
	DefaultMaxConnectionsPerSource = 64
	DefaultHeaderTimeout           = 10 * time.Second
	DefaultIdleTimeout             = 60 * time.Second
	DefaultMinBytesPerSecond       = 16 << 10
	DefaultBodyWindow              = 30 * time.Second
)

// FrontConfig bounds what the store's clients hold; zero values take the defaults.
type FrontConfig struct {
	MaxConnections, MaxConnectionsPerSource int
	HeaderTimeout, IdleTimeout, BodyWindow  time.Duration
	MinBytesPerSecond                       int64
}

func (c *FrontConfig) defaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defDuration := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.MaxConnections, DefaultMaxConnections)
	def(&c.MaxConnectionsPerSource, DefaultMaxConnectionsPerSource)
	defDuration(&c.HeaderTimeout, DefaultHeaderTimeout)
	defDuration(&c.IdleTimeout, DefaultIdleTimeout)
	defDuration(&c.BodyWindow, DefaultBodyWindow)
	if c.MinBytesPerSecond <= 0 {
		c.MinBytesPerSecond = DefaultMinBytesPerSecond
	}
}

// front is the store's listener and the proxy to versitygw.
type front struct {
	cfg FrontConfig

	mu    sync.Mutex
	conns map[net.Conn]*frontConn
	from  map[string]int
}

// frontConn is what the front knows of a connection: where from, whether a request is being
// served on it, and, when it came over a bound, why it is refused.
type frontConn struct {
	source  string
	active  bool
	refused string
}

type (
	refusedKey struct{}
	paceKey    struct{}
)

// serveFront serves the store's port on l, passing requests to versitygw at gateway, until
// ctx ends; with cert and key it serves TLS.
func serveFront(ctx context.Context, l net.Listener, gateway string, cfg FrontConfig, certFile, keyFile string) error {
	cfg.defaults()
	f := &front{cfg: cfg, conns: map[net.Conn]*frontConn{}, from: map[string]int{}}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme, r.Out.URL.Host = "http", "versitygw"
			r.Out.Host = r.In.Host // the signature covers it
			r.Out.Header.Set(headerPeer, r.In.RemoteAddr)
		},
		Transport:  gatewayTransport(gateway),
		BufferPool: copyBuffers{},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if body, _ := r.Context().Value(paceKey{}).(*pace.Reader); body != nil && body.Err() != nil {
				s3Error(w, http.StatusRequestTimeout, "RequestTimeout", body.Err().Error())
				return
			}
			if r.Context().Err() != nil {
				return // the client went away
			}
			s3Error(w, http.StatusBadGateway, "InternalError", "the store's front could not reach the store: "+err.Error())
		},
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// The kubelet's probes are answered at any load: a store restarted for being
			// full would fail every client.
			if why, _ := r.Context().Value(refusedKey{}).(string); why != "" && r.URL.Path != objectstore.HealthPath {
				w.Header().Set("Retry-After", "5")
				w.Header().Set("Connection", "close")
				s3Error(w, http.StatusServiceUnavailable, "SlowDown", why)
				return
			}
			if why, _ := r.Context().Value(refusedKey{}).(string); why != "" {
				w.Header().Set("Connection", "close") // a probe's answer, on a refused connection: its last
			}
			if r.Body != nil && r.Body != http.NoBody {
				rc := http.NewResponseController(w)
				body := &pace.Reader{R: r.Body, Min: cfg.MinBytesPerSecond, Window: cfg.BodyWindow, Deadline: rc.SetReadDeadline}
				r = r.WithContext(context.WithValue(r.Context(), paceKey{}, body))
				r.Body = body
			}
			proxy.ServeHTTP(pace.NewWriter(w, cfg.BodyWindow), r)
		}),
		// HTTP/1.1 only: one connection, one request at a time, as the bounds count them.
		TLSNextProto:      map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ReadHeaderTimeout: cfg.HeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		ConnState:         f.state,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			why, evicted := f.admit(c) // before StateNew
			if evicted != nil {
				_ = evicted.Close()
			}
			return context.WithValue(ctx, refusedKey{}, why)
		},
	}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
	}()
	var err error
	if certFile != "" && keyFile != "" {
		err = srv.ServeTLS(l, certFile, keyFile)
	} else {
		err = srv.Serve(l)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// state counts the connections by source, and which are idle.
func (f *front) state(c net.Conn, s http.ConnState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch s {
	case http.StateIdle, http.StateActive:
		if fc := f.conns[c]; fc != nil {
			fc.active = s == http.StateActive
		}
	case http.StateClosed, http.StateHijacked:
		if fc := f.conns[c]; fc != nil {
			delete(f.conns, c)
			if f.from[fc.source]--; f.from[fc.source] <= 0 {
				delete(f.from, fc.source)
			}
		}
	}
}

// admit counts a new connection, or says why it is refused when it is over a bound (its one
// request is answered 503, with its deadline short). At the store's bound, an idle connection
// of the source that holds the most is closed to make room.
func (f *front) admit(c net.Conn) (refused string, evict net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	source := c.RemoteAddr().String()
	if host, _, err := net.SplitHostPort(source); err == nil {
		source = host
	}
	fc := &frontConn{source: source}
	switch {
	case f.from[source] >= f.cfg.MaxConnectionsPerSource:
		fc.refused = fmt.Sprintf("%s holds %d connections to the object store, as many as it takes from one address (objectStore.bundled.maxConnectionsPerSource): close one, or try again",
			source, f.from[source])
	case len(f.conns) >= f.cfg.MaxConnections:
		if evict = f.idleOfHeaviest(); evict != nil {
			break
		}
		fc.refused = fmt.Sprintf("the object store holds %d connections, as many as it takes (objectStore.bundled.maxConnections), each serving a request: try again", len(f.conns))
	}
	if fc.refused != "" {
		_ = c.SetDeadline(time.Now().Add(f.cfg.HeaderTimeout))
	}
	f.conns[c] = fc
	f.from[source]++
	return fc.refused, evict
}

// idleOfHeaviest is a connection to close, of the source that holds the most connections, on
// which no request is being served (idle, or not sent one yet); nil when there is none. It is
// closed out of the lock (a TLS close may wait on its client).
func (f *front) idleOfHeaviest() net.Conn {
	var victim net.Conn
	most := 0
	for c, fc := range f.conns {
		if !fc.active && f.from[fc.source] > most {
			victim, most = c, f.from[fc.source]
		}
	}
	if victim != nil {
		f.conns[victim].active = true // closed: not chosen again before its StateClosed
	}
	return victim
}

// s3Error answers as S3 does, with an Error document.
func s3Error(w http.ResponseWriter, status int, code, message string) {
	body, _ := xml.Marshal(struct {
		XMLName xml.Name `xml:"Error"`
		Code    string
		Message string
	}{Code: code, Message: message})
	w.Header().Set("Content-Type", "application/xml")
	w.Header().Set("Content-Length", strconv.Itoa(len(xml.Header)+len(body)))
	w.WriteHeader(status)
	_, _ = w.Write([]byte(xml.Header))
	_, _ = w.Write(body)
}

// gatewayTransport sends each request on a connection of its own to the gateway, and
// reads the answer while the body is still being sent: the gateway may refuse a write
// (QuotaExceeded) before it has read its body, and closes the connection, and that answer,
// not the broken pipe, is the client's.
type gatewayTransport string

func (t gatewayTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	conn, err := (&net.Dialer{}).DialContext(req.Context(), "tcp", string(t))
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(req.Context(), func() { _ = conn.Close() })
	req.Header.Del("Expect") // the front answered it; the body comes as the client sends it
	req.Close = true
	written := make(chan error, 1)
	go func() {
		err := req.Write(conn)
		if err != nil && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
			_ = conn.Close() // the body failed (too slow, cut): the gateway waits for the rest
		}
		written <- err
	}()
	r := bufio.NewReaderSize(conn, 64<<10)
	for {
		resp, err := http.ReadResponse(r, req)
		if err != nil {
			_ = conn.Close()
			stop()
			if werr := <-written; werr != nil {
				return nil, werr
			}
			return nil, err
		}
		if resp.StatusCode == http.StatusContinue {
			continue
		}
		resp.Body = &gatewayBody{ReadCloser: resp.Body, conn: conn, stop: stop}
		return resp, nil
	}
}

// gatewayBody is an answer's body; closing it closes its connection.
type gatewayBody struct {
	io.ReadCloser
	conn net.Conn
	stop func() bool
}

func (b *gatewayBody) Close() error {
	b.stop()
	_ = b.ReadCloser.Close()
	return b.conn.Close()
}

// copyBuffers are the proxy's buffers: large, so that a download costs few system calls.
type copyBuffers struct{}

var copyBufferPool = sync.Pool{New: func() any { return make([]byte, 1<<20) }}

func (copyBuffers) Get() []byte  { return copyBufferPool.Get().([]byte) }
func (copyBuffers) Put(b []byte) { copyBufferPool.Put(b) } //nolint:staticcheck // a slice, reused whole
