package importpod

import (
	"strings"
	"testing"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// envOf is the environment of the pod Build makes for c, by name.
func envOf(c Config) map[string]string {
	env := map[string]string{}
	for _, e := range Build(c, Spec{Name: "p", Namespace: "ns"}).Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	return env
}

// The pods get the proxy in their environment, with what is inside the cluster reached
// directly; the CDIConfig's proxy comes first where it names one; a proxy the pods could not
// use, or one that would show its credentials to tenants, is refused.
func TestProxy(t *testing.T) {
	const pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
	c := Config{ClusterCIDRs: []string{"10.244.0.0/16"}, AllowedDestinations: []string{"mirror.local", "10.244.0.0/16"},
		Proxy: Proxy{HTTP: "http://proxy.example.com:3128", NoProxy: "internal.example.com, .corp", TrustedCA: pem}}
	c.Defaults()
	env := envOf(c)
	want := map[string]string{"HTTP_PROXY": "http://proxy.example.com:3128",
		"NO_PROXY":          "internal.example.com,.corp,10.244.0.0/16,mirror.local,.svc,.cluster.local",
		transfer.ProxyCAEnv: pem}
	if len(env) != len(want) {
		t.Errorf("env %v, want %v", env, want)
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s=%q, want %q", k, env[k], v)
		}
	}

	c.ProxyFirst = func() Proxy { return Proxy{HTTPS: "https://cdi-proxy:3129"} }
	if env := envOf(c); env["HTTPS_PROXY"] != "https://cdi-proxy:3129" || env["HTTP_PROXY"] != "" || env[transfer.ProxyCAEnv] != "" {
		t.Errorf("with the CDIConfig's proxy first: %v", env)
	}
	c.ProxyFirst = func() Proxy { return Proxy{} }
	if env := envOf(c); env["HTTP_PROXY"] != "http://proxy.example.com:3128" {
		t.Errorf("a CDIConfig without a proxy leaves the chart's: %v", env)
	}
	if env := envOf(Config{}); len(env) != 0 {
		t.Errorf("no proxy: env %v", env)
	}
	if got := Build(Config{}, Spec{Name: "p"}).Spec.Containers[0].Env; got != nil {
		t.Errorf("no proxy: env %v", got)
	}

	for _, tc := range []struct {
		p    Proxy
		want string
	}{
		{Proxy{HTTP: "proxy.example.com:3128"}, "not an http:// or https:// URL"},
		{Proxy{HTTPS: "socks5://proxy:1080"}, "not an http:// or https:// URL"},
		{Proxy{HTTP: "http://user:secret@proxy:3128"}, "user name or password"},
		{Proxy{HTTP: "http://proxy:3128", TrustedCA: "not a certificate"}, "holds no PEM certificate"},
	} {
		err := Config{Proxy: tc.p}.ValidateEgress()
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "secret") {
			t.Errorf("%+v: %v, want an error saying %q (and not the password)", tc.p, err, tc.want)
		}
	}
	if err := (Config{Proxy: Proxy{HTTP: "http://proxy:3128", HTTPS: "https://proxy:3129"}}).ValidateEgress(); err != nil {
		t.Error(err)
	}
}
