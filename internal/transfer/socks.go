package transfer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// SOCKS is a SOCKS5 proxy on loopback, inside the process, that dials through an Egress: for
// clients whose transport cannot be given a dialer (containers/image's registry client takes
// only a proxy URL). It asks no authentication, serves only CONNECT, and closes when its
// context ends.
type SOCKS struct {
	// URL is what to give the client as its proxy.
	URL *url.URL

	e        *Egress
	l        net.Listener
	mu       sync.Mutex
	refusal  error
	wg       sync.WaitGroup
	shutdown func()
}

// ServeSOCKS starts a SOCKS5 proxy that connects only where e allows; Close stops it.
func (e *Egress) ServeSOCKS(ctx context.Context) (*SOCKS, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting the egress proxy: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &SOCKS{URL: &url.URL{Scheme: "socks5", Host: l.Addr().String()}, e: e, l: l}
	s.shutdown = func() { cancel(); l.Close() }
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() { defer s.wg.Done(); s.serve(ctx, c) }()
		}
	}()
	go func() { <-ctx.Done(); l.Close() }()
	return s, nil
}

// Close stops the proxy and waits for its connections to end.
func (s *SOCKS) Close() {
	s.shutdown()
	s.wg.Wait()
}

// Refusal is the last connection the rule refused, to tell the user instead of the client's
// "connection not allowed by ruleset".
func (s *SOCKS) Refusal() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refusal
}

func (s *SOCKS) serve(ctx context.Context, c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	target, err := socksHandshake(c)
	if err != nil {
		return
	}
	up, err := s.e.DialContext(ctx, "tcp", target)
	if err != nil {
		code := byte(5) // connection refused
		if IsForbiddenDestination(err) {
			code = 2 // not allowed by ruleset
			s.mu.Lock()
			s.refusal = err
			s.mu.Unlock()
		}
		_, _ = c.Write([]byte{5, code, 0, 1, 0, 0, 0, 0, 0, 0})
		return
	}
	defer up.Close()
	if _, err := c.Write([]byte{5, 0, 0, 1, 0, 0, 0, 0, 0, 0}); err != nil {
		return
	}
	_ = c.SetDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { c.Close(); up.Close() })
	defer stop()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(up, c)
		if tc, ok := up.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		close(done)
	}()
	_, _ = io.Copy(c, up)
	c.Close()
	<-done
}

// socksHandshake reads a SOCKS5 greeting and CONNECT request and returns its "host:port".
func socksHandshake(c net.Conn) (string, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil || hdr[0] != 5 {
		return "", errors.New("not SOCKS5")
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(c, methods); err != nil {
		return "", err
	}
	if _, err := c.Write([]byte{5, 0}); err != nil { // no authentication
		return "", err
	}
	var req [4]byte
	if _, err := io.ReadFull(c, req[:]); err != nil || req[0] != 5 {
		return "", errors.New("bad request")
	}
	if req[1] != 1 { // CONNECT only
		_, _ = c.Write([]byte{5, 7, 0, 1, 0, 0, 0, 0, 0, 0})
		return "", errors.New("command not supported")
	}
	var host string
	switch req[3] {
	case 1, 4:
		ip := make(net.IP, map[byte]int{1: 4, 4: 16}[req[3]])
		if _, err := io.ReadFull(c, ip); err != nil {
			return "", err
		}
		host = ip.String()
	case 3:
		var n [1]byte
		if _, err := io.ReadFull(c, n[:]); err != nil {
			return "", err
		}
		name := make([]byte, n[0])
		if _, err := io.ReadFull(c, name); err != nil {
			return "", err
		}
		host = string(name)
	default:
		return "", errors.New("bad address type")
	}
	var port [2]byte
	if _, err := io.ReadFull(c, port[:]); err != nil {
		return "", err
	}
	return net.JoinHostPort(host, strconv.Itoa(int(binary.BigEndian.Uint16(port[:])))), nil
}
