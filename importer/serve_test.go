package importer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/test/freeport"
)

// TestServeIdle runs a clone source with its limits: it ends (Idle) once nobody with the
// token reads, however many requests without the token come; a copy that reads, however
// slowly, keeps it; an answer whose reader stops taking it is ended, so it keeps nothing.
func TestServeIdle(t *testing.T) {
	const idle, stall = time.Second, 400 * time.Millisecond
	disk := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(disk, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(disk, 256<<20); err != nil { // larger than the sockets' buffers
		t.Fatal(err)
	}
	caFile, crtFile, keyFile := servingPair(t)
	cert, err := tls.LoadX509KeyPair(crtFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: testServerName}}}
	const token = "0123456789abcdef0123456789abcdef"
	get := func(base, auth string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, base+ServePath, nil)
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		return client.Do(req)
	}
	start := func() (string, <-chan error) {
		addr, err := freeport.Addr("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		ended := make(chan error, 1)
		go func() { ended <- Serve(t.Context(), addr, disk, token, cert, ServeLimits{Idle: idle, Stall: stall}) }()
		base := "https://" + addr
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if resp, err := get(base, "wrong"); err == nil {
				resp.Body.Close()
				return base, ended
			} else if time.Now().After(deadline) {
				t.Fatalf("the clone source did not start: %v", err)
			}
		}
	}
	isIdle := func(what string, err error) {
		t.Helper()
		if te := (*transfer.Error)(nil); !errors.As(err, &te) || te.Reason != transfer.ReasonIdle || !te.Transient {
			t.Errorf("%s: ended with %v, not a transient Idle", what, err)
		}
	}

	// Requests without the token, every 100 ms: they are refused, and keep nothing alive.
	began := time.Now()
	base, ended := start()
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
wrong:
	for {
		select {
		case err := <-ended:
			if took := time.Since(began); took < idle {
				t.Errorf("ended %s after it started, before its idle timeout of %s", took, idle)
			}
			isIdle("polled without the token", err)
			break wrong
		case <-poll.C:
			if resp, err := get(base, "not-the-token"); err == nil {
				if resp.StatusCode != http.StatusUnauthorized {
					t.Errorf("without the token: %s", resp.Status)
				}
				resp.Body.Close()
			}
		case <-time.After(10 * idle):
			t.Fatal("requests without the token kept the clone source alive")
		}
	}

	// A copy reading (with pauses shorter than the stall bound, for 3 idle timeouts) keeps it;
	// once it stops and goes, the clone source ends. (A reader much slower than this is taken
	// as stopped: TCP wakes a blocked writer only when half of the reader's buffer is free.)
	base, ended = start()
	resp, err := get(base, token)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("with the token: %v %v", resp, err)
	}
	buf := make([]byte, 1<<20)
	for until := time.Now().Add(3 * idle); time.Now().Before(until); time.Sleep(stall / 8) {
		if _, err := io.ReadFull(resp.Body, buf); err != nil {
			t.Fatalf("a slow reader was cut: %v", err)
		}
		select {
		case err := <-ended:
			t.Fatalf("ended while a copy was reading: %v", err)
		default:
		}
	}
	// It stops reading: its answer is ended after the stall bound, and the server idles.
	stopped := time.Now()
	time.Sleep(stall + idle/2)
	if _, err := io.Copy(io.Discard, resp.Body); err == nil {
		t.Error("an answer whose reader stopped for longer than the stall bound was sent whole")
	}
	resp.Body.Close()
	select {
	case err := <-ended:
		if took := time.Since(stopped); took < idle {
			t.Errorf("ended %s after its reader stopped, before its idle timeout", took)
		}
		isIdle("a reader that stopped", err)
	case <-time.After(10 * idle):
		t.Fatal("a reader that stopped kept the clone source alive")
	}

	// A reader that goes on reading is cut once the clone source has served its lifetime: the
	// whole disk's time at MinRate (here a second), and the grace (here none).
	serveGrace = 0
	defer func() { serveGrace = time.Hour }()
	addr, err := freeport.Addr("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	lived := make(chan error, 1)
	began = time.Now()
	go func() {
		lived <- Serve(t.Context(), addr, disk, token, cert, ServeLimits{Idle: idle, Stall: stall, MinRate: 256 << 20})
	}()
	quit := make(chan struct{})
	defer close(quit)
	go func(addr string) {
		for {
			select {
			case <-quit:
				return
			default:
			}
			if resp, err := get("https://"+addr, token); err == nil {
				_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
				resp.Body.Close()
			}
			time.Sleep(10 * time.Millisecond)
		}
	}(addr)
	select {
	case err := <-lived:
		if took := time.Since(began); took < time.Second {
			t.Errorf("ended %s after it started, before its lifetime of 1 s", took)
		}
		if te := (*transfer.Error)(nil); !errors.As(err, &te) || te.Reason != transfer.ReasonIdle || !strings.Contains(err.Error(), "an hour more than a copy of the whole disk") {
			t.Errorf("a clone source past its lifetime: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a reader kept the clone source past its lifetime")
	}

	// With no idle timeout it serves until its context ends, and ends well.
	addr, err = freeport.Addr("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*idle)
	defer cancel()
	if err := Serve(ctx, addr, disk, token, cert, ServeLimits{}); err != nil {
		t.Errorf("without limits: %v", err)
	}
}
