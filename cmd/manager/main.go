// Command manager runs diskpipe's controllers.
package main

import (
	"flag"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/diskpipe/diskpipe/controllers/manager"
)

func main() {
	var opts manager.Options
	flag.StringVar(&opts.MetricsAddr, "metrics-bind-address", ":8080", "address of the Prometheus metrics endpoint (\"0\" turns it off)")
	flag.StringVar(&opts.ProbeAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	flag.BoolVar(&opts.LeaderElection, "leader-elect", false, "elect a leader so that only one replica reconciles")
	flag.StringVar(&opts.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's)")
	flag.StringVar(&opts.Importer.Image, "importer-image", "", "image of importer pods (diskpipe's image)")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))

	mgr, err := manager.New(ctrl.GetConfigOrDie(), opts)
	if err == nil {
		err = mgr.Start(ctrl.SetupSignalHandler())
	}
	if err != nil {
		ctrl.Log.Error(err, "Manager stopped")
		os.Exit(1)
	}
}
