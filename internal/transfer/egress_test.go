package transfer

import (
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/diskpipe/diskpipe/internal/contract"
)

func TestEgressCheck(t *testing.T) {
	// The rule as a pod gets it: flags of the contract, taken by its Command.
	var pod contract.Pod
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	contract.Bind(fs, &pod)
	if err := fs.Parse([]string{"--forbid-cidr", "10.96.0.0/12", "--forbid-cidr", "10.244.0.0/16",
		"--allow-destination", "10.244.0.1", "--allow-destination", "mirror.svc.cluster.local", "--allow-destination", "10.100.7.0/24"}); err != nil {
		t.Fatal(err)
	}
	var cmd Command
	if err := cmd.Configure(pod); err != nil {
		t.Fatal(err)
	}
	e := cmd.Egress
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
		{"::1%lo", "loopback"},           // a zone names an interface, not another address
		{"fe80::1%eth0", "link-local"},
		{"::ffff:169.254.169.254%eth0", "link-local"},
		{"64:ff9b::a9fe:a9fe", "link-local"},       // NAT64 of 169.254.169.254
		{"::7f00:1", "loopback"},                   // IPv4-compatible 127.0.0.1
		{"64:ff9b::808:808", ""},                   // NAT64 of 8.8.8.8
		{"64:ff9b:1:a9fe:a9:fe00::", "link-local"}, // local-use NAT64 (/48) of 169.254.169.254
		{"64:ff9b:1:808:8:800::", ""},              // and of 8.8.8.8
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
// this process, would dial them. Every spelling of an address a proxy reads as one is checked
// as that address or refused; a name is resolved here, and refused if it does not resolve
// unless the proxy is trusted to resolve it.
func TestEgressThroughProxy(t *testing.T) {
	var got []string
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.URL.String()+" Host:"+r.Host) // a forward proxy sees the absolute URL
		_, _ = w.Write([]byte("proxied"))
	}))
	defer proxy.Close()
	pu, _ := url.Parse(proxy.URL)
	// The proxy itself, and the loopback names of this test.
	e := &Egress{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("::1/128")}}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = http.ProxyURL(pu)
	c := &http.Client{Transport: e.Apply(tr)}
	get := func(u string) error {
		resp, err := c.Get(u)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}

	for u, want := range map[string]string{
		"http://169.254.169.254/latest/meta-data/": "169.254.169.254",
		"http://[::ffff:a9fe:a9fe]/":               "link-local",
		"http://[fe80::1%25eth0]/":                 "link-local",
		"http://2852039166/":                       "write it as 169.254.169.254",
		"http://0xa9fea9fe/":                       "write it as 169.254.169.254",
		"http://0251.0376.0251.0376/":              "write it as 169.254.169.254",
		"http://169.254.43518/":                    "write it as 169.254.169.254",
		"http://0x7f.1/":                           "write it as 127.0.0.1",
		"http://disk.invalid/disk.img":             "does not resolve in the pod",
	} {
		if err := get(u); !IsForbiddenDestination(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s through the proxy: %v", u, err)
		}
	}
	if err := get("http://192.0.2.10/disk.img"); err != nil { // a public-looking address: passed to the proxy
		t.Fatal(err)
	}
	// A name is resolved here and its addresses checked.
	if err := get("http://localhost:8080/disk.img"); err != nil { // loopback, allowed in this test
		t.Fatal(err)
	}
	// Where the admin lets the proxy resolve names the pods cannot, they pass, unchecked.
	t.Setenv(ProxyResolvesNamesEnv, "true")
	if err := get("http://disk.invalid/disk.img"); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != "http://192.0.2.10/disk.img Host:192.0.2.10" || got[2] != "http://disk.invalid/disk.img Host:disk.invalid" ||
		got[1] != "http://localhost:8080/disk.img Host:localhost:8080" {
		t.Fatalf("the proxy saw %q", got)
	}
}

func TestNumericHost(t *testing.T) {
	for host, want := range map[string]string{
		"169.254.169.254":     "169.254.169.254 canonical",
		"2852039166":          "169.254.169.254",
		"0xA9FEA9FE":          "169.254.169.254",
		"0251.0376.0251.0376": "169.254.169.254",
		"169.16689662":        "169.254.169.254",
		"127.1":               "127.0.0.1",
		"0":                   "0.0.0.0",
		"4294967296":          "",
		"256.1.1.1":           "",
		"1.2.3.4.5":           "",
		"example.com":         "",
		"1e100.net":           "",
		"08.1.1.1":            "",
	} {
		a, canonical, ok := numericHost(host)
		got := ""
		if ok {
			got = a.String()
			if canonical {
				got += " canonical"
			}
		}
		if got != want {
			t.Errorf("%s: %q, want %q", host, got, want)
		}
	}
}

// A server the manager vouches for (a KubeVirt export server's pod) is dialled at the address
// it was found at for the host the URL names, and only for that host: the same address named
// by itself, or under another name, is refused as before; TLS is still for the URL's host.
func TestEgressConnectTo(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("disk from " + r.Host))
	}))
	defer srv.Close()
	at := strings.TrimPrefix(srv.URL, "https://")
	var pod contract.Pod
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	contract.Bind(fs, &pod)
	if err := fs.Parse([]string{"--connect-to", "Virt-Export-Fedora.Golden.svc:443=" + at}); err != nil {
		t.Fatal(err)
	}
	var cmd Command
	if err := cmd.Configure(pod); err != nil {
		t.Fatal(err)
	}
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true
	c := &http.Client{Transport: cmd.Egress.Apply(tr)}
	get := func(u string, name string) (string, error) {
		tr.TLSClientConfig.ServerName = name
		resp, err := c.Get(u)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b := new(strings.Builder)
		_, err = io.Copy(b, resp.Body)
		return b.String(), err
	}
	// httptest's certificate names example.com: TLS is checked against the name asked for.
	if got, err := get("https://virt-export-fedora.golden.svc/volumes/disk/disk.img.gz", "example.com"); err != nil || got != "disk from virt-export-fedora.golden.svc" {
		t.Fatalf("the vouched-for server: %q %v", got, err)
	}
	// Asked for no name, the certificate is checked for the URL's host, not the address dialled.
	if _, err := get("https://virt-export-fedora.golden.svc/x", ""); err == nil || !strings.Contains(err.Error(), "not virt-export-fedora.golden.svc") {
		t.Errorf("TLS is for the URL's host: %v", err)
	}
	for _, u := range []string{"https://" + at + "/", "https://localhost:" + strings.Split(at, ":")[1] + "/"} {
		if _, err := get(u, "example.com"); !IsForbiddenDestination(err) {
			t.Errorf("%s is not vouched for: %v", u, err)
		}
	}
	if _, err := get("https://virt-export-fedora.golden.svc:8443/", "example.com"); err == nil {
		t.Error("another port of the host was dialled where it was vouched for")
	}
	for _, bad := range []string{"host:443", "host=10.0.0.1:8443", "host:443=name:8443", "host:443=10.0.0.1"} {
		if err := (&Egress{}).Connect(bad); err == nil {
			t.Errorf("%q was taken", bad)
		}
	}
}
