package transfer

import (
	"flag"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"
)

func TestEgressCheck(t *testing.T) {
	var e Egress
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	e.Flags(fs)
	if err := fs.Parse([]string{"--forbid-cidr", "10.96.0.0/12", "--forbid-cidr", "10.244.0.0/16",
		"--allow-destination", "10.244.0.1", "--allow-destination", "mirror.svc.cluster.local", "--allow-destination", "10.100.7.0/24"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		addr string
		want string // "" passes; else a word the refusal says
	}{
		{"8.8.8.8", ""},
		{"2001:4860:4860::8888", ""},
		{"169.254.169.254", "link-local"},
		{"fe80::1", "link-local"},
		{"127.0.0.1", "loopback"},
		{"::1", "loopback"},
		{"::ffff:127.0.0.1", "loopback"}, // IPv4-mapped
		{"0.0.0.0", "unspecified"},
		{"239.1.1.1", "multicast"},
		{"10.96.0.10", "10.96.0.0/12"},
		{"10.244.3.7", "10.244.0.0/16"},
		{"10.244.0.1", ""},   // allowed address inside a forbidden network
		{"10.100.7.200", ""}, // allowed CIDR inside a forbidden one
		{"10.100.8.1", "10.96.0.0/12"},
	} {
		err := e.Check("", netip.MustParseAddr(c.addr))
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s refused: %v", c.addr, err)
		case c.want != "" && err == nil:
			t.Errorf("%s passed", c.addr)
		case c.want != "" && (!strings.Contains(err.Error(), c.want) || !IsForbiddenDestination(err) || IsTransient(err)):
			t.Errorf("%s: %v (reason %s)", c.addr, err, ReasonOf(err))
		}
	}
	if !e.hostAllowed("Mirror.svc.cluster.local.") || e.hostAllowed("svc.cluster.local") {
		t.Error("allowed host names do not match exactly")
	}
	for _, bad := range []string{"", "10.0.0.0/33", "a b", "host:80"} {
		if err := (&Egress{}).Allow(bad); err == nil {
			t.Errorf("%q was taken as a destination", bad)
		}
	}
	if err := (&Egress{Unrestricted: true}).Check("", netip.MustParseAddr("127.0.0.1")); err != nil {
		t.Error(err)
	}
}

// Through a proxy the target's addresses are checked before the request goes: the proxy, not
// this process, would dial them.
func TestEgressThroughProxy(t *testing.T) {
	var got []string
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.URL.String()) // a forward proxy sees the absolute URL
		_, _ = w.Write([]byte("proxied"))
	}))
	defer proxy.Close()
	pu, _ := url.Parse(proxy.URL)
	e := &Egress{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}} // the proxy itself
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = http.ProxyURL(pu)
	c := &http.Client{Transport: e.Apply(tr)}

	resp, err := c.Get("http://169.254.169.254/latest/meta-data/")
	if err == nil {
		resp.Body.Close()
	}
	if !IsForbiddenDestination(err) || !strings.Contains(err.Error(), "169.254.169.254") {
		t.Fatalf("the metadata address through the proxy: %v", err)
	}
	resp, err = c.Get("http://192.0.2.10/disk.img") // a public-looking address: passed to the proxy
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// A name this process cannot resolve is the proxy's to resolve (pods behind a proxy often
	// have no DNS for the internet).
	resp, err = c.Get("http://disk.invalid/disk.img")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(got) != 2 || got[0] != "http://192.0.2.10/disk.img" || got[1] != "http://disk.invalid/disk.img" {
		t.Fatalf("the proxy saw %q", got)
	}
}
