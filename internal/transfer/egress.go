package transfer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/net/http/httpproxy"
)

// Egress is where the importer, its probe and check, and the exporter may connect. A user
// names the source, so without it a URL, a redirect or a DNS answer could point a pod at the
// cloud's metadata service, the node's own ports or the cluster's Services, and the reply would
// become a disk the user can read. The rule is checked on the address actually dialled (after
// DNS, on every redirect, for every source kind), so a host name that resolves differently a
// second time gains nothing.
//
// Refused unless allowed: loopback, link-local, unspecified and multicast addresses (always),
// and Forbidden (the cluster's pod and service CIDRs, from the chart). Allowed networks and
// host names pass even inside those: the bundled store and in-cluster mirrors.
type Egress struct {
	// Forbidden networks beyond the built-in ones.
	Forbidden []netip.Prefix
	// Allowed networks pass even inside a forbidden one.
	Allowed []netip.Prefix
	// AllowedHosts are host names (exact, case-insensitive) that pass whatever they resolve to.
	AllowedHosts []string
	// Unrestricted turns the rule off (tests of other things, and the manager's own clients).
	Unrestricted bool
	// ConnectTo maps a "host:port" a source names to the "address:port" dialled for it, which
	// passes: a server the manager found and vouches for (a KubeVirt export server's pod, whose
	// Service address the rule refuses), the URL's host still naming it for TLS.
	ConnectTo map[string]string

	dialer *net.Dialer
}

// AllowedDestinationsValue is the chart value that lets importers reach a refused address; the
// refusal names it.
const AllowedDestinationsValue = "importer.allowedDestinations"

var builtinForbidden = []struct {
	prefix netip.Prefix
	what   string
}{
	{netip.MustParsePrefix("127.0.0.0/8"), "a loopback address"},
	{netip.MustParsePrefix("::1/128"), "a loopback address"},
	{netip.MustParsePrefix("169.254.0.0/16"), "a link-local address (cloud metadata services live there)"},
	{netip.MustParsePrefix("fe80::/10"), "a link-local address"},
	{netip.MustParsePrefix("0.0.0.0/8"), "an unspecified address"},
	{netip.MustParsePrefix("::/128"), "an unspecified address"},
	{netip.MustParsePrefix("224.0.0.0/4"), "a multicast address"},
	{netip.MustParsePrefix("ff00::/8"), "a multicast address"},
}

// embeddingPrefixes are IPv6 networks whose last 32 bits are an IPv4 address a host or a
// gateway reaches: NAT64's well-known prefix and the deprecated IPv4-compatible addresses.
var embeddingPrefixes = []netip.Prefix{netip.MustParsePrefix("64:ff9b::/96"), netip.MustParsePrefix("::/96")}

// localNAT64 is NAT64's local-use prefix (RFC 8215), a /48: the IPv4 address is in bits 48 to
// 63 and 72 to 87 (RFC 6052), around the octet that stays zero.
var localNAT64 = netip.MustParsePrefix("64:ff9b:1::/48")

// embeddedIPv4 is the IPv4 address a NAT64 or IPv4-compatible IPv6 address stands for.
func embeddedIPv4(addr netip.Addr) (netip.Addr, bool) {
	if !addr.Is6() {
		return netip.Addr{}, false
	}
	b := addr.As16()
	if localNAT64.Contains(addr) {
		return netip.AddrFrom4([4]byte{b[6], b[7], b[9], b[10]}), true
	}
	for _, p := range embeddingPrefixes {
		if p.Contains(addr) {
			return netip.AddrFrom4([4]byte(b[12:])), true
		}
	}
	return netip.Addr{}, false
}

