// Package manager builds diskpipe's controller-runtime manager: the scheme, health and
// readiness probes, the metrics endpoint, leader election, and the controllers.
package manager

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"k8s.io/apimachinery/pkg/types"

	upload "github.com/diskpipe/diskpipe/apis/upload/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/admission"
	cdipolicy "github.com/diskpipe/diskpipe/controllers/cdi/policy"
	"github.com/diskpipe/diskpipe/controllers/disk"
	"github.com/diskpipe/diskpipe/controllers/export"
	"github.com/diskpipe/diskpipe/controllers/image"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/controllers/internal/metrics"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/populator"
	"github.com/diskpipe/diskpipe/controllers/virtualmachine"
	"github.com/diskpipe/diskpipe/internal/uploadtoken"
	"github.com/diskpipe/diskpipe/objectstore"
	"github.com/diskpipe/diskpipe/objectstore/tenancy"
	"github.com/diskpipe/diskpipe/uploadproxy"
)

// Options configure the manager.
type Options struct {
	// MetricsAddr is where Prometheus metrics are served ("0" turns them off).
	MetricsAddr string
	// MetricsSecure serves them over HTTPS to a client whose bearer token the apiserver
	// authenticates and allows to get the non-resource URL /metrics (the chart's
	// <release>-metrics-reader ClusterRole): they name the objects of every namespace.
	MetricsSecure bool
	// ProbeAddr is where /healthz and /readyz are served.
	ProbeAddr string
	// LeaderElection makes only one replica reconcile at a time.
	LeaderElection bool
	// LeaderElectionNamespace holds the leader's Lease; empty means the pod's namespace.
	LeaderElectionNamespace string
	// Importer is how importer pods run.
	Importer importpod.Config
	// CloneStrategies are the installation's clone strategy defaults.
	CloneStrategies disk.StrategyDefaults
	// AllowHostDisk lets VirtualMachines use hostDisk volumes (the chart's
	// virtualMachines.allowHostDisk).
	AllowHostDisk bool
	// CDICompatibility serves CDI's API: DataVolumes (the chart's cdi.compatibility.enabled,
	// which installs its CRDs).
	CDICompatibility bool
	// Namespace is the manager's own (the pod's): where CDIConfig's
	// spec.importProxy.trustedCAProxy names a ConfigMap, as CDI's namespace was.
	Namespace string
	// ObjectStore is the bundled object store (objectStore sources, exports); nil: none.
	ObjectStore *objectstore.ClientConfig
	// ObjectStorePublicEndpoint is the store's URL outside the cluster (an Ingress), used in
	// exports' download URLs; empty: ObjectStore's endpoint.
	ObjectStorePublicEndpoint string
	// Webhook serves the admission webhooks; nil serves none.
	Webhook *WebhookOptions
	// Concurrency is how many objects of a kind are reconciled at once (default 8).
	Concurrency int
	// SkipNameValidation allows more than one manager in a process (tests run several).
	SkipNameValidation bool
	// OwnerKeySecret holds the key the children diskpipe makes are marked with (owned.LoadKey),
	// made if missing; empty only where a test set the key itself (owned.UseKey).
	OwnerKeySecret types.NamespacedName
}

// WebhookOptions say where the admission webhooks are served.
type WebhookOptions struct {
	Host string
	Port int
	// CertDir holds tls.crt and tls.key, reloaded when they change (cert-manager's
	// rotation); unused when the manager issues the certificate itself (CertSecret).
	CertDir string
	// Configuration is the ValidatingWebhookConfiguration the webhooks are registered in.
	Configuration string
	// CertSecret, when set, makes the manager issue and renew the certificate itself
	// (admission.CertKeeper), kept in this Secret of Namespace, for Hosts; empty means
	// something else (cert-manager, a test) writes CertDir and caBundle.
	CertSecret, Namespace string
	Hosts                 []string
	// Leaves, with CertSecret, are the serving certificates the manager keeps besides the
	// webhooks', signed by the same CA: the upload proxy's, the console gateway's.
	Leaves []admission.Leaf
	// KubeSphere, with CertSecret, are KubeSphere's objects reaching the gateway whose caBundle
	// the manager keeps.
	KubeSphere []admission.KubeSphereObject
	// CertSync is how often every replica re-reads the certificate Secret, renews what is
	// due and re-patches caBundle (default 10 minutes).
	CertSync time.Duration
	// UploadTokenSecret, when set, makes the manager serve the upload token API
	// (uploadproxy.TokenAPI, an aggregated API on the webhook server), signing tokens with the
	// key in this Secret (made if missing).
	UploadTokenSecret types.NamespacedName
	// UploadProxyURL and UploadProxyService tell token requesters where the upload proxy is.
	UploadProxyURL     string
	UploadProxyService *upload.ProxyService
}

