package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/versity/versitygw/backend"
	"github.com/versity/versitygw/backend/meta"
	"github.com/versity/versitygw/backend/posix"
	"github.com/versity/versitygw/embedgw"
	"github.com/versity/versitygw/s3api"

	"github.com/diskpipe/diskpipe/objectstore"
)

// ServerConfig configures the bundled store.
type ServerConfig struct {
	// Dir holds the buckets, one directory each, on a filesystem with extended attributes.
	Dir string
	// Listen is the S3 API's address, e.g. ":9000".
	Listen string
	// AccessKey and SecretKey are the root credentials.
	AccessKey, SecretKey string
	// Region reported to clients (default us-east-1).
	Region string
	// CertFile and KeyFile serve TLS when both are set.
	CertFile, KeyFile string
	// VirtualDomain enables virtual-host-style requests under this domain.
	VirtualDomain string
	// Front bounds what each client holds of the store (front.go).
	Front FrontConfig
	// IAMDir keeps the accounts of scoped credentials (scoped.go); default Dir/.diskpipe-iam,
	// which is no valid bucket name, so no request reaches it as one.
	IAMDir string
	// QuotaPerAccount, when above 0, bounds the bytes the buckets of each account other than
	// root may hold (quota.go): a namespace's, since each namespace has its account.
	QuotaPerAccount int64
	// MaxBuckets and MaxObjects bound the buckets each such account may own and the files
	// (objects, parts) its buckets may hold (defaults DefaultMaxBuckets, DefaultMaxObjects).
	MaxBuckets int
	MaxObjects int64
}

// Serve runs the store until ctx ends, then shuts it down gracefully.
func Serve(ctx context.Context, cfg ServerConfig) error {
	switch {
	case cfg.Dir == "":
		return errors.New("objectstore: a data directory is required")
	case cfg.AccessKey == "" || cfg.SecretKey == "":
		return errors.New("objectstore: root credentials are required")
	case cfg.Listen == "":
		return errors.New("objectstore: a listen address is required")
	}
	if err := os.MkdirAll(cfg.Dir, 0o750); err != nil {
		return fmt.Errorf("objectstore: creating the data directory: %w", err)
	}
	cfg.Front.defaults()
	if cfg.IAMDir == "" {
		cfg.IAMDir = filepath.Join(cfg.Dir, ".diskpipe-iam")
	}
	if err := os.MkdirAll(cfg.IAMDir, 0o700); err != nil {
		return fmt.Errorf("objectstore: creating the accounts directory: %w", err)
	}
	be, err := posix.New(cfg.Dir, meta.XattrMeta{}, posix.PosixOpts{})
	if err != nil {
		return fmt.Errorf("objectstore: opening %s: %w", cfg.Dir, err)
	}
	var served backend.Backend = &reserved{Backend: be, root: cfg.AccessKey}
	if cfg.MaxBuckets <= 0 {
		cfg.MaxBuckets = DefaultMaxBuckets
	}
	if cfg.MaxObjects <= 0 {
		cfg.MaxObjects = DefaultMaxObjects
	}
	served = &quota{Backend: served, dir: cfg.Dir, root: cfg.AccessKey, limit: cfg.QuotaPerAccount, buckets: cfg.MaxBuckets, objects: cfg.MaxObjects}
	// versitygw listens on a loopback port, which only the store's pod reaches (and over which
	// it sends files with sendfile); the store's port is the front.
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("objectstore: %w", err)
	}
	gateway := free.Addr().String()
	_ = free.Close()
	l, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("objectstore: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 2)
	go func() { done <- serveFront(ctx, l, gateway, cfg.Front, cfg.CertFile, cfg.KeyFile) }()
	go func() { done <- serveGateway(ctx, served, gateway, cfg) }()
	err = <-done
	cancel()
	return errors.Join(err, <-done)
}

// serveGateway runs versitygw on addr until ctx ends.
func serveGateway(ctx context.Context, served backend.Backend, addr string, cfg ServerConfig) error {
	return embedgw.RunVersityGW(ctx, served, &embedgw.Config{
		RootUserAccess: cfg.AccessKey,
		RootUserSecret: cfg.SecretKey,
		Region:         cfg.Region,
		Ports:          []string{addr},
		// Room beyond the front's bound: the probes, and work that outlives its client's
		// connection (a copy, a multipart upload's completion).
		MaxConnections:    2 * cfg.Front.MaxConnections,
		MaxRequests:       2 * cfg.Front.MaxConnections,
		MultipartMaxParts: 10000,
		VirtualDomain:     cfg.VirtualDomain,
		S3Options:         []s3api.Option{s3api.WithMiddleware("/", peer)},
		HealthPath:        objectstore.HealthPath,
		IAMDir:            cfg.IAMDir,
		IAMCacheDisable:   true, // a removed account stops working at once
		KeepAlive:         true,
		Quiet:             true,
	})
}

// ReadSecret returns the value of a flag that may name a file ("@/path") or an environment
// variable, so credentials come from a mounted Secret rather than the command line.
func ReadSecret(value, env string) (string, error) {
	if value == "" {
		return os.Getenv(env), nil
	}
	if path, ok := strings.CutPrefix(value, "@"); ok {
		b, err := os.ReadFile(path) //nolint:gosec // a mounted Secret
		if err != nil {
			return "", fmt.Errorf("reading %s: %w", path, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return value, nil
}
