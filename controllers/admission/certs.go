package admission

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/internal/certs"
)

// Lifetimes of the certificates CertKeeper issues. A certificate is renewed once less than a
// third of its lifetime is left, so a manager that was down for months still renews in time.
const (
	CALifetime   = 10 * 365 * 24 * time.Hour
	LeafLifetime = 365 * 24 * time.Hour
)

// Keys of the certificate Secret. tls.crt and tls.key make it usable as a kubernetes.io/tls
// Secret too.
const (
	keyCACert = "ca.crt"
	keyCAKey  = "ca.key"
	keyCert   = corev1.TLSCertKey
	keyKey    = corev1.TLSPrivateKeyKey
)

// CertKeeper gives the webhooks a serving certificate without cert-manager: it issues a CA
// and a certificate for Hosts, keeps both in a Secret (so every replica and every restart
// serves the same one), hands the certificate to the webhook server from memory
// (GetCertificate: swapped atomically, no files), and puts the CA into the caBundle of the
// webhook configuration. Sync renews whatever is within a third of its lifetime of
// expiring; during a CA renewal caBundle holds the old CA and the new one.
type CertKeeper struct {
	// Client writes; Reader reads straight from the apiserver (the manager's cache has not
	// started when the first Sync runs).
	Client client.Client
	Reader client.Reader
	// Namespace and SecretName name the certificate Secret.
	Namespace, SecretName string
	// Configuration is the ValidatingWebhookConfiguration whose caBundle is kept.
	Configuration string
	// Mutating are MutatingWebhookConfigurations (served by the same server, CDI's
	// StorageProfile webhook) whose caBundle is kept too.
	Mutating []string
	// APIServices are the APIServices (served by the same server) whose caBundle is kept: the
	// upload token APIs.
	APIServices []string
	// KubeSphere are objects of KubeSphere's extensions that reach a server this CA issued for
	// (the gateway's): their caBundle is kept, so ks-apiserver verifies it.
	KubeSphere []KubeSphereObject
	// Hosts are the certificate's DNS names and IP addresses.
	Hosts []string
	// Leaves are certificates the same CA issues for other servers (the upload proxy), each
	// kept in a Secret of Namespace of its own with ca.crt, tls.crt and tls.key: never the
	// CA's key, so what mounts it can serve as that server and nothing more.
	Leaves []Leaf
	// Every is how often Start syncs (default 10 minutes).
	Every time.Duration

	current atomic.Pointer[tls.Certificate]
}

// KubeSphereObject names an extensions.kubesphere.io/v1alpha1 APIService or ReverseProxy.
type KubeSphereObject struct {
	Kind, Name string
}

// KubeSphereKinds are the kinds of KubeSphereObject, each with where its caBundle is.
var KubeSphereKinds = map[string][]string{
	"APIService":   {"spec", "caBundle"},
	"ReverseProxy": {"spec", "upstream", "caBundle"},
}

// Leaf is a serving certificate CertKeeper keeps for a server other than the manager.
type Leaf struct {
	SecretName string
	Hosts      []string
}

// GetCertificate is the webhook server's tls.Config.GetCertificate: the certificate of the
// last Sync.
func (k *CertKeeper) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c := k.current.Load()
	if c == nil {
		return nil, errors.New("the webhooks' certificate has not been issued yet")
	}
	return c, nil
}

// Start syncs every k.Every until ctx ends; a failed sync is logged and tried again at the
// next tick. Every replica runs it: each serves the webhooks and needs the files.
func (k *CertKeeper) Start(ctx context.Context) error {
	every := k.Every
	if every == 0 {
		every = 10 * time.Minute
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := k.Sync(ctx); err != nil {
				ctrl.LoggerFrom(ctx).Error(err, "Could not sync the webhooks' certificate")
			}
		}
	}
}

// NeedLeaderElection is false: every replica serves the webhooks.
func (k *CertKeeper) NeedLeaderElection() bool { return false }

// Sync makes the Secret current (issuing or renewing), serves its certificate and patches
// caBundle. Replicas that race to write the Secret lose to one another optimistically: the
// loser reads the winner's certificate and serves that.
func (k *CertKeeper) Sync(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		err := k.sync(ctx)
		if !errors.Is(err, errLostRace) || attempt == 3 {
			return err
		}
	}
}

var errLostRace = errors.New("another replica wrote the webhook certificate Secret first")

