package importpod

import (
	"crypto/x509"
	"fmt"
	"net/url"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// Proxy is the HTTP proxy importer and exporter pods send their requests through: the chart's
// importer.proxy values, or CDI's CDIConfig spec.importProxy, which comes first where it names a
// proxy (Config.ProxyFirst). The pods keep their egress rule (transfer.Egress): the proxy's own
// address is let through, and a request whose host is one of the cluster's is refused before it
// reaches the proxy.
type Proxy struct {
	// HTTP is the proxy for http:// sources (HTTP_PROXY), e.g. http://proxy.example.com:3128.
	HTTP string `json:"http,omitempty"`
	// HTTPS is the proxy for https:// sources (HTTPS_PROXY).
	HTTPS string `json:"https,omitempty"`
	// NoProxy lists the hosts, domains (.example.com) and CIDRs reached directly, comma separated
	// (NO_PROXY). The cluster's networks (ClusterCIDRs), the allowed destinations (the bundled
	// store, in-cluster mirrors) and the cluster's service domain are always added.
	NoProxy string `json:"noProxy,omitempty"`
	// TrustedCA is a PEM bundle the pods trust beside the system's roots and a source's own CA:
	// the proxy's, when it serves HTTPS or re-signs what it relays.
	TrustedCA string `json:"trustedCA,omitempty"`
	// ResolvesNames lets a source's host name that the pods cannot resolve go to the proxy,
	// which resolves it, unchecked by the egress rule (transfer.ProxyResolvesNamesEnv); else
	// such a name is refused. The chart's value holds whichever proxy is used.
	ResolvesNames bool `json:"resolvesNames,omitempty"`
}

// Set reports whether p names a proxy.
func (p Proxy) Set() bool { return p.HTTP != "" || p.HTTPS != "" }

// Validate checks what the pods will parse: each proxy an http or https URL with a host and no
// credentials, and the CA bundle PEM certificates.
func (p Proxy) Validate() error {
	for _, f := range []struct{ name, v string }{{"http", p.HTTP}, {"https", p.HTTPS}} {
		if f.v == "" {
			continue
		}
		u, err := url.Parse(f.v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
			// Not quoted: what is not a URL may still hold a password.
			return fmt.Errorf("proxy %s is not an http:// or https:// URL with a host", f.name)
		}
		if u.User != nil {
			// The pods have the proxy in their environment, which a tenant who can read pods
			// in their namespace sees.
			return fmt.Errorf("proxy %s: a proxy URL with a user name or password would show it to anyone who can "+
				"read pods in an import's namespace; let the proxy admit the importers by their address instead", f.name)
		}
	}
	if p.TrustedCA != "" && !x509.NewCertPool().AppendCertsFromPEM([]byte(p.TrustedCA)) {
		return fmt.Errorf("proxy trustedCA holds no PEM certificate")
	}
	return nil
}

// proxy is the proxy the pods use now: ProxyFirst's where it names one, else the chart's.
func (c Config) proxy() Proxy {
	if c.ProxyFirst != nil {
		if p := c.ProxyFirst(); p.Set() {
			return p
		}
	}
	return c.Proxy
}

// proxyEnv is the environment that gives a pod the proxy; none when no proxy is set.
func (c Config) proxyEnv() []corev1.EnvVar {
	p := c.proxy()
	if !p.Set() {
		return nil
	}
	// What the pods reach inside the cluster never goes through the proxy: a clone source's
	// pod, the bundled store, an in-cluster mirror.
	var direct []string
	for _, v := range strings.Split(p.NoProxy, ",") {
		if v = strings.TrimSpace(v); v != "" {
			direct = append(direct, v)
		}
	}
	for _, v := range slices.Concat(c.ClusterCIDRs, c.AllowedDestinations, []string{".svc", ".cluster.local"}) {
		if !slices.Contains(direct, v) {
			direct = append(direct, v)
		}
	}
	env := []corev1.EnvVar{{Name: "NO_PROXY", Value: strings.Join(direct, ",")}}
	if p.HTTP != "" {
		env = append(env, corev1.EnvVar{Name: "HTTP_PROXY", Value: p.HTTP})
	}
	if p.HTTPS != "" {
		env = append(env, corev1.EnvVar{Name: "HTTPS_PROXY", Value: p.HTTPS})
	}
	if p.TrustedCA != "" {
		env = append(env, corev1.EnvVar{Name: transfer.ProxyCAEnv, Value: p.TrustedCA})
	}
	if c.Proxy.ResolvesNames {
		env = append(env, corev1.EnvVar{Name: transfer.ProxyResolvesNamesEnv, Value: "true"})
	}
	return env
}
