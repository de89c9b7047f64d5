package transfer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/diskpipe/diskpipe/internal/contract"
)

// Command is what the importer and exporter commands share around their work: the flags for
// metrics, progress, the result and memory, the metrics and log lines while the work runs,
// and the result in the termination message and the exit code after it.
type Command struct {
	Log      *slog.Logger
	Progress *Progress
	// Egress is where the command may connect (--forbid-cidr, --allow-destination).
	Egress Egress

	metricsAddr string
	interval    time.Duration
	termPath    string
	memLimit    int64
}

// NewCommand returns a Command that logs JSON lines to stderr.
func NewCommand(stderr io.Writer) *Command {
	return &Command{Log: slog.New(slog.NewJSONHandler(stderr, nil)), Progress: NewProgress(0)}
}

// Configure takes the pod's shared flags (contract.Pod): a bad egress rule is an error.
func (c *Command) Configure(p contract.Pod) error {
	c.metricsAddr, c.interval, c.termPath, c.memLimit = p.MetricsAddr, p.ProgressInterval, p.TerminationMessagePath, p.MemoryLimit
	for _, v := range p.ForbidCIDR {
		if err := c.Egress.Forbid(v); err != nil {
			return fmt.Errorf("--forbid-cidr %q: %w", v, err)
		}
	}
	for _, v := range p.AllowDestination {
		if err := c.Egress.Allow(v); err != nil {
			return fmt.Errorf("--allow-destination %q: %w", v, err)
		}
	}
	for _, v := range p.ConnectTo {
		if err := c.Egress.Connect(v); err != nil {
			return fmt.Errorf("--connect-to: %w", err)
		}
	}
	return nil
}

// Run runs work with metrics served and progress logged, records its result and returns the
// exit code. work may return a nil result with its error.
func (c *Command) Run(ctx context.Context, what string, work func(ctx context.Context) (*Result, error)) int {
	start := time.Now()
	debug.SetMemoryLimit(c.memLimit)
	res, err := func() (*Result, error) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		if c.metricsAddr != "" {
			if _, err := c.Progress.Serve(ctx, c.metricsAddr); err != nil {
				return nil, Permanent(ReasonInvalidArgument, "serving metrics: %w", err)
			}
		}
		go c.Progress.Report(ctx, c.Log, c.interval)
		return work(ctx)
	}()
	if res == nil {
		res = &Result{}
	}
	if err != nil && ctx.Err() != nil {
		// Asked to stop (SIGTERM: the pod deleted, evicted, its node drained) before the work
		// was done. Whatever error the interrupted reads left (a cut stream reads as a
		// malformed image), it says nothing of the source: the next pod may finish.
		err = Transient(ReasonCancelled, "stopped before it finished, as the pod was deleted or evicted: %w", err)
	}
	if err != nil {
		res.Fail(err)
		c.Log.Error(what+" failed", "reason", res.Reason, "transient", res.Transient, "err", err)
	} else {
		c.Log.Info(what+" succeeded", "format", res.Format, "virtualSize", res.VirtualSize, "bytesRead", res.BytesRead,
			"bytesWritten", res.BytesWritten, "digest", res.Digest, "url", res.URL, "seconds", time.Since(start).Seconds())
	}
	if ferr := res.Finish(start, c.termPath); ferr != nil {
		c.Log.Error("Could not write the result", "err", ferr)
	}
	return res.ExitCode()
}

// HTTPTransport returns a transport with the proxy from the environment, verifying servers
// with the PEM bundle caFile instead of the system roots when it is set (a file, or a mounted
// ConfigMap's directory: ReadCABundle), and with the proxy's CA (ProxyCA) beside either.
func HTTPTransport(caFile string, insecure bool) (*http.Transport, error) {
	return httpTransport(caFile, insecure, ProxyCA())
}

// PinnedTransport is an HTTP transport that trusts only the PEM bundle caFile, for serverName
// whatever the URL's host: a clone source's, whose copy's CA is the one root (not the proxy's
// CA, nor the system's).
func PinnedTransport(caFile, serverName string) (*http.Transport, error) {
	if caFile == "" {
		return nil, Permanent(ReasonInvalidArgument, "a CA bundle is required to verify %s", serverName)
	}
	tr, err := httpTransport(caFile, false, nil)
	if err != nil {
		return nil, err
	}
	tr.TLSClientConfig.ServerName = serverName
	return tr, nil
}

// httpTransport is HTTPTransport with proxyCA (nil: none) beside the roots.
func httpTransport(caFile string, insecure bool, proxyCA []byte) (*http.Transport, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: insecure} //nolint:gosec // the user's choice
	tr.MaxIdleConnsPerHost = 32
	if caFile == "" && proxyCA == nil {
		return tr, nil
	}
	pool := x509.NewCertPool()
	if caFile == "" {
		if system, err := x509.SystemCertPool(); err == nil {
			pool = system
		}
	} else {
		pem, err := ReadCABundle(caFile)
		if err != nil {
			return nil, err
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, Permanent(ReasonInvalidArgument, "CA bundle %s holds no PEM certificate", caFile)
		}
	}
	if proxyCA != nil && !pool.AppendCertsFromPEM(proxyCA) {
		return nil, Permanent(ReasonInvalidArgument, "the proxy's CA bundle (%s) holds no PEM certificate", ProxyCAEnv)
	}
	tr.TLSClientConfig.RootCAs = pool
	return tr, nil
}

// ReadCABundle reads the PEM CA bundle at path: a file, or a directory where a ConfigMap is
// mounted, whose keys are joined whatever their names (diskpipe's ca.crt, or any key, as CDI's
// certConfigMap allows).
func ReadCABundle(path string) ([]byte, error) {
	files, err := MountedFiles(path)
	if err != nil {
		return nil, Permanent(ReasonInvalidArgument, "reading CA bundle: %w", err)
	}
	var pem []byte
	for _, f := range files {
		b, err := os.ReadFile(f) //nolint:gosec // a mounted ConfigMap
		if err != nil {
			return nil, Permanent(ReasonInvalidArgument, "reading CA bundle: %w", err)
		}
		pem = append(append(pem, b...), '\n')
	}
	return pem, nil
}

// MountedFiles are the files at path: path itself, or, for the directory a Secret or ConfigMap
// is mounted at, its keys in name order (not the volume's own "..data" links).
func MountedFiles(path string) ([]string, error) {
	fi, err := os.Stat(path)
	if err != nil || !fi.IsDir() {
		return []string{path}, err
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if fi, err := os.Stat(filepath.Join(path, e.Name())); err == nil && fi.Mode().IsRegular() {
			files = append(files, filepath.Join(path, e.Name()))
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s holds no file", path)
	}
	return files, nil
}
