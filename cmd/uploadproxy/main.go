// Command uploadproxy receives image uploads for diskpipe and stores them in the bundled
// object store (see package uploadproxy).
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/internal/authn"
	"github.com/diskpipe/diskpipe/internal/scheme"
	"github.com/diskpipe/diskpipe/internal/uploadtoken"
	"github.com/diskpipe/diskpipe/objectstore"
	"github.com/diskpipe/diskpipe/uploadproxy"
	"github.com/diskpipe/diskpipe/uploadproxy/cdiupload"
)

func main() {
	var (
		listen    = flag.String("listen", ":8443", "address to serve on")
		certFile  = flag.String("tls-cert-file", "", "TLS certificate (empty: plain HTTP, for a TLS-terminating ingress)")
		keyFile   = flag.String("tls-key-file", "", "TLS key")
		partBytes = flag.Int64("part-size", 16<<20, "bytes per stored part: the granularity of resuming")
		tokenKey  = flag.String("token-secret", "", "NAMESPACE/NAME of the Secret with the key upload tokens are signed with (empty: only Kubernetes tokens are accepted)")
		minRate   = flag.Int64("min-bytes-per-second", uploadproxy.DefaultMinBytesPerSecond, "the least rate of an upload's body, over each 30 s of waiting for it (slower: ended with 408, to resume)")
		nsBytes   = flag.String("max-bytes-per-namespace", "0", "bytes a namespace's uploads may keep in the store, as a quantity (\"50Gi\"; 0: only the namespace's ResourceQuotas bound them)")
		ksURL     = flag.String("kubesphere-url", "", "ks-apiserver's URL, whose token review (/oauth/authenticate) vouches for KubeSphere's tokens, which the apiserver does not know (none: only Kubernetes and upload tokens are taken)")
		ksCA      = flag.String("kubesphere-ca-file", "", "the PEM CA ks-apiserver's certificate is verified with (none: the system's)")
		ksHTTP    = flag.Bool("kubesphere-allow-http", false, "allow an http:// --kubesphere-url: every KubeSphere token reviewed then crosses the network in the clear")
	)
	var (
		store    objectstore.ClientConfig
		credsDir string
	)
	store.BindFlags(flag.CommandLine, &credsDir)
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	limit, err := resource.ParseQuantity(*nsBytes)
	if err != nil {
		log.Error("Bad --max-bytes-per-namespace", "err", err)
		os.Exit(2)
	}
	srv := &uploadproxy.Server{PartSize: *partBytes, MaxBytesPerNamespace: limit.Value(), MinBytesPerSecond: *minRate, Log: log}
	srv.Doors = cdiupload.Doors(srv)
	if *ksURL != "" {
		hc, err := authn.TokenClient("--kubesphere-url", *ksURL, *ksCA, *ksHTTP)
		if err != nil {
			log.Error("Bad --kubesphere-url", "err", err)
			os.Exit(2)
		}
		srv.Tokens = &authn.KubeSphere{URL: *ksURL, Client: hc}
	}
	if err := run(srv, *listen, *certFile, *keyFile, store, credsDir, *tokenKey); err != nil {
		log.Error("Upload proxy stopped", "err", err)
		os.Exit(1)
	}
}

// run serves srvUploads (its limits set from the flags) on listen.
func run(srvUploads *uploadproxy.Server, listen, certFile, keyFile string, cfg objectstore.ClientConfig, credsDir string, tokenKey string) error {
	log := srvUploads.Log
	if err := cfg.LoadCredentials(credsDir); err != nil {
		return err
	}
	store, err := objectstore.NewClient(cfg)
	if err != nil {
		return err
	}
	restCfg, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	kube, err := client.New(restCfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		return err
	}
	srvUploads.Kube, srvUploads.Store = kube, store
	if tokenKey != "" {
		ns, name, ok := strings.Cut(tokenKey, "/")
		if !ok {
			return fmt.Errorf("--token-secret %q: want NAMESPACE/NAME", tokenKey)
		}
		srvUploads.TokenKey = &uploadtoken.Key{Client: kube, Namespace: ns, Name: name}
	}
	mux := http.NewServeMux()
	mux.Handle("/", srvUploads)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	srv := &http.Server{Addr: listen, Handler: mux,
		ReadHeaderTimeout: 30 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("Serving uploads", "addr", listen, "tls", certFile != "")
	if certFile != "" {
		// The kubelet rewrites the mounted files when the certificate is renewed; the
		// watcher serves the new one from then on, with no restart.
		watcher, werr := certwatcher.New(certFile, keyFile)
		if werr != nil {
			return fmt.Errorf("the serving certificate: %w", werr)
		}
		go func() {
			if werr := watcher.Start(ctx); werr != nil {
				log.Error("Watching the serving certificate stopped", "err", werr)
			}
		}()
		srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: watcher.GetCertificate}
		err = srv.ListenAndServeTLS("", "")
	} else {
		err = srv.ListenAndServe()
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