func (k *CertKeeper) sync(ctx context.Context) error {
	sec := &corev1.Secret{}
	err := k.Reader.Get(ctx, client.ObjectKey{Namespace: k.Namespace, Name: k.SecretName}, sec)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading the webhook certificate Secret: %w", err)
	}
	exists := err == nil
	bundle, changed, err := renew(sec, k.Hosts, time.Now())
	if err != nil {
		return err
	}
	if changed {
		if err := k.writeSecret(ctx, sec, k.SecretName, exists); err != nil {
			return err
		}
	}
	pair, err := tls.X509KeyPair(sec.Data[keyCert], sec.Data[keyKey])
	if err != nil {
		return fmt.Errorf("the webhook certificate Secret: %w", err)
	}
	k.current.Store(&pair)
	ca, caKey, err := certs.ParsePair(sec.Data[keyCACert], sec.Data[keyCAKey])
	if err != nil {
		return fmt.Errorf("the webhook certificate Secret's CA: %w", err)
	}
	// The webhooks' bundle first: a leaf that cannot be written (its Secret held or refused)
	// must not keep the webhooks from trusting a renewed CA, which would fail them all.
	if err := k.patchBundle(ctx, bundle); err != nil {
		return err
	}
	var errs []error
	for _, l := range k.Leaves {
		errs = append(errs, k.syncLeaf(ctx, l, ca, caKey, bundle))
	}
	return errors.Join(errs...)
}

// syncLeaf makes l's Secret hold a current certificate of ca and bundle as its ca.crt.
func (k *CertKeeper) syncLeaf(ctx context.Context, l Leaf, ca *x509.Certificate, caKey *ecdsa.PrivateKey, bundle []byte) error {
	sec := &corev1.Secret{}
	err := k.Reader.Get(ctx, client.ObjectKey{Namespace: k.Namespace, Name: l.SecretName}, sec)
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading the certificate Secret %s: %w", l.SecretName, err)
	}
	exists := err == nil
	if sec.Data == nil {
		sec.Data = map[string][]byte{}
	}
	changed, err := renewLeaf(sec, ca, caKey, l.Hosts, time.Now())
	if err != nil {
		return err
	}
	if !bytes.Equal(sec.Data[keyCACert], bundle) {
		sec.Data[keyCACert], changed = bundle, true
	}
	if !changed {
		return nil
	}
	return k.writeSecret(ctx, sec, l.SecretName, exists)
}

// writeSecret writes sec as the kubernetes.io/tls Secret name of the keeper's namespace,
// creating it unless it exists; another replica that wrote it first is errLostRace.
func (k *CertKeeper) writeSecret(ctx context.Context, sec *corev1.Secret, name string, exists bool) error {
	sec.Name, sec.Namespace, sec.Type = name, k.Namespace, corev1.SecretTypeTLS
	var err error
	if exists {
		err = k.Client.Update(ctx, sec)
	} else {
		err = k.Client.Create(ctx, sec)
	}
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		return errLostRace
	}
	if err != nil {
		return fmt.Errorf("writing the certificate Secret %s: %w", name, err)
	}
	return nil
}

func (k *CertKeeper) patchBundle(ctx context.Context, bundle []byte) error {
	validating := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := k.patchOne(ctx, "webhook configuration", k.Configuration, validating, bundle, func() (cs []*admissionregistrationv1.WebhookClientConfig) {
		for i := range validating.Webhooks {
			cs = append(cs, &validating.Webhooks[i].ClientConfig)
		}
		return cs
	}); err != nil {
		return err
	}
	for _, name := range k.Mutating {
		mutating := &admissionregistrationv1.MutatingWebhookConfiguration{}
		if err := k.patchOne(ctx, "mutating webhook configuration", name, mutating, bundle, func() (cs []*admissionregistrationv1.WebhookClientConfig) {
			for i := range mutating.Webhooks {
				cs = append(cs, &mutating.Webhooks[i].ClientConfig)
			}
			return cs
		}); err != nil {
			return err
		}
	}
	// The aggregated APIs of upload tokens: the apiserver checks the manager's certificate
	// against each APIService's caBundle.
	for _, name := range k.APIServices {
		if err := k.patchAPIService(ctx, name, bundle); err != nil {
			return err
		}
	}
	for _, o := range k.KubeSphere {
		if err := k.patchKubeSphere(ctx, o, bundle); err != nil {
			return err
		}
	}
	return nil
}

