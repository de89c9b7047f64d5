// Command manager runs diskpipe's controllers.
package main

import (
	"flag"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/diskpipe/diskpipe/controllers/manager"
	"github.com/diskpipe/diskpipe/objectstore"
)

func main() {
	var opts manager.Options
	flag.StringVar(&opts.MetricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint (\"0\" turns it off)")
	flag.StringVar(&opts.ProbeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	flag.BoolVar(&opts.LeaderElection, "leader-elect", false, "elect a leader so that only one replica reconciles")
	flag.StringVar(&opts.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's)")
	flag.StringVar(&opts.Importer.Image, "importer-image", "", "image of importer pods (diskpipe's image)")
	var (
		webhookPort                  int
		webhookCertDir               string
		storeEndpoint, storeCredsDir string
	)
	flag.IntVar(&webhookPort, "webhook-port", 0, "port of the admission webhooks (0: none served)")
	flag.StringVar(&webhookCertDir, "webhook-cert-dir", "/var/run/diskpipe/webhook", "directory of the webhooks' tls.crt and tls.key")
	flag.StringVar(&storeEndpoint, "objectstore-endpoint", "", "URL of the bundled object store (empty: none)")
	flag.StringVar(&storeCredsDir, "objectstore-credentials-dir", "/var/run/diskpipe/objectstore", "directory with the store's accessKeyId and secretAccessKey")
	var qps float64
	var burst int
	flag.IntVar(&opts.Concurrency, "concurrency", 8, "objects of each kind reconciled at once")
	flag.Float64Var(&qps, "kube-api-qps", 200, "requests per second to the apiserver")
	flag.IntVar(&burst, "kube-api-burst", 400, "burst of requests to the apiserver")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))

	if webhookPort != 0 {
		opts.Webhook = &manager.WebhookOptions{Port: webhookPort, CertDir: webhookCertDir}
	}
	var err error
	if storeEndpoint != "" {
		opts.ObjectStore = &objectstore.ClientConfig{Endpoint: storeEndpoint, Region: "us-east-1", BucketLookup: "Path"}
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