// numericHost parses host as the C library's inet_aton and most proxies do: one to four
// parts, each decimal, octal (leading 0) or hexadecimal (0x), the last filling the bytes left
// (2852039166 and 0xa9fea9fe are 169.254.169.254). canonical says it is written a.b.c.d in
// decimal, as a URL of an address should be.
func numericHost(host string) (addr netip.Addr, canonical, ok bool) {
	if a, err := netip.ParseAddr(host); err == nil {
		return a, true, true
	}
	parts := strings.Split(host, ".")
	if len(parts) > 4 || host == "" {
		return netip.Addr{}, false, false
	}
	var vals []uint64
	for _, p := range parts {
		base, digits := 10, p
		switch {
		case len(p) > 1 && (p[:2] == "0x" || p[:2] == "0X"):
			base, digits = 16, p[2:]
		case len(p) > 1 && p[0] == '0':
			base, digits = 8, p[1:]
		}
		if digits == "" && base != 16 {
			return netip.Addr{}, false, false
		}
		v := uint64(0)
		for _, c := range strings.ToLower(digits) {
			d := strings.IndexRune("0123456789abcdef"[:base], c)
			if d < 0 {
				return netip.Addr{}, false, false
			}
			if v = v*uint64(base) + uint64(d); v > 1<<32 {
				return netip.Addr{}, false, false
			}
		}
		vals = append(vals, v)
	}
	var n uint64
	for i, v := range vals {
		last := i == len(vals)-1
		limit := uint64(255)
		if last {
			limit = 1<<(8*(5-len(vals))) - 1
		}
		if v > limit {
			return netip.Addr{}, false, false
		}
		if last {
			n = n<<(8*(5-len(vals))) | v
		} else {
			n = n<<8 | v
		}
	}
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), false, true
}

// Forbid adds a CIDR to what is refused.
func (e *Egress) Forbid(v string) error {
	p, err := netip.ParsePrefix(strings.TrimSpace(v))
	if err != nil {
		return err
	}
	e.Forbidden = append(e.Forbidden, p.Masked())
	return nil
}

