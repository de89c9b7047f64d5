package gateway_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/diskpipe/diskpipe/objectstore/objectstoretest"
)

// from is an HTTP client whose connections come from the loopback address ip (127.0.0.x),
// as another pod's would.
func from(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

// hold opens n connections to the store from ip that send nothing.
func hold(t *testing.T, s *objectstoretest.Server, ip string, n int) []net.Conn {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	var conns []net.Conn
	for range n {
		c, err := d.Dial("tcp", strings.TrimPrefix(s.Endpoint, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		conns = append(conns, c)
	}
	time.Sleep(200 * time.Millisecond) // accepted, and counted
	return conns
}

// get is the status and body of an unsigned GET of the store's root from c.
func get(t *testing.T, s *objectstoretest.Server, c *http.Client) (int, string) {
	t.Helper()
	resp, err := c.Get(s.Endpoint + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestFrontPerSource: one address holding as many connections as the store takes from one is
// refused more, with 503 SlowDown naming the bound; another address is served, and the
// kubelet's probe too.
func TestFrontPerSource(t *testing.T) {
	s := objectstoretest.StartWith(t, "--max-connections-per-source=4")
	hold(t, s, "127.0.0.2", 4)
	code, body := get(t, s, from("127.0.0.2"))
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "<Code>SlowDown</Code>") ||
		!strings.Contains(body, "127.0.0.2 holds 4 connections to the object store, as many as it takes from one address (objectStore.bundled.maxConnectionsPerSource)") {
		t.Errorf("a fifth connection from the same address: %d %s", code, body)
	}
	if code, body := get(t, s, from("127.0.0.3")); code != http.StatusForbidden || !strings.Contains(body, "AccessDenied") {
		t.Errorf("another address, unsigned, is the gateway's to refuse: %d %s", code, body)
	}
	resp, err := from("127.0.0.2").Get(s.Endpoint + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the probe from the full address: %s", resp.Status)
	}
}

// TestFrontFull: a store holding as many connections as it takes closes one that serves no
// request, of the address holding the most, for a new one; when every one serves a request,
// the new one is refused.
func TestFrontFull(t *testing.T) {
	s := objectstoretest.StartWith(t, "--max-connections=4", "--max-connections-per-source=4")
	held := hold(t, s, "127.0.0.2", 3)
	hold(t, s, "127.0.0.4", 1)
	if code, body := get(t, s, from("127.0.0.3")); code != http.StatusForbidden {
		t.Fatalf("a new address at a full store: %d %s", code, body)
	}
	closed := 0
	for _, c := range held {
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := c.Read(make([]byte, 1)); errors.Is(err, io.EOF) {
			closed++
		}
	}
	if closed != 1 {
		t.Errorf("%d of the connections of the address holding the most were closed, want 1", closed)
	}
}

// TestFrontIdle: an idle connection is closed after the idle timeout.
func TestFrontIdle(t *testing.T) {
	s := objectstoretest.StartWith(t, "--idle-timeout=1s")
	c := hold(t, s, "127.0.0.2", 1)[0]
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: store\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatal(resp.Status)
	}
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.ReadByte(); err != io.EOF {
		t.Fatalf("the idle connection: %v", err)
	}
	if idle := time.Since(start); idle > 5*time.Second {
		t.Errorf("the idle connection was closed after %s", idle)
	}
}

// trickle is a body that sends a byte every gap.
type trickle struct {
	n   int
	gap time.Duration
}

func (t *trickle) Read(p []byte) (int, error) {
	if t.n == 0 {
		return 0, io.EOF
	}
	time.Sleep(t.gap)
	p[0] = 'x'
	t.n--
	return 1, nil
}

// TestFrontSlowBody: a body slower than the least rate is ended with 408 RequestTimeout,
// saying its rate; so is one that stops.
func TestFrontSlowBody(t *testing.T) {
	s := objectstoretest.StartWith(t, "--min-bytes-per-second=1024", "--body-window=2s")
	c := s.Client()
	ctx := context.Background()
	if err := c.MakeBucket(ctx, "slow", minio.MakeBucketOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, b := range []struct {
		body *trickle
		want string
	}{
		{&trickle{n: 100, gap: 100 * time.Millisecond}, "bytes a second over 2s, under the 1024 the server takes"},
		{&trickle{n: 1, gap: 5 * time.Second}, "nothing came for 2s, as long as the server waits"},
	} {
		// A presigned PUT, sent as it comes: the store reads its body once it took the URL.
		u, err := c.PresignedPutObject(ctx, "slow", "object", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, u.String(), b.body)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = int64(b.body.n)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(msg), "<Code>RequestTimeout</Code>") || !strings.Contains(string(msg), b.want) {
			t.Errorf("a slow body: %d %s; want 408 RequestTimeout saying %q", resp.StatusCode, msg, b.want)
		}
	}
}
