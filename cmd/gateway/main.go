// Command gateway serves the console's REST gateway (package gateway): the KubeSphere
// virtualization plugin's /kapis API for diskpipe's images and disks, each request carried out
// as its caller.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"

	"github.com/diskpipe/diskpipe/gateway"
	"github.com/diskpipe/diskpipe/gateway/web"
	"github.com/diskpipe/diskpipe/internal/authn"
)

// options are the gateway's flags.
type options struct {
	addr, metricsAddr, certFile, keyFile string
	uploadURL, uploadCA                  string
	uploadHTTP                           bool
	origins, membersDir                  string
	pages                                bool
	kubesphereClusters                   bool
	kubesphereURL, kubesphereCA          string
	kubesphereHTTP                       bool
}

func main() {
	var o options
	flag.StringVar(&o.addr, "addr", ":8443", "where the gateway serves its API and pages")
	flag.StringVar(&o.metricsAddr, "metrics-addr", ":8081", `where Prometheus metrics are served ("0": not at all)`)
	flag.StringVar(&o.certFile, "tls-cert-file", "", "the PEM certificate served (reloaded when it changes); none: plain HTTP, for a TLS-terminating proxy in front")
	flag.StringVar(&o.keyFile, "tls-key-file", "", "the PEM key of --tls-cert-file")
	flag.StringVar(&o.uploadURL, "upload-proxy-url", "", "the upload proxy's URL, where the console's uploads go (none: uploads are not served)")
	flag.StringVar(&o.uploadCA, "upload-proxy-ca-file", "", "the PEM CA the upload proxy's certificate is verified with (none: the system's)")
	flag.BoolVar(&o.uploadHTTP, "upload-proxy-allow-http", false, "allow an http:// --upload-proxy-url: every uploader's token then crosses the network in the clear")
	flag.StringVar(&o.origins, "cors-origins", "", "comma-separated origins (https://console.example.com) whose pages may call the gateway; none: only the gateway's own pages")
	flag.BoolVar(&o.pages, "pages", true, "serve the console's pages at /")
	flag.StringVar(&o.membersDir, "member-clusters-dir", "", "a directory of <cluster>.kubeconfig files: the member clusters ?cluster= reaches, callers impersonated there")
	flag.BoolVar(&o.kubesphereClusters, "kubesphere-clusters", false, "serve KubeSphere's member clusters (its cluster.kubesphere.io Clusters, followed by a watch) beside --member-clusters-dir's")
	flag.StringVar(&o.kubesphereURL, "kubesphere-url", "", "ks-apiserver's URL, whose token review (/oauth/authenticate) vouches for KubeSphere's tokens, which the apiserver does not know (none: only Kubernetes tokens are taken)")
	flag.StringVar(&o.kubesphereCA, "kubesphere-ca-file", "", "the PEM CA ks-apiserver's certificate is verified with (none: the system's)")
	flag.BoolVar(&o.kubesphereHTTP, "kubesphere-allow-http", false, "allow an http:// --kubesphere-url (ks-apiserver's in-cluster default): every KubeSphere token the gateway reviews then crosses the network in the clear")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(o, log); err != nil {
		log.Error("gateway", "error", err)
		os.Exit(1)
	}
}

func run(o options, log *slog.Logger) error {
	addr, metricsAddr, certFile, keyFile := o.addr, o.metricsAddr, o.certFile, o.keyFile
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	s, err := gateway.New(cfg, log.With("component", "audit"), gateway.NewMetrics(reg))
	if err != nil {
		return err
	}
	if o.membersDir != "" {
		if s.Members, err = gateway.LoadMembers(o.membersDir); err != nil {
			return err
		}
		log.Info("member clusters", "names", len(s.Members))
	}
	if o.kubesphereClusters {
		if s.KubeSphere, err = gateway.WatchKubeSphere(ctx, cfg, log.With("component", "kubesphere")); err != nil {
			return err
		}
	}
	if o.kubesphereURL != "" {
		hc, err := authn.TokenClient("--kubesphere-url", o.kubesphereURL, o.kubesphereCA, o.kubesphereHTTP)
		if err != nil {
			return err
		}
		s.Reviews.Also = &authn.KubeSphere{URL: o.kubesphereURL, Client: hc}
	}
	if o.uploadURL != "" {
		if s.Uploads, err = uploadProxy(o.uploadURL, o.uploadCA, o.uploadHTTP); err != nil {
			return err
		}
		if strings.HasPrefix(o.uploadURL, "http://") {
			log.Warn("uploads go to the upload proxy over plain HTTP: every uploader's token crosses the network in the clear", "url", o.uploadURL)
		}
	}
	if o.pages {
		s.Pages = web.Handler()
		if !web.Built() {
			log.Warn("this gateway was built without the console's pages (make web): / answers how to build them")
		}
	}
	for _, origin := range strings.Split(o.origins, ",") {
		if origin = strings.TrimSpace(origin); origin != "" {
			s.Origins = append(s.Origins, origin)
		}
	}
	srv := &http.Server{Addr: addr, Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute,
		WriteTimeout: 2 * time.Minute, IdleTimeout: 2 * time.Minute}
	if metricsAddr != "0" {
		m := &http.Server{Addr: metricsAddr, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := m.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics", "error", err)
			}
		}()
		defer m.Close()
	}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
	}()
	if certFile == "" {
		log.Warn("serving plain HTTP: bearer tokens cross the network in the clear unless a TLS-terminating proxy is in front", "addr", addr)
		err = srv.ListenAndServe()
	} else {
		w, werr := certwatcher.New(certFile, keyFile)
		if werr != nil {
			return werr
		}
		go func() { _ = w.Start(ctx) }()
		srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: w.GetCertificate}
		err = srv.ListenAndServeTLS("", "")
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// uploadProxy is the upload proxy at url, its certificate verified with the CA in caFile. The
// gateway gives it each caller's own token.
func uploadProxy(url, caFile string, allowHTTP bool) (*gateway.UploadProxy, error) {
	hc, err := authn.TokenClient("--upload-proxy-url", url, caFile, allowHTTP)
	if err != nil {
		return nil, err
	}
	return &gateway.UploadProxy{URL: url, Client: hc}, nil
}
