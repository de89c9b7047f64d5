// Package pki issues the certificates of the test clusters: a CA, client and serving
// certificates, kubeconfigs, service account keys, and the apiserver's front-proxy.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Authority is a certificate authority and the files it issued, under Dir.
type Authority struct {
	Dir string
	// CAFile is the CA's certificate, ca.crt.
	CAFile string
	ca     *x509.Certificate
	caKey  crypto.Signer
}

// New makes a CA named cn and writes it to dir as ca.crt and ca.key.
func New(dir, cn string) (*Authority, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().AddDate(1, 0, 0), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	ca, _ := x509.ParseCertificate(der)
	p := &Authority{Dir: dir, ca: ca, caKey: key, CAFile: filepath.Join(dir, "ca.crt")}
	if err := writePEM(p.CAFile, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	return p, p.writeKey(filepath.Join(dir, "ca.key"), key)
}

func (p *Authority) writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "PRIVATE KEY", der)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// Issue writes name.crt and name.key: a client certificate for cn in groups, and a serving
// one for the hosts given.
func (p *Authority) Issue(name, cn string, groups []string, hosts ...string) (crt, key string, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn, Organization: groups},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().AddDate(1, 0, 0),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if len(hosts) > 0 {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, h)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, k.Public(), p.caKey)
	if err != nil {
		return "", "", err
	}
	crt, key = filepath.Join(p.Dir, name+".crt"), filepath.Join(p.Dir, name+".key")
	if err := writePEM(crt, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	return crt, key, p.writeKey(key, k)
}

// Kubeconfig writes name.kubeconfig: server, the CA, and a client certificate for cn.
func (p *Authority) Kubeconfig(name, server, cn string, groups ...string) (string, error) {
	crt, key, err := p.Issue(name, cn, groups)
	if err != nil {
		return "", err
	}
	path := filepath.Join(p.Dir, name+".kubeconfig")
	return path, os.WriteFile(path, fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: diskpipe-test
  cluster: {server: %q, certificate-authority: %q}
users:
- name: %s
  user: {client-certificate: %q, client-key: %q}
contexts:
- name: diskpipe-test
  context: {cluster: diskpipe-test, user: %s}
current-context: diskpipe-test
`, server, p.CAFile, name, crt, key, name), 0o600)
}

// ServiceAccountKeys writes the key pair that signs and verifies service account tokens.
func (p *Authority) ServiceAccountKeys() (key, pub string, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return "", "", err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		return "", "", err
	}
	key, pub = filepath.Join(p.Dir, "sa.key"), filepath.Join(p.Dir, "sa.pub")
	if err := writePEM(key, "EC PRIVATE KEY", der); err != nil {
		return "", "", err
	}
	return key, pub, writePEM(pub, "PUBLIC KEY", pubDER)
}

// FrontProxyClient is the name of the apiserver's front-proxy client certificate.
const FrontProxyClient = "front-proxy-client"

// FrontProxyFlags makes a front-proxy CA under dir and the apiserver's client certificate,
// and returns the kube-apiserver flags (by name, without dashes) that make it authenticate to
// aggregated APIs with them, as kubeadm sets them up.
func FrontProxyFlags(dir string) (map[string]string, error) {
	ca, err := New(dir, "front-proxy-ca")
	if err != nil {
		return nil, err
	}
	crt, key, err := ca.Issue(FrontProxyClient, FrontProxyClient, nil)
	if err != nil {
		return nil, err
	}
	return map[string]string{
		"requestheader-client-ca-file":       ca.CAFile,
		"requestheader-allowed-names":        FrontProxyClient,
		"requestheader-username-headers":     "X-Remote-User",
		"requestheader-group-headers":        "X-Remote-Group",
		"requestheader-extra-headers-prefix": "X-Remote-Extra-",
		"proxy-client-cert-file":             crt,
		"proxy-client-key-file":              key,
	}, nil
}
