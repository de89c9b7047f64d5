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
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"

	"github.com/diskpipe/diskpipe/gateway"
)

func main() {
	addr := flag.String("addr", ":8443", "where the gateway serves its API")
	metricsAddr := flag.String("metrics-addr", ":8081", `where Prometheus metrics are served ("0": not at all)`)
	certFile := flag.String("tls-cert-file", "", "the PEM certificate served (reloaded when it changes); none: plain HTTP, for a TLS-terminating proxy in front")
	keyFile := flag.String("tls-key-file", "", "the PEM key of --tls-cert-file")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(*addr, *metricsAddr, *certFile, *keyFile, log); err != nil {
		log.Error("gateway", "error", err)
		os.Exit(1)
	}
}

func run(addr, metricsAddr, certFile, keyFile string, log *slog.Logger) error {
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
