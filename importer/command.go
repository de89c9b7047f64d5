package importer

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"

	"github.com/diskpipe/diskpipe/internal/backup"
	"github.com/diskpipe/diskpipe/internal/contract"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore"
)

// Main runs the importer command with args (without the program name) and returns its exit
// code: 0 imported, 1 failed for good, 3 failed transiently, 64 bad usage. The result is
// written as JSON to the termination message path.
func Main(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("importer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	a := contract.DefaultImport()
	contract.Bind(fs, &a)
	if err := fs.Parse(args); err != nil {
		return transfer.ExitUsage
	}
	cmd := transfer.NewCommand(stderr)
	if err := cmd.Configure(a.Pod); err != nil {
		fmt.Fprintln(stderr, err)
		return transfer.ExitUsage
	}
	if a.CPUProfile != "" {
		if f, err := os.Create(a.CPUProfile); err == nil {
			_ = pprof.StartCPUProfile(f)
			defer func() { pprof.StopCPUProfile(); f.Close() }()
		}
	}

	o := Options{
		// Overhead nil is the default; 0 is an overhead too.
		Target: a.Target, Capacity: a.Capacity, Overhead: a.Overhead, Checksum: a.Checksum, Format: Format(a.Format), OVADisk: a.OVADisk,
		Parallel: a.Parallel, StallTimeout: a.StallTimeout, Log: cmd.Log, Progress: cmd.Progress,
		Retry: transfer.RetryPolicy{Attempts: a.Retries, Initial: transfer.DefaultRetryPolicy.Initial, Max: transfer.DefaultRetryPolicy.Max},
	}
	o.Grow, o.Preallocate = a.Grow, a.Preallocate
	if a.Serve != "" {
		return cmd.Run(ctx, "Serve", func(ctx context.Context) (*transfer.Result, error) {
			token, err := os.ReadFile(a.TokenFile)
			if err != nil {
				return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "reading the token: %w", err)
			}
			if a.TLSCertFile == "" || a.TLSKeyFile == "" {
				return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "--tls-cert-file and --tls-key-file are required: a clone source serves only over TLS")
			}
			cert, err := tls.LoadX509KeyPair(a.TLSCertFile, a.TLSKeyFile)
			if err != nil {
				return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "reading the serving certificate: %w", err)
			}
			cmd.Log.Info("Serving", "path", a.Path, "addr", a.Serve)
			return &transfer.Result{Succeeded: true}, Serve(ctx, a.Serve, a.Path, strings.TrimSpace(string(token)), cert,
				ServeLimits{Idle: a.IdleTimeout, Stall: a.StallTimeout, MinRate: a.ServeMinRate})
		})
	}
	if a.Install != "" {
		return cmd.Run(ctx, "Install", func(context.Context) (*transfer.Result, error) {
			return &transfer.Result{Succeeded: true}, install(a.Install)
		})
	}
	if a.GrowOnly {
		return cmd.Run(ctx, "Grow", func(context.Context) (*transfer.Result, error) {
			o.defaults()
			return Grow(a.Target, a.Capacity, *o.Overhead, a.Preallocate)
		})
	}
	return cmd.Run(ctx, "Import", func(ctx context.Context) (*transfer.Result, error) {
		if a.Target == "" && !a.Probe && !a.Check {
			return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "--target is required")
		}
		switch a.Source {
		case "http":
			if a.URLFile != "" {
				b, err := os.ReadFile(a.URLFile)
				if err != nil {
					return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "reading the URL: %w", err)
				}
				a.URL = strings.TrimSpace(string(b))
			}
			s := &HTTPSource{URL: a.URL, ExtentsURL: a.ExtentsURL, CAFile: a.CAFile, ServerName: a.ServerName, Insecure: a.Insecure, Header: http.Header{}, Egress: &cmd.Egress}
			if err := s.loadCredentials(a.AuthDir, a.Header, a.HeaderFile); err != nil {
				return nil, err
			}
			if a.UserAgent != "" {
				s.Header.Set("User-Agent", a.UserAgent)
			}
			o.Source = s
			err := chainOf(&o, a.Chain, func(ref string) (Source, error) {
				layer := *s
				layer.URL = ref
				return &layer, nil
			}, func(checkpoint string) (Source, error) {
				b, err := os.ReadFile(filepath.Join(a.LayerURLDir, backup.LayerURLKey(filepath.Base(checkpoint))))
				if err != nil {
					// The index changed since the pod was made: the next one is made for it.
					return nil, transfer.Transient(transfer.ReasonBrokenChain, "no URL was given for layer %s: the backup index changed since this pod was made", checkpoint)
				}
				layer := *s
				layer.URL = strings.TrimSpace(string(b))
				return &layer, nil
			})
			if err != nil {
				return nil, err
			}
		case "s3":
			cfg := objectstore.ClientConfig{Endpoint: a.Endpoint, Region: a.Region, BucketLookup: a.BucketLookup, CAFile: a.CAFile, Insecure: a.Insecure, Egress: &cmd.Egress}
			if a.CredentialsDir != "" {
				if err := cfg.LoadCredentials(a.CredentialsDir); err != nil {
					return nil, err
				}
			}
			o.Source = &S3Source{Config: cfg, Bucket: a.Bucket, Object: a.Object}
			err := chainOf(&o, a.Chain, func(key string) (Source, error) {
				return &S3Source{Config: cfg, Bucket: a.Bucket, Object: key}, nil
			}, nil)
			if err != nil {
				return nil, err
			}
		case "registry":
			if !strings.HasPrefix(a.URL, "docker://") {
				// An archive would be a file of this pod (none is mounted) unpacked into scratch
				// space (there is none): only a registry is a source here.
				return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "registry URL %q must start with docker://: push an oci-archive to a registry", a.URL)
			}
			r := &RegistrySource{URL: a.URL, AuthFile: a.RegistryAuthFile, CAFile: a.CAFile, Insecure: a.Insecure, Architecture: a.Architecture, Disk: a.Disk, PublicKeyFile: a.RegistryPublicKeyFile, Egress: &cmd.Egress}
			if a.AuthDir != "" {
				if err := r.loadCredentials(a.AuthDir); err != nil {
					return nil, err
				}
			}
			o.Source = r
		case "file":
			o.Source, o.Format = &FileSource{Path: a.Path}, FormatRaw
		case "containerdisk":
			// A container disk the node pulled and this pod runs: its one disk, in any format.
			p, err := containerDiskFile(a.Path)
			if err != nil {
				return nil, err
			}
			o.Source = &FileSource{Path: p}
		case "blank":
			o.Blank, o.BlankSize = true, a.BlankSize
		default:
			return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "unknown --source %q: http, s3, registry, containerdisk, file or blank", a.Source)
		}
		if (a.Probe || a.Check) && o.Source == nil && o.ChainIndex == nil && len(o.Chain) == 0 {
			return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "--probe and --check need a source to read")
		}
		if a.Check {
			cmd.Log.Info("Checking", "source", sourceName(o))
			return Check(ctx, o)
		}
		if a.Probe {
			cmd.Log.Info("Probing", "source", sourceName(o))
			return Probe(ctx, o)
		}
		cmd.Log.Info("Importing", "source", sourceName(o), "target", a.Target)
		return Import(ctx, o)
	})
}

