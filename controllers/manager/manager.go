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
	"github.com/diskpipe/diskpipe/controllers/cdi"
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
	"github.com/diskpipe/diskpipe/uploadproxy/cdiupload"
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
	// ProxyCertSecret, with CertSecret, makes the manager keep the upload proxy's serving
	// certificate too, for ProxyHosts, signed by the same CA (admission.Leaf).
	ProxyCertSecret string
	ProxyHosts      []string
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
	renew := 10 * time.Second
	if opts.OwnerKeySecret.Name != "" {
		direct, err := client.New(cfg, client.Options{Scheme: NewScheme()})
		if err != nil {
			return nil, err
		}
		if err := owned.LoadKey(context.Background(), direct, opts.OwnerKeySecret); err != nil {
			return nil, err
		}
	} else if !owned.HasKey() {
		return nil, errors.New("no --owner-key-secret: the manager needs the key it marks its children with")
	}
	var (
		hooks  webhook.Server
		keeper *admission.CertKeeper
	)
	if w := opts.Webhook; w != nil {
		// A client certificate is asked for, never required: the apiserver presents its
		// front-proxy certificate when it forwards to the upload token API (checked there), and
		// none when it calls a webhook.
		hookOpts := webhook.Options{Host: w.Host, Port: w.Port, CertDir: w.CertDir,
			TLSOpts: []func(*tls.Config){func(c *tls.Config) { c.ClientAuth = tls.RequestClientCert }}}
		if w.CertSecret != "" {
			// The manager's own certificate, served from memory; its first Sync is below.
			direct, err := client.New(cfg, client.Options{Scheme: NewScheme()})
			if err != nil {
				return nil, err
			}
			keeper = &admission.CertKeeper{Client: direct, Reader: direct, Namespace: w.Namespace,
				SecretName: w.CertSecret, Configuration: w.Configuration, Hosts: w.Hosts, Every: w.CertSync}
			if w.ProxyCertSecret != "" {
				keeper.Leaves = []admission.Leaf{{SecretName: w.ProxyCertSecret, Hosts: w.ProxyHosts}}
			}
			if w.UploadTokenSecret.Name != "" {
				keeper.APIServices = []string{uploadproxy.TokenAPIService}
				if opts.CDICompatibility {
					keeper.APIServices = append(keeper.APIServices, uploadproxy.APIServiceName(cdiupload.GroupVersion))
				}
			}
			if opts.CDICompatibility {
				keeper.Mutating = []string{cdi.ProfileHookName}
			}
			hookOpts.TLSOpts = append(hookOpts.TLSOpts, func(c *tls.Config) { c.GetCertificate = keeper.GetCertificate })
		}
		hooks = webhook.NewServer(hookOpts)
	}
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
	if opts.CDICompatibility {
		// A CDI user's CDIConfig spec.filesystemOverhead sizes every volume, before the chart's values.
		opts.Importer.FilesystemOverhead = opts.Importer.FilesystemOverhead.Under(cdi.SpecOverhead(mgr.GetClient()))
		// and its spec.importProxy carries every import, before the chart's importer.proxy.
		opts.Importer.ProxyFirst = cdi.SpecProxy(mgr.GetClient(), mgr.GetAPIReader(), opts.Namespace)
	}
	imageOpts := image.Options{Pods: opts.Importer}
	if opts.ObjectStore != nil {
		if imageOpts.ObjectStore, err = objectstore.NewClient(*opts.ObjectStore); err != nil {
			return nil, fmt.Errorf("the object store: %w", err)
		}
		imageOpts.ObjectStoreCA = opts.ObjectStore.CAFile
	}
	var sweeper *tenancy.Sweeper
	if opts.ObjectStore != nil && opts.ObjectStore.Scoped {
		// The store knows a namespace by its UID, asked of the apiserver each time.
		imageOpts.ObjectStore.ResolveNamespaces(tenancy.UIDs(mgr.GetAPIReader()))
		sweeper = &tenancy.Sweeper{Store: imageOpts.ObjectStore, Reader: mgr.GetAPIReader()}
		if err := mgr.Add(sweeper); err != nil {
			return nil, err
		}
	}
	if err := image.SetupVirtualMachineImage(mgr, imageOpts); err != nil {
		return nil, fmt.Errorf("setting up the VirtualMachineImage controller: %w", err)
	}
	if err := image.SetupImageTemplate(mgr, imageOpts); err != nil {
		return nil, fmt.Errorf("setting up the ImageTemplate controller: %w", err)
	}
	diskOpts := disk.Options{Pods: opts.Importer, Strategies: opts.CloneStrategies}
	if opts.CDICompatibility {
		// A CDI user's StorageProfile spec.snapshotClass names the class of every snapshot
		// diskpipe takes of that storage class's volumes, as CDI's snapshot clones take it.
		diskOpts.SnapshotClassNamed = cdi.ProfileSnapshotClass(mgr.GetClient())
	}
	if err := disk.Setup(mgr, diskOpts); err != nil {
		return nil, fmt.Errorf("setting up the disk controllers: %w", err)
	}
	exportOpts := export.Options{Pods: opts.Importer, Store: imageOpts.ObjectStore, StoreConfig: opts.ObjectStore,
		SnapshotClassNamed: diskOpts.SnapshotClassNamed}
	if opts.ObjectStore != nil && opts.ObjectStorePublicEndpoint != "" {
		public := *opts.ObjectStore
		public.Endpoint = opts.ObjectStorePublicEndpoint
		if exportOpts.Downloads, err = objectstore.NewClient(public); err != nil {
			return nil, fmt.Errorf("the object store's public endpoint: %w", err)
		}
	}
	if err := export.Setup(mgr, exportOpts); err != nil {
		return nil, fmt.Errorf("setting up the export controller: %w", err)
	}
	if err := populator.Setup(mgr); err != nil {
		return nil, fmt.Errorf("setting up the populator: %w", err)
	}
	if err := virtualmachine.Setup(mgr, opts.AllowHostDisk); err != nil {
		return nil, fmt.Errorf("setting up the VirtualMachine controller: %w", err)
	}
	if opts.CDICompatibility {
		o := cdi.Options{FilesystemOverhead: opts.Importer.FilesystemOverhead, Strategies: opts.CloneStrategies}
		if opts.Webhook != nil {
			o.UploadProxyURL = opts.Webhook.UploadProxyURL
		}
		if err := cdi.Setup(mgr, o); err != nil {
			return nil, fmt.Errorf("setting up the DataVolume controller: %w", err)
		}
	}
	if opts.Webhook != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if keeper != nil {
			// The webhook server starts serving before the caches: the certificate must be there.
			if err := keeper.Sync(ctx); err != nil {
				return nil, fmt.Errorf("the webhooks' certificate: %w", err)
			}
			if err := mgr.Add(keeper); err != nil {
				return nil, err
			}
		}
		if err := admission.Register(ctx, mgr, opts.AllowHostDisk, cdipolicy.SourceKinds()...); err != nil {
			return nil, fmt.Errorf("setting up the admission webhooks: %w", err)
		}
		if opts.CDICompatibility {
			cdi.RegisterProfileHook(mgr)
		}
		if w := opts.Webhook; w.UploadTokenSecret.Name != "" {
			api := &uploadproxy.TokenAPI{URL: w.UploadProxyURL, Service: w.UploadProxyService}
			if opts.CDICompatibility {
				api.Groups = append(api.Groups, cdiupload.Tokens(api))
			}
			if opts.ObjectStore != nil && opts.ObjectStore.Scoped {
				api.Store, api.StoreEndpoint = imageOpts.ObjectStore, cmp.Or(opts.ObjectStorePublicEndpoint, opts.ObjectStore.Endpoint)
				sweeper.Keys = api.RenewStoreKeys
			}
			if err := serveTokenAPI(ctx, cfg, mgr, w, api); err != nil {
				return nil, fmt.Errorf("setting up the upload token API: %w", err)
			}
		}
	}
	if err := metrics.Install(mgr.GetClient(), mgr.Elected()); err != nil {
		return nil, fmt.Errorf("registering the state metrics: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("adding health check: %w", err)
	}
	// Ready once the caches have synced, so a fresh replica is not sent traffic (webhooks)
	// before it can answer from them.
	if err := mgr.AddReadyzCheck("readyz", func(req *http.Request) error {
		if !mgr.GetCache().WaitForCacheSync(req.Context()) {
			return errors.New("caches have not synced")
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("adding readiness check: %w", err)
	}
	return mgr, nil
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