// Allow adds a CIDR, an address or a host name to what passes.
func (e *Egress) Allow(v string) error {
	v = strings.TrimSpace(v)
	if p, err := netip.ParsePrefix(v); err == nil {
		e.Allowed = append(e.Allowed, p.Masked())
		return nil
	}
	if a, err := netip.ParseAddr(v); err == nil {
		e.Allowed = append(e.Allowed, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
		return nil
	}
	if v == "" || strings.ContainsAny(v, "/: ") {
		return fmt.Errorf("%q is neither a CIDR, an address nor a host name", v)
	}
	e.AllowedHosts = append(e.AllowedHosts, strings.ToLower(strings.TrimSuffix(v, ".")))
	return nil
}

// Connect adds a ConnectTo entry, written "host:port=address:port".
func (e *Egress) Connect(v string) error {
	from, to, ok := strings.Cut(strings.TrimSpace(v), "=")
	if _, _, err := net.SplitHostPort(from); !ok || err != nil {
		return fmt.Errorf("%q is not host:port=address:port", v)
	}
	if _, err := netip.ParseAddrPort(to); err != nil {
		return fmt.Errorf("%q is not host:port=address:port: %w", v, err)
	}
	if e.ConnectTo == nil {
		e.ConnectTo = map[string]string{}
	}
	e.ConnectTo[strings.ToLower(from)] = to
	return nil
}

// hostAllowed reports whether host is named in AllowedHosts.
func (e *Egress) hostAllowed(host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, h := range e.AllowedHosts {
		if h == host {
			return true
		}
	}
	return false
}

// Check returns a permanent ForbiddenDestination failure when addr may not be connected to;
// host is what the user named, for the message.
func (e *Egress) Check(host string, addr netip.Addr) error {
	if e == nil || e.Unrestricted {
		return nil
	}
	// A zone (fe80::1%eth0, ::1%lo) names an interface, not another address: a prefix never
	// contains an address with one, so it is dropped before the address is checked.
	addr = addr.WithZone("").Unmap()
	if err := e.check(host, addr); err != nil {
		return err
	}
	if v4, ok := embeddedIPv4(addr); ok {
		return e.check(host, v4)
	}
	return nil
}

func (e *Egress) check(host string, addr netip.Addr) error {
	for _, p := range e.Allowed {
		if p.Contains(addr) {
			return nil
		}
	}
	what := ""
	for _, f := range builtinForbidden {
		if f.prefix.Contains(addr) {
			what = f.what
			break
		}
	}
	if what == "" {
		for _, p := range e.Forbidden {
			if p.Contains(addr) {
				what = fmt.Sprintf("in the cluster's network %s", p)
				break
			}
		}
	}
	if what == "" {
		return nil
	}
	name := addr.String()
	if host != "" && host != name {
		name = fmt.Sprintf("%s (%s)", host, addr)
	}
	return Permanent(ReasonForbiddenDestination,
		"refusing to connect to %s: it is %s, which importers may not reach; if it is a server you trust (an in-cluster mirror), add it to the chart's %s",
		name, what, AllowedDestinationsValue)
}

// ProxyResolvesNamesEnv is the variable that, set to "true" (the chart's
// importer.proxy.resolvesNames), lets a host name the pod cannot resolve go to the proxy,
// which resolves it; the address it connects to is then not checked here.
const ProxyResolvesNamesEnv = "DISKPIPE_PROXY_RESOLVES_NAMES"

// CheckHost checks the host of a request sent through an HTTP proxy, where the proxy, not
// this process, dials it. A numeric host is checked as the proxy would read it (a spelling
// other than a.b.c.d is refused); a name is resolved here and every address it has is
// checked. A name this process cannot resolve is refused, unless ProxyResolvesNamesEnv lets the
// proxy resolve it (pods behind a proxy often have no DNS for the internet).
func (e *Egress) CheckHost(ctx context.Context, host string) error {
	if e == nil || e.Unrestricted || e.hostAllowed(host) {
		return nil
	}
	if a, canonical, ok := numericHost(host); ok {
		if !canonical {
			return Permanent(ReasonForbiddenDestination,
				"refusing the host %q: it spells the address %s in a way proxies read differently; write it as %s", host, a, a)
		}
		return e.Check(host, a)
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	var dnsErr *net.DNSError
	switch {
	case err == nil && len(addrs) > 0:
	case os.Getenv(ProxyResolvesNamesEnv) == "true":
		return nil
	case errors.As(err, &dnsErr) && (dnsErr.IsTemporary || dnsErr.IsTimeout):
		return Transient(ReasonSourceUnavailable, "resolving %s: %v", host, err)
	default:
		return Permanent(ReasonForbiddenDestination,
			"refusing the host %s: it does not resolve in the pod (%v), so the address the proxy would connect to cannot be checked; "+
				"if the proxy must resolve names for the pods, set the chart's importer.proxy.resolvesNames", host, err)
	}
	for _, a := range addrs {
		if err := e.Check(host, a); err != nil {
			return err
		}
	}
	return nil
}

// DialContext dials addr ("host:port") if the rule lets it: the check runs on each address
// the dialer actually connects to (net.Dialer.Control), after DNS.
func (e *Egress) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	base := e.baseDialer()
	if to, ok := e.connectTo(addr); ok {
		return base.DialContext(ctx, network, to)
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil || e == nil || e.Unrestricted || e.hostAllowed(host) {
		return base.DialContext(ctx, network, addr)
	}
	d := *base
	var refused error
	d.Control = func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("dialling %q: %w", address, err)
		}
		if err := e.Check(host, ap.Addr()); err != nil {
			refused = err
			return err
		}
		return nil
	}
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil && refused != nil {
		return nil, refused // every address was refused: say why, not "connection refused"
	}
	return conn, err
}

// connectTo is the address ConnectTo maps addr to.
func (e *Egress) connectTo(addr string) (string, bool) {
	if e == nil {
		return "", false
	}
	to, ok := e.ConnectTo[strings.ToLower(addr)]
	return to, ok
}

func (e *Egress) baseDialer() *net.Dialer {
	if e != nil && e.dialer != nil {
		return e.dialer
	}
	return &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
}