// chainOf makes o a restore of a backup chain when the chain flags say so: the layers given
// one by one, or a point of an index. layer makes the source of a URL or an object; presigned,
// when given, reads a layer of the index from the URL --layer-url-dir holds for its checkpoint.
// o.Source, made from --url or --object, is then unused, or the index's presigned URL.
func chainOf(o *Options, c contract.Chain, layer func(ref string) (Source, error), presigned func(checkpoint string) (Source, error)) error {
	switch {
	case c.ChainIndex != "" && len(c.Layer) > 0:
		return transfer.Permanent(transfer.ReasonInvalidArgument, "--chain-index and --layer are two ways to give a chain: give one")
	case c.LayerURLDir != "" && (presigned == nil || c.ChainIndex != "" || len(c.Layer) > 0):
		return transfer.Permanent(transfer.ReasonInvalidArgument, "--layer-url-dir is for an http source whose --url (or --url-file) is the backup index")
	case c.LayerURLDir != "":
		o.ChainIndex = &ChainIndex{Source: o.Source, Point: c.ChainPoint, Layer: func(checkpoint, _ string) (Source, error) { return presigned(checkpoint) }}
		o.Source = nil
	case c.ChainIndex != "":
		index, err := layer(c.ChainIndex)
		if err != nil {
			return err
		}
		o.Source, o.ChainIndex = nil, &ChainIndex{Source: index, Point: c.ChainPoint}
	case len(c.Layer) > 0:
		sums := map[int]string{}
		for _, lc := range c.LayerChecksum {
			n, sum, ok := strings.Cut(lc, "=")
			i, err := strconv.Atoi(n)
			if !ok || err != nil || i < 1 || i > len(c.Layer) {
				return transfer.Permanent(transfer.ReasonInvalidArgument, "--layer-checksum %q must be written N=<algorithm>:<hex>, N from 1 to %d", lc, len(c.Layer))
			}
			sums[i] = sum
		}
		o.Source = nil
		for i, ref := range c.Layer {
			src, err := layer(ref)
			if err != nil {
				return err
			}
			o.Chain = append(o.Chain, ChainLayer{Source: src, Checksum: sums[i+1]})
		}
	case c.ChainPoint != "" || len(c.LayerChecksum) > 0:
		return transfer.Permanent(transfer.ReasonInvalidArgument, "--chain-point and --layer-checksum need --chain-index or --layer")
	}
	return nil
}