// serveTokenAPI serves api, the upload token API, on the webhook server; its signing key is
// made now if there is none.
func serveTokenAPI(ctx context.Context, cfg *rest.Config, mgr ctrl.Manager, w *WebhookOptions, api *uploadproxy.TokenAPI) error {
	direct, err := client.New(cfg, client.Options{Scheme: NewScheme()})
	if err != nil {
		return err
	}
	key := &uploadtoken.Key{Client: direct, Namespace: w.UploadTokenSecret.Namespace, Name: w.UploadTokenSecret.Name}
	if _, err := key.Ensure(ctx); err != nil {
		return err
	}
	api.Auth, api.Client, api.Reader, api.Key = &uploadproxy.FrontProxy{Reader: direct}, direct, direct, key
	for _, p := range uploadproxy.TokenAPIPaths {
		mgr.GetWebhookServer().Register(p, api)
	}
	return nil
}

// LeaderElectionID is the name of the Lease the manager's replicas contend for.
const LeaderElectionID = "diskpipe-manager.diskpipe.io"

// New returns a manager for cfg, with health and readiness checks installed.
func New(cfg *rest.Config, opts Options) (ctrl.Manager, error) {
	if opts.Concurrency == 0 {
		opts.Concurrency = 8
	}
	if err := loadOwnerKey(cfg, opts); err != nil {
		return nil, err
	}
	hooks, keeper, err := webhookServer(cfg, opts.Webhook)
	if err != nil {
		return nil, err
	}
	renew := 10 * time.Second
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		WebhookServer:                 hooks,
		Scheme:                        NewScheme(),
		Metrics:                       metricsOptions(opts),
		HealthProbeBindAddress:        opts.ProbeAddr,
		LeaderElection:                opts.LeaderElection,
		LeaderElectionID:              LeaderElectionID,
		LeaderElectionNamespace:       opts.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
		RenewDeadline:                 &renew,
		Controller:                    config.Controller{MaxConcurrentReconciles: max(opts.Concurrency, 1), SkipNameValidation: &opts.SkipNameValidation},
		// Secrets are read one at a time, uncached: caching them would hold every Secret of
		// the cluster in memory and need the right to list them. So are the pods'
		// NetworkPolicies, read once per namespace and manager (importpod.PrepareNamespace).
		Client: client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}, &networkingv1.NetworkPolicy{}}}},
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	if opts.ObjectStore != nil {
		// Pods reach the bundled store wherever it is, inside the cluster's networks too.
		if u, err := url.Parse(opts.ObjectStore.Endpoint); err == nil && u.Hostname() != "" {
			opts.Importer.AllowedDestinations = append(slices.Clip(opts.Importer.AllowedDestinations), u.Hostname())
		}
	}
	// CDI's API, when served, goes in first: it changes the importer's options the engine's
	// controllers are made with.
	ext, err := wireCDI(mgr, &opts, keeper)
	if err != nil {
		return nil, err
	}
	st, err := newStores(mgr, opts)
	if err != nil {
		return nil, err
	}
	if err := setupControllers(mgr, opts, st, ext); err != nil {
		return nil, err
	}
	if opts.Webhook != nil {
		if err := serveWebhooks(cfg, mgr, opts, keeper, st, ext); err != nil {
			return nil, err
		}
	}
	if err := addChecks(mgr); err != nil {
		return nil, err
	}
	return mgr, nil
}

