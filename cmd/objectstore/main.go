// Command objectstore runs diskpipe's bundled S3-compatible object store (versitygw, POSIX
// backend). Credentials come from files (a mounted Secret) or the environment.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/diskpipe/diskpipe/objectstore/gateway"
)

func main() {
	var cfg gateway.ServerConfig
	var access, secret string
	flag.StringVar(&cfg.Dir, "data-dir", "/data", "directory holding the buckets")
	flag.StringVar(&cfg.Listen, "listen", ":9000", "address of the S3 API")
	flag.StringVar(&access, "access-key", "", "root access key, or @file (default $DISKPIPE_S3_ACCESS_KEY)")
	flag.StringVar(&secret, "secret-key", "", "root secret key, or @file (default $DISKPIPE_S3_SECRET_KEY)")
	flag.StringVar(&cfg.Region, "region", "us-east-1", "region reported to clients")
	flag.StringVar(&cfg.CertFile, "tls-cert", "", "TLS certificate (with --tls-key)")
	flag.StringVar(&cfg.KeyFile, "tls-key", "", "TLS key (with --tls-cert)")
	flag.StringVar(&cfg.VirtualDomain, "virtual-domain", "", "domain for virtual-host-style requests")
	flag.IntVar(&cfg.Front.MaxConnections, "max-connections", gateway.DefaultMaxConnections, "connections the store takes at once")
	flag.IntVar(&cfg.Front.MaxConnectionsPerSource, "max-connections-per-source", gateway.DefaultMaxConnectionsPerSource, "connections the store takes at once from one address")
	flag.Int64Var(&cfg.Front.MinBytesPerSecond, "min-bytes-per-second", gateway.DefaultMinBytesPerSecond, "the least rate of a request body, over each --body-window of waiting for it")
	flag.DurationVar(&cfg.Front.BodyWindow, "body-window", gateway.DefaultBodyWindow, "how long a request body's rate is measured over, and the longest it may stop")
	flag.DurationVar(&cfg.Front.IdleTimeout, "idle-timeout", gateway.DefaultIdleTimeout, "how long an idle connection is kept")
	flag.IntVar(&cfg.MaxBuckets, "max-buckets-per-namespace", gateway.DefaultMaxBuckets, "buckets each namespace may own")
	flag.Int64Var(&cfg.MaxObjects, "max-objects-per-namespace", gateway.DefaultMaxObjects, "files (objects, parts) each namespace's buckets may hold")
	quota := flag.String("quota-per-namespace", "", "bytes each namespace's buckets may hold, e.g. 100Gi (empty: no quota)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var err error
	if cfg.AccessKey, err = gateway.ReadSecret(access, "DISKPIPE_S3_ACCESS_KEY"); err == nil {
		cfg.SecretKey, err = gateway.ReadSecret(secret, "DISKPIPE_S3_SECRET_KEY")
	}
	if err == nil && *quota != "" {
		var q resource.Quantity
		if q, err = resource.ParseQuantity(*quota); err == nil {
			cfg.QuotaPerAccount = q.Value()
		}
	}
	if err == nil {
		err = gateway.Serve(ctx, cfg)
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "objectstore:", err)
		os.Exit(1)
	}
}