// Apply makes tr obey the rule: its own dials are checked, a dial to the proxy of the
// environment passes, and a request sent through that proxy has its target host's addresses
// checked first.
func (e *Egress) Apply(tr *http.Transport) http.RoundTripper {
	if e == nil || e.Unrestricted {
		if e != nil && len(e.ConnectTo) > 0 {
			tr.DialContext = e.DialContext
		}
		return tr
	}
	proxies := map[string]bool{}
	for _, p := range envProxies() {
		if !strings.Contains(p, "://") {
			p = "http://" + p
		}
		if u, err := url.Parse(p); err == nil && u.Hostname() != "" {
			port := u.Port()
			if port == "" {
				port = map[string]string{"https": "443", "socks5": "1080"}[u.Scheme]
			}
			if port == "" {
				port = "80"
			}
			proxies[net.JoinHostPort(u.Hostname(), port)] = true
		}
	}
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if proxies[addr] {
			return e.baseDialer().DialContext(ctx, network, addr)
		}
		return e.DialContext(ctx, network, addr)
	}
	return &egressTransport{Transport: tr, e: e}
}

// envProxies are the HTTP and HTTPS proxies the environment names (empty ones left out).
func envProxies() []string {
	cfg := httpproxy.FromEnvironment()
	var out []string
	for _, p := range []string{cfg.HTTPProxy, cfg.HTTPSProxy} {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

// ProxyConfigured reports whether the environment names an HTTP or HTTPS proxy.
func ProxyConfigured() bool { return len(envProxies()) > 0 }

// ProxyCAEnv holds the PEM bundle of the proxy's CA (the chart's importer.proxy.trustedCA, or
// CDIConfig's spec.importProxy.trustedCAProxy): a proxy that serves HTTPS, or re-signs what it
// relays, presents certificates of its own, so the pods trust it beside the system's roots and a
// source's own CA.
const ProxyCAEnv = "DISKPIPE_PROXY_CA"

// ProxyCA is the bundle ProxyCAEnv holds when a proxy is configured, else nil.
func ProxyCA() []byte {
	pem := strings.TrimSpace(os.Getenv(ProxyCAEnv))
	if pem == "" || !ProxyConfigured() {
		return nil
	}
	return []byte(pem)
}

type egressTransport struct {
	*http.Transport
	e *Egress
}

// RoundTrip checks a request's host before it goes to a proxy. The proxy resolves the name
// again when it connects: a forward proxy takes the host from the request's URL, so the address
// checked here cannot be pinned without breaking every server that is told apart by its name
// (virtual hosts, S3's bucket.host). A name whose DNS answer changes between the two lookups
// (DNS rebinding) is not caught here: the NetworkPolicy and the proxy's own rules are the line.
func (t *egressTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.Proxy != nil {
		if p, err := t.Proxy(req); err == nil && p != nil {
			if err := t.e.CheckHost(req.Context(), req.URL.Hostname()); err != nil {
				return nil, err
			}
		}
	}
	return t.Transport.RoundTrip(req)
}

// IsForbiddenDestination reports whether err is the rule's refusal.
func IsForbiddenDestination(err error) bool {
	var te *Error
	return errors.As(err, &te) && te.Reason == ReasonForbiddenDestination
}

// MaxRedirects is how many redirects a request follows.
const MaxRedirects = 5

// RedirectPolicy is an http.Client's CheckRedirect for a user's source: at most MaxRedirects,
// only http and https, and the credentials (basic auth and each header in secret, by canonical
// name) are sent only to the host the user named, never to another one a redirect names.
func RedirectPolicy(secret []string) func(req *http.Request, via []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
			return Permanent(ReasonForbiddenDestination, "the server redirected to a %s: URL; only http and https redirects are followed", req.URL.Scheme)
		}
		if len(via) >= MaxRedirects {
			return Permanent(ReasonSourceNotFound, "stopped after %d redirects (the last to %s)", MaxRedirects, req.URL.Host)
		}
		if first := via[0].URL; !strings.EqualFold(first.Host, req.URL.Host) || (first.Scheme == "https" && req.URL.Scheme != "https") {
			req.Header.Del("Authorization")
			for _, h := range secret {
				req.Header.Del(h)
			}
		}
		return nil
	}
}