// loadOwnerKey loads the key the manager marks its children with (owned.LoadKey).
func loadOwnerKey(cfg *rest.Config, opts Options) error {
	if opts.OwnerKeySecret.Name == "" {
		if !owned.HasKey() {
			return errors.New("no --owner-key-secret: the manager needs the key it marks its children with")
		}
		return nil
	}
	direct, err := client.New(cfg, client.Options{Scheme: NewScheme()})
	if err != nil {
		return err
	}
	return owned.LoadKey(context.Background(), direct, opts.OwnerKeySecret)
}

// webhookServer is the server of the webhooks and the upload token API, and the keeper of its
// certificate when the manager issues it; nil, nil with no webhooks.
func webhookServer(cfg *rest.Config, w *WebhookOptions) (webhook.Server, *admission.CertKeeper, error) {
	if w == nil {
		return nil, nil, nil
	}
	// A client certificate is asked for, never required: the apiserver presents its
	// front-proxy certificate when it forwards to the upload token API (checked there), and
	// none when it calls a webhook.
	hookOpts := webhook.Options{Host: w.Host, Port: w.Port, CertDir: w.CertDir,
		TLSOpts: []func(*tls.Config){func(c *tls.Config) { c.ClientAuth = tls.RequestClientCert }}}
	var keeper *admission.CertKeeper
	if w.CertSecret != "" {
		// The manager's own certificate, served from memory; its first Sync is in serveWebhooks.
		direct, err := client.New(cfg, client.Options{Scheme: NewScheme()})
		if err != nil {
			return nil, nil, err
		}
		keeper = &admission.CertKeeper{Client: direct, Reader: direct, Namespace: w.Namespace,
			SecretName: w.CertSecret, Configuration: w.Configuration, Hosts: w.Hosts, Every: w.CertSync}
		keeper.Leaves, keeper.KubeSphere = w.Leaves, w.KubeSphere
		if w.UploadTokenSecret.Name != "" {
			keeper.APIServices = []string{uploadproxy.TokenAPIService}
		}
		hookOpts.TLSOpts = append(hookOpts.TLSOpts, func(c *tls.Config) { c.GetCertificate = keeper.GetCertificate })
	}
	return webhook.NewServer(hookOpts), keeper, nil
}

// stores are the object store clients the controllers and the token API share.
type stores struct {
	// store is the bundled (or configured) store, nil without one; downloads its client at
	// the public endpoint, for the links users download from.
	store, downloads *objectstore.Client
	sweeper          *tenancy.Sweeper // nil unless the store is scoped per namespace
}

func newStores(mgr ctrl.Manager, opts Options) (stores, error) {
	var st stores
	if opts.ObjectStore == nil {
		return st, nil
	}
	var err error
	if st.store, err = objectstore.NewClient(*opts.ObjectStore); err != nil {
		return st, fmt.Errorf("the object store: %w", err)
	}
	if opts.ObjectStorePublicEndpoint != "" {
		public := *opts.ObjectStore
		public.Endpoint = opts.ObjectStorePublicEndpoint
		if st.downloads, err = objectstore.NewClient(public); err != nil {
			return st, fmt.Errorf("the object store's public endpoint: %w", err)
		}
	}
	if opts.ObjectStore.Scoped {
		// The store knows a namespace by its UID, asked of the apiserver each time.
		st.store.ResolveNamespaces(tenancy.UIDs(mgr.GetAPIReader()))
		st.sweeper = &tenancy.Sweeper{Store: st.store, Reader: mgr.GetAPIReader()}
		if err := mgr.Add(st.sweeper); err != nil {
			return st, err
		}
	}
	return st, nil
}