func sourceName(o Options) string {
	switch {
	case o.Blank:
		return fmt.Sprintf("blank %d bytes", o.BlankSize)
	case o.ChainIndex != nil:
		return "point " + cmp.Or(o.ChainIndex.Point, "(newest)") + " of the backup index " + o.ChainIndex.Source.String()
	case len(o.Chain) > 0:
		return fmt.Sprintf("a chain of %d layers, newest %s", len(o.Chain), o.Chain[len(o.Chain)-1].Source)
	}
	return o.Source.String()
}

// loadCredentials reads basic-auth and header Secrets mounted as files.
func (s *HTTPSource) loadCredentials(authDir string, headers, headerFiles []string) error {
	if authDir != "" {
		var err error
		if s.Username, s.Password, err = basicCredentials(authDir); err != nil {
			return err
		}
	}
	var files []string
	for _, f := range headerFiles {
		keys, err := transfer.MountedFiles(f)
		if err != nil {
			return transfer.Permanent(transfer.ReasonInvalidArgument, "reading header: %w", err)
		}
		files = append(files, keys...)
	}
	for _, f := range files {
		b, err := os.ReadFile(f) //nolint:gosec // a mounted Secret
		if err != nil {
			return transfer.Permanent(transfer.ReasonInvalidArgument, "reading header: %w", err)
		}
		// The value is a secret: a malformed one is named by its file, never echoed.
		name, value, ok := strings.Cut(strings.TrimSpace(string(b)), ":")
		if !ok || strings.TrimSpace(name) == "" {
			return transfer.Permanent(transfer.ReasonInvalidArgument, "the header in %s must be written \"Name: value\"", f)
		}
		s.Header.Add(strings.TrimSpace(name), strings.TrimSpace(value))
		s.SecretHeaders = append(s.SecretHeaders, http.CanonicalHeaderKey(strings.TrimSpace(name)))
	}
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok || strings.TrimSpace(name) == "" {
			return transfer.Permanent(transfer.ReasonInvalidArgument, "header %q must be written \"Name: value\"", strings.SplitN(h, ":", 2)[0])
		}
		s.Header.Add(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	return nil
}

// loadCredentials reads the registry's credentials from a mounted Secret: a .dockerconfigjson
// (kubernetes.io/dockerconfigjson), or a user name and password.
func (s *RegistrySource) loadCredentials(dir string) error {
	if f := filepath.Join(dir, ".dockerconfigjson"); fileExists(f) {
		s.AuthFile = f
		return nil
	}
	var err error
	s.Username, s.Password, err = basicCredentials(dir)
	return err
}

// basicCredentials reads a user name and password from a mounted Secret: the keys username
// and password, or CDI's accessKeyId and secretKey.
func basicCredentials(dir string) (user, pass string, err error) {
	read := func(keys ...string) (string, error) {
		for _, k := range keys {
			b, err := os.ReadFile(filepath.Join(dir, k)) //nolint:gosec // a mounted Secret
			if err == nil {
				return strings.TrimSpace(string(b)), nil
			}
			if !os.IsNotExist(err) {
				return "", err
			}
		}
		return "", fmt.Errorf("the Secret has neither %s", strings.Join(keys, " nor "))
	}
	user, err1 := read("username", "accessKeyId")
	pass, err2 := read("password", "secretKey")
	if err := errors.Join(err1, err2); err != nil {
		return "", "", transfer.Permanent(transfer.ReasonInvalidArgument, "reading basic-auth credentials in %s: %w", dir, err)
	}
	return user, pass, nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