func (k *CertKeeper) patchAPIService(ctx context.Context, name string, bundle []byte) error {
	gvk := schema.GroupVersionKind{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIService"}
	return k.patchCABundle(ctx, gvk, name, []string{"spec", "caBundle"}, base64.StdEncoding.EncodeToString(bundle))
}

// patchKubeSphere keeps the caBundle of a KubeSphere extension's object. ks-apiserver decodes
// that []byte field as base64 once more (pkg/apiserver/filters/apiservice.go and
// reverseproxy.go), so it holds the PEM base64-encoded twice.
func (k *CertKeeper) patchKubeSphere(ctx context.Context, o KubeSphereObject, bundle []byte) error {
	field, ok := KubeSphereKinds[o.Kind]
	if !ok {
		return fmt.Errorf("KubeSphere's kind %q has no caBundle the manager keeps", o.Kind)
	}
	gvk := schema.GroupVersionKind{Group: "extensions.kubesphere.io", Version: "v1alpha1", Kind: o.Kind}
	once := base64.StdEncoding.EncodeToString(bundle)
	return k.patchCABundle(ctx, gvk, o.Name, field, base64.StdEncoding.EncodeToString([]byte(once)))
}

// patchCABundle sets the string field of the cluster-scoped object (gvk, name) to value where
// it is not that yet.
func (k *CertKeeper) patchCABundle(ctx context.Context, gvk schema.GroupVersionKind, name string, field []string, value string) error {
	obj := &unstructured.Unstructured{}
	obj.SetGroupVersionKind(gvk)
	if err := k.Reader.Get(ctx, client.ObjectKey{Name: name}, obj); err != nil {
		return fmt.Errorf("reading the %s %s: %w", gvk.Kind, name, err)
	}
	if current, _, _ := unstructured.NestedString(obj.Object, field...); current == value {
		return nil
	}
	patch := map[string]any{}
	at := patch
	for _, f := range field[:len(field)-1] {
		next := map[string]any{}
		at[f] = next
		at = next
	}
	at[field[len(field)-1]] = value
	data, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	if err := k.Client.Patch(ctx, obj, client.RawPatch(types.MergePatchType, data)); err != nil {
		return fmt.Errorf("patching the caBundle of the %s %s: %w", gvk.Kind, name, err)
	}
	return nil
}

// patchOne reads the configuration obj (what, of that name) and patches bundle into the client
// configs of its webhooks where it is not there yet.
func (k *CertKeeper) patchOne(ctx context.Context, what, name string, obj client.Object, bundle []byte, configs func() []*admissionregistrationv1.WebhookClientConfig) error {
	if err := k.Reader.Get(ctx, client.ObjectKey{Name: name}, obj); err != nil {
		return fmt.Errorf("reading the %s %s: %w", what, name, err)
	}
	base, ok := obj.DeepCopyObject().(client.Object)
	if !ok {
		return fmt.Errorf("copying the %s %s", what, name)
	}
	changed := false
	for _, c := range configs() {
		if !bytes.Equal(c.CABundle, bundle) {
			c.CABundle, changed = bundle, true
		}
	}
	if !changed {
		return nil
	}
	if err := k.Client.Patch(ctx, obj, client.StrategicMergeFrom(base)); err != nil {
		return fmt.Errorf("patching the caBundle of the %s %s: %w", what, name, err)
	}
	return nil
}

// renew brings sec's CA and certificate up to date for hosts at now. It returns the
// caBundle to publish and whether sec changed.
func renew(sec *corev1.Secret, hosts []string, now time.Time) ([]byte, bool, error) {
	if sec.Data == nil {
		sec.Data = map[string][]byte{}
	}
	ca, caKey, caErr := certs.ParsePair(sec.Data[keyCACert], sec.Data[keyCAKey])
	bundle := sec.Data[keyCACert]
	changed := false
	if caErr != nil || fresh(ca, now) != nil {
		newCA, newKey, err := certs.Issue(nil, nil, "diskpipe webhook CA", nil, now, CALifetime)
		if err != nil {
			return nil, false, err
		}
		bundle = certs.PEMCert(newCA)
		if caErr == nil && now.Before(ca.NotAfter) { // the old CA still signs the served certificate
			bundle = append(bundle, certs.PEMCert(ca)...)
		}
		ca, caKey, changed = newCA, newKey, true
		sec.Data[keyCACert], sec.Data[keyCAKey] = bundle, certs.PEMKey(newKey)
	}
	leafChanged, err := renewLeaf(sec, ca, caKey, hosts, now)
	return bundle, changed || leafChanged, err
}

// renewLeaf issues sec's tls.crt and tls.key anew from ca unless they are a fresh
// certificate of ca for hosts. It reports whether it did.
func renewLeaf(sec *corev1.Secret, ca *x509.Certificate, caKey *ecdsa.PrivateKey, hosts []string, now time.Time) (bool, error) {
	leaf, _, err := certs.ParsePair(sec.Data[keyCert], sec.Data[keyKey])
	if err == nil && fresh(leaf, now) == nil && leaf.CheckSignatureFrom(ca) == nil && covers(leaf, hosts) {
		return false, nil
	}
	cert, key, err := certs.Issue(ca, caKey, "", hosts, now, LeafLifetime)
	if err != nil {
		return false, err
	}
	sec.Data[keyCert], sec.Data[keyKey] = certs.PEMCert(cert), certs.PEMKey(key)
	return true, nil
}

// fresh is nil while more than a third of c's lifetime is left.
func fresh(c *x509.Certificate, now time.Time) error {
	renewAt := c.NotAfter.Add(-c.NotAfter.Sub(c.NotBefore) / 3)
	if now.Before(c.NotBefore) || !now.Before(renewAt) {
		return fmt.Errorf("certificate %s is due for renewal since %s", c.Subject.CommonName, renewAt)
	}
	return nil
}

func covers(c *x509.Certificate, hosts []string) bool {
	for _, h := range hosts {
		if c.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}
