package hostcopy

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// TestTokenPair: the two token Secrets are made without reading either back, and end up
// holding one token whichever of them a pass cut short left behind.
func TestTokenPair(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	// The fake client stores StringData as given; the apiserver would move it to Data.
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "disk", Namespace: "vms", UID: "u1"}}
	mine := client.ObjectKey{Namespace: "vms", Name: tokenSecretName(owner)}
	theirs := client.ObjectKey{Namespace: "images", Name: serveSecretName(owner)}
	tokens := func() (string, string) {
		t.Helper()
		m, th := &corev1.Secret{}, &corev1.Secret{}
		if err := c.Get(t.Context(), mine, m); err != nil {
			t.Fatal(err)
		}
		if err := c.Get(t.Context(), theirs, th); err != nil {
			t.Fatal(err)
		}
		if m.StringData["header"] != "Authorization: Bearer "+m.StringData["token"] {
			t.Errorf("header %q for token %q", m.StringData["header"], m.StringData["token"])
		}
		// The importer trusts a CA that issued the server's certificate, for ServerName.
		pair, err := tls.X509KeyPair([]byte(th.StringData["tls.crt"]), []byte(th.StringData["tls.key"]))
		if err != nil {
			t.Fatalf("the server's pair: %v", err)
		}
		if _, ok := m.StringData["tls.key"]; ok {
			t.Error("the importer got the server's key")
		}
		for _, sec := range []*corev1.Secret{m, th} {
			if len(sec.StringData) != 3 || strings.Count(fmt.Sprint(sec.StringData), "PRIVATE KEY-----") > 2 {
				t.Errorf("%s holds more than it needs: %v", sec.Name, slices.Collect(maps.Keys(sec.StringData)))
			}
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM([]byte(m.StringData["ca.crt"]))
		if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: ServerName}); err != nil {
			t.Errorf("the server's certificate does not verify as %s: %v", ServerName, err)
		}
		return m.StringData["token"], th.StringData["token"]
	}
	ensure := func() {
		t.Helper()
		if err := ensureToken(t.Context(), c, owner, "images"); err != nil {
			t.Fatal(err)
		}
	}
	ensure()
	a, b := tokens()
	if a == "" || a != b {
		t.Fatalf("tokens %q and %q", a, b)
	}
	ensure()
	if a2, _ := tokens(); a2 != a {
		t.Error("a second pass changed a complete pair")
	}
	for _, gone := range []client.ObjectKey{mine, theirs} {
		if err := c.Delete(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: gone.Namespace, Name: gone.Name}}); err != nil {
			t.Fatal(err)
		}
		ensure()
		if x, y := tokens(); x != y || x == a {
			t.Errorf("after losing %s: tokens %q and %q (first %q)", gone.Name, x, y, a)
		}
	}
}
