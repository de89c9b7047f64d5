// Command manager runs diskpipe's controllers.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	upload "github.com/diskpipe/diskpipe/apis/upload/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/admission"
	"github.com/diskpipe/diskpipe/controllers/manager"
	"github.com/diskpipe/diskpipe/objectstore"
)

func main() {
	var opts manager.Options
	flag.StringVar(&opts.MetricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint (\"0\" turns it off)")
	flag.BoolVar(&opts.MetricsSecure, "metrics-secure", true, "serve metrics over HTTPS only to bearers of a token allowed to get /metrics")
	flag.StringVar(&opts.ProbeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	flag.BoolVar(&opts.LeaderElection, "leader-elect", false, "elect a leader so that only one replica reconciles")
	flag.StringVar(&opts.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's)")
	var importerImage string
	flag.StringVar(&importerImage, "importer-image", "", "image of importer pods (diskpipe's image); overrides --config's")
	var (
		configFile     string
		webhook        manager.WebhookOptions
		webhookService string
		store          objectstore.ClientConfig
		storeCredsDir  string
	)
	flag.StringVar(&configFile, "config", "", "the chart's configuration file: importer pod settings and clone strategy defaults")
	flag.IntVar(&webhook.Port, "webhook-port", 0, "port of the admission webhooks (0: none served)")
	flag.StringVar(&webhook.CertDir, "webhook-cert-dir", "/var/run/diskpipe/webhook", "directory of the webhooks' tls.crt and tls.key")
	flag.StringVar(&webhook.Configuration, "webhook-configuration", admission.ConfigurationName, "name of the ValidatingWebhookConfiguration")
	flag.StringVar(&webhook.CertSecret, "webhook-cert-secret", "", "Secret in which the manager keeps the webhooks' certificate it issues and renews (empty: cert-manager or another tool writes --webhook-cert-dir)")
	flag.StringVar(&webhookService, "webhook-service", "", "DNS name of the webhooks' Service (<name>.<namespace>.svc), for the certificate")
	var tokenSecret, proxyService, ownerKeySecret string
	flag.StringVar(&ownerKeySecret, "owner-key-secret", "", "NAMESPACE/NAME of the Secret holding the key the manager marks the children it makes with, made if missing (default: POD_NAMESPACE/diskpipe-owner-key)")
	flag.StringVar(&tokenSecret, "upload-token-secret", "", "NAMESPACE/NAME of the Secret holding the key upload tokens are signed with, made if missing (empty: no upload tokens)")
	flag.StringVar(&webhook.UploadProxyURL, "upload-proxy-url", "", "the upload proxy's URL outside the cluster, told to token requesters (empty: none)")
	var proxyCertSecret string
	flag.StringVar(&proxyCertSecret, "upload-proxy-cert-secret", "", "Secret in which the manager keeps the upload proxy's serving certificate, issued by the webhooks' CA for --upload-proxy-service (needs --webhook-cert-secret; empty: none)")
	var gatewayCertSecret, gatewayService, kubesphereCA string
	flag.StringVar(&kubesphereCA, "kubesphere-ca-objects", "", "comma-separated Kind/name of KubeSphere's APIService and ReverseProxy objects that reach the gateway: the manager keeps the gateway's CA in their caBundle (needs --gateway-cert-secret)")
	flag.StringVar(&gatewayCertSecret, "gateway-cert-secret", "", "Secret in which the manager keeps the console gateway's serving certificate, issued by the webhooks' CA for --gateway-service (needs --webhook-cert-secret; empty: none)")
	flag.StringVar(&gatewayService, "gateway-service", "", "DNS name of the console gateway's Service (<name>.<namespace>.svc), for its certificate")
	flag.StringVar(&proxyService, "upload-proxy-service", "", "the upload proxy's Service, told to token requesters, as SCHEME:NAMESPACE/NAME:PORT (http:diskpipe-system/diskpipe-uploadproxy:upload)")
	store.BindFlags(flag.CommandLine, &storeCredsDir)
	flag.StringVar(&opts.ObjectStorePublicEndpoint, "objectstore-public-endpoint", "", "the store's URL outside the cluster, for exports' download URLs (empty: --objectstore-endpoint)")
	var qps float64
	var burst int
	flag.IntVar(&opts.Concurrency, "concurrency", 8, "objects of each kind reconciled at once")
	flag.Float64Var(&qps, "kube-api-qps", 200, "requests per second to the apiserver")
	flag.IntVar(&burst, "kube-api-burst", 400, "burst of requests to the apiserver")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))

	var err error
	if configFile != "" {
		var fc manager.FileConfig
		fc, err = manager.LoadConfig(configFile)
		fc.Apply(&opts)
	}
	opts.Namespace = os.Getenv("POD_NAMESPACE")
	if ownerKeySecret == "" {
		ownerKeySecret = opts.Namespace + "/diskpipe-owner-key"
	}
	if ns, name, ok := strings.Cut(ownerKeySecret, "/"); ok && ns != "" && name != "" {
		opts.OwnerKeySecret = types.NamespacedName{Namespace: ns, Name: name}
	} else if err == nil {
		err = fmt.Errorf("--owner-key-secret %q: want NAMESPACE/NAME (or POD_NAMESPACE set)", ownerKeySecret)
	}
	if importerImage != "" {
		opts.Importer.Image = importerImage
	}
	if webhook.Port != 0 {
		webhook.Namespace = os.Getenv("POD_NAMESPACE")
		if webhookService != "" {
			webhook.Hosts = []string{webhookService, webhookService + ".cluster.local"}
		}
		if webhook.CertSecret != "" && (webhook.Namespace == "" || webhookService == "") && err == nil {
			err = errors.New("--webhook-cert-secret needs --webhook-service and the POD_NAMESPACE environment variable")
		}
		opts.Webhook = &webhook
		if tokenSecret != "" && err == nil {
			err = parseTokenFlags(&webhook, tokenSecret, proxyService)
		}
		if proxyCertSecret != "" && err == nil {
			if p := webhook.UploadProxyService; webhook.CertSecret != "" && p != nil && p.Scheme == "https" {
				webhook.Leaves = append(webhook.Leaves, serviceLeaf(proxyCertSecret, p.Name+"."+p.Namespace+".svc"))
			} else {
				err = errors.New("--upload-proxy-cert-secret needs --webhook-cert-secret, --upload-token-secret and an https --upload-proxy-service")
			}
		}
	}
	if gatewayCertSecret != "" && err == nil {
		if webhook.CertSecret == "" || !strings.HasSuffix(gatewayService, ".svc") {
			err = errors.New("--gateway-cert-secret needs --webhook-cert-secret and --gateway-service <name>.<namespace>.svc")
		} else {
			webhook.Leaves = append(webhook.Leaves, serviceLeaf(gatewayCertSecret, gatewayService))
		}
	}
	if kubesphereCA != "" && err == nil {
		if gatewayCertSecret == "" {
			err = errors.New("--kubesphere-ca-objects needs --gateway-cert-secret: the CA kept in them is the one that issues the gateway's certificate")
		}
		for _, o := range strings.Split(kubesphereCA, ",") {
			kind, name, ok := strings.Cut(strings.TrimSpace(o), "/")
			if _, known := admission.KubeSphereKinds[kind]; (!ok || !known || name == "") && err == nil {
				err = fmt.Errorf("--kubesphere-ca-objects %q: want APIService/<name> or ReverseProxy/<name>", o)
			}
			webhook.KubeSphere = append(webhook.KubeSphere, admission.KubeSphereObject{Kind: kind, Name: name})
		}
	}
	if store.Endpoint != "" && err == nil {
		opts.ObjectStore = &store
		err = opts.ObjectStore.LoadCredentials(storeCredsDir)
	}
	var mgr ctrl.Manager
	if err == nil {
		cfg := ctrl.GetConfigOrDie()
		cfg.QPS, cfg.Burst = float32(qps), burst
		mgr, err = manager.New(cfg, opts)
	}
	if err == nil {
		err = mgr.Start(ctrl.SetupSignalHandler())
	}
	if err != nil {
		ctrl.Log.Error(err, "Manager stopped")
		os.Exit(1)
	}
}

// parseTokenFlags reads --upload-token-secret and --upload-proxy-service.
func parseTokenFlags(w *manager.WebhookOptions, secret, service string) error {
	ns, name, ok := strings.Cut(secret, "/")
	if !ok || ns == "" || name == "" {
		return fmt.Errorf("--upload-token-secret %q: want NAMESPACE/NAME", secret)
	}
	w.UploadTokenSecret = types.NamespacedName{Namespace: ns, Name: name}
	if service == "" {
		return nil
	}
	scheme, rest, ok1 := strings.Cut(service, ":")
	nsName, port, ok2 := strings.Cut(rest, ":")
	svcNS, svcName, ok3 := strings.Cut(nsName, "/")
	if !ok1 || !ok2 || !ok3 || (scheme != "http" && scheme != "https") {
		return fmt.Errorf("--upload-proxy-service %q: want SCHEME:NAMESPACE/NAME:PORT, SCHEME http or https", service)
	}
	w.UploadProxyService = &upload.ProxyService{Namespace: svcNS, Name: svcName, Port: port, Scheme: scheme}
	return nil
}

// serviceLeaf is a serving certificate the manager keeps in secret for the Service of DNS name
// host (<name>.<namespace>.svc), by that name and its cluster.local one.
func serviceLeaf(secret, host string) admission.Leaf {
	return admission.Leaf{SecretName: secret, Hosts: []string{host, host + ".cluster.local"}}
}