// setupControllers sets diskpipe's own controllers up.
func setupControllers(mgr ctrl.Manager, opts Options, st stores, ext extensions) error {
	imageOpts := image.Options{Pods: opts.Importer, ObjectStore: st.store}
	if opts.ObjectStore != nil {
		imageOpts.ObjectStoreCA = opts.ObjectStore.CAFile
	}
	if err := image.SetupVirtualMachineImage(mgr, imageOpts); err != nil {
		return fmt.Errorf("setting up the VirtualMachineImage controller: %w", err)
	}
	if err := image.SetupImageTemplate(mgr, imageOpts); err != nil {
		return fmt.Errorf("setting up the ImageTemplate controller: %w", err)
	}
	diskOpts := disk.Options{Pods: opts.Importer, Strategies: opts.CloneStrategies, SnapshotClassNamed: ext.snapshotClassNamed}
	if err := disk.Setup(mgr, diskOpts); err != nil {
		return fmt.Errorf("setting up the disk controllers: %w", err)
	}
	exportOpts := export.Options{Pods: opts.Importer, Store: st.store, StoreConfig: opts.ObjectStore,
		SnapshotClassNamed: ext.snapshotClassNamed, Downloads: st.downloads}
	if err := export.Setup(mgr, exportOpts); err != nil {
		return fmt.Errorf("setting up the export controller: %w", err)
	}
	if err := populator.Setup(mgr); err != nil {
		return fmt.Errorf("setting up the populator: %w", err)
	}
	if err := virtualmachine.Setup(mgr, opts.AllowHostDisk); err != nil {
		return fmt.Errorf("setting up the VirtualMachine controller: %w", err)
	}
	return nil
}

// serveWebhooks syncs the webhooks' certificate (the server starts serving before the caches:
// it must be there) and registers the webhooks and the upload token API.
func serveWebhooks(cfg *rest.Config, mgr ctrl.Manager, opts Options, keeper *admission.CertKeeper, st stores, ext extensions) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if keeper != nil {
		if err := keeper.Sync(ctx); err != nil {
			return fmt.Errorf("the webhooks' certificate: %w", err)
		}
		if err := mgr.Add(keeper); err != nil {
			return err
		}
	}
	if err := admission.Register(ctx, mgr, opts.AllowHostDisk, cdipolicy.SourceKinds()...); err != nil {
		return fmt.Errorf("setting up the admission webhooks: %w", err)
	}
	w := opts.Webhook
	if w.UploadTokenSecret.Name == "" {
		return nil
	}
	api := &uploadproxy.TokenAPI{URL: w.UploadProxyURL, Service: w.UploadProxyService}
	for _, group := range ext.tokenGroups {
		api.Groups = append(api.Groups, group(api))
	}
	if opts.ObjectStore != nil && opts.ObjectStore.Scoped {
		api.Store, api.StoreEndpoint = st.store, cmp.Or(opts.ObjectStorePublicEndpoint, opts.ObjectStore.Endpoint)
		st.sweeper.Keys = api.RenewStoreKeys
	}
	if err := serveTokenAPI(ctx, cfg, mgr, w, api); err != nil {
		return fmt.Errorf("setting up the upload token API: %w", err)
	}
	return nil
}

// addChecks installs the health and readiness checks, and the state metrics.
func addChecks(mgr ctrl.Manager) error {
	if err := metrics.Install(mgr.GetClient(), mgr.Elected()); err != nil {
		return fmt.Errorf("registering the state metrics: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("adding health check: %w", err)
	}
	// Ready once the caches have synced, so a fresh replica is not sent traffic (webhooks)
	// before it can answer from them.
	if err := mgr.AddReadyzCheck("readyz", func(req *http.Request) error {
		if !mgr.GetCache().WaitForCacheSync(req.Context()) {
			return errors.New("caches have not synced")
		}
		return nil
	}); err != nil {
		return fmt.Errorf("adding readiness check: %w", err)
	}
	return nil
}

// metricsOptions serves metrics at opts.MetricsAddr, behind the apiserver's authentication and
// authorization (a self-signed certificate) if opts.MetricsSecure.
func metricsOptions(opts Options) metricsserver.Options {
	o := metricsserver.Options{BindAddress: opts.MetricsAddr}
	if opts.MetricsSecure {
		o.SecureServing, o.FilterProvider = true, filters.WithAuthenticationAndAuthorization
	}
	return o
}
