package importer

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore"
)

// Main runs the importer command with args (without the program name) and returns its exit
// code: 0 imported, 1 failed for good, 3 failed transiently, 64 bad usage. The result is
// written as JSON to the termination message path.
func Main(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("importer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cmd := transfer.NewCommand(stderr)
	cmd.Flags(fs, 128<<20)
	var (
		sourceType  = fs.String("source", "http", "source kind: http, s3, registry, file or blank")
		url         = fs.String("url", "", "http: the image's URL; registry: docker://registry/repository:tag or oci-archive:/path")
		urlFile     = fs.String("url-file", "", "http: a file (a mounted Secret key) holding the URL, for URLs that carry a credential (presigned)")
		caFile      = fs.String("ca-file", "", "http, s3, registry: PEM CA bundle that verifies the server")
		insecure    = fs.Bool("insecure", false, "http, s3, registry: skip verification of the server's certificate (registry: allow plain HTTP)")
		authDir     = fs.String("auth-dir", "", "http, registry: a mounted Secret with username and password (or CDI's accessKeyId and secretKey) for basic auth; registry: or a .dockerconfigjson")
		headerFiles = stringList{}
		headers     = stringList{}
		endpoint    = fs.String("endpoint", "", "s3: the store's URL")
		region      = fs.String("region", "", "s3: the bucket's region")
		lookup      = fs.String("bucket-lookup", "Auto", "s3: Auto, Path or VirtualHost")
		bucket      = fs.String("bucket", "", "s3: the bucket")
		object      = fs.String("object", "", "s3: the object")
		s3Creds     = fs.String("s3-credentials-dir", "", "s3: directory with the files accessKeyId and secretAccessKey (a mounted Secret)")
		authFile    = fs.String("registry-auth-file", "", "registry: a .dockerconfigjson with the registry's credentials")
		publicKey   = fs.String("registry-public-key-file", "", "registry: a PEM public key the image must carry a cosign signature by")
		arch        = fs.String("architecture", "", "registry: the architecture to pick from an index (default: this machine's)")
		path        = fs.String("path", "", "file: the source disk (a file or block device)")
		blankSize   = fs.Int64("blank-size", 0, "blank: the disk's size in bytes")
		target      = fs.String("target", "", "disk.img on a filesystem volume, or a block device")
		capacity    = fs.Int64("capacity", 0, "the volume's size in bytes (default: the filesystem's or device's)")
		overhead    = fs.Float64("overhead", DefaultOverhead, "share of a filesystem volume kept for the filesystem")
		checksum    = fs.String("checksum", "", "expected digest of the source, <sha256|sha512|sha1|md5>:<hex>")
		format      = fs.String("format", "", "force the format (raw); empty detects it")
		ovaDisk     = fs.String("ova-disk", "", "an OVA appliance's disk to import, by OVF disk id or file name (default: the first)")
		parallel    = fs.Int("parallel", 8, "ranged requests in flight at once")
		retries     = fs.Int("retries", transfer.DefaultRetryPolicy.Attempts, "attempts of each request before a transient failure ends the import")
		stall       = fs.Duration("stall-timeout", time.Minute, "how long a response may send nothing before it is retried")
		cpuProfile  = fs.String("cpu-profile", "", "write a CPU profile to this file (for performance work)")
		probe       = fs.Bool("probe", false, "only tell the source's format and virtual size (in the result); write nothing")
		check       = fs.Bool("check", false, "only tell the source's revision (in the result): an ETag, Last-Modified or registry digest; read no image")
		preallocate = fs.Bool("preallocate", false, "allocate the whole disk file on its volume (fallocate)")
		grow        = fs.Bool("grow", false, "make disk.img as large as the volume allows when the image is smaller (blank: size 0 is the whole volume)")
		growOnly    = fs.Bool("grow-only", false, "import nothing: grow the existing disk at --target to the volume (a disk cloned by the storage system)")
		serveAddr   = fs.String("serve", "", "import nothing: serve the disk at --path read-only over HTTP on this address, to the bearer of --token-file")
		tokenFile   = fs.String("token-file", "", "serve: the file (a mounted Secret key) holding the bearer token")
	)
	fs.Var(&headers, "header", "http: a header sent with every request, \"Name: value\" (repeatable)")
	fs.Var(&headerFiles, "header-file", "http: a file (a mounted Secret key) holding a header \"Name: value\", or a mounted Secret whose every key holds one (repeatable)")
	if err := fs.Parse(args); err != nil {
		return transfer.ExitUsage
	}
	if *cpuProfile != "" {
		if f, err := os.Create(*cpuProfile); err == nil {
			_ = pprof.StartCPUProfile(f)
			defer func() { pprof.StopCPUProfile(); f.Close() }()
		}
	}

	o := Options{
		Target: *target, Capacity: *capacity, Overhead: *overhead, Checksum: *checksum, Format: Format(*format), OVADisk: *ovaDisk,
		Parallel: *parallel, StallTimeout: *stall, Log: cmd.Log, Progress: cmd.Progress,
		Retry: transfer.RetryPolicy{Attempts: *retries, Initial: transfer.DefaultRetryPolicy.Initial, Max: transfer.DefaultRetryPolicy.Max},
	}
	o.Grow, o.Preallocate = *grow, *preallocate
	if *serveAddr != "" {
		return cmd.Run(ctx, "Serve", func(ctx context.Context) (*transfer.Result, error) {
			token, err := os.ReadFile(*tokenFile)
			if err != nil {
				return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "reading the token: %w", err)
			}
			cmd.Log.Info("Serving", "path", *path, "addr", *serveAddr)
			return &transfer.Result{Succeeded: true}, Serve(ctx, *serveAddr, *path, strings.TrimSpace(string(token)))
		})
	}
	if *growOnly {
		return cmd.Run(ctx, "Grow", func(context.Context) (*transfer.Result, error) {
			return Grow(*target, *capacity, *overhead, *preallocate)
		})
	}
	return cmd.Run(ctx, "Import", func(ctx context.Context) (*transfer.Result, error) {
		if *target == "" && !*probe && !*check {
			return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "--target is required")
		}
		switch *sourceType {
		case "http":
			if *urlFile != "" {
				b, err := os.ReadFile(*urlFile)
				if err != nil {
					return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "reading the URL: %w", err)
				}
				*url = strings.TrimSpace(string(b))
			}
			s := &HTTPSource{URL: *url, CAFile: *caFile, Insecure: *insecure, Header: http.Header{}, Egress: &cmd.Egress}
			if err := s.loadCredentials(*authDir, headers, headerFiles); err != nil {
				return nil, err
			}
			o.Source = s
		case "s3":
			cfg := objectstore.ClientConfig{Endpoint: *endpoint, Region: *region, BucketLookup: *lookup, CAFile: *caFile, Insecure: *insecure, Egress: &cmd.Egress}
			if *s3Creds != "" {
				if err := cfg.LoadCredentials(*s3Creds); err != nil {
					return nil, err
				}
			}
			o.Source = &S3Source{Config: cfg, Bucket: *bucket, Object: *object}
		case "registry":
			if !strings.HasPrefix(*url, "docker://") {
				// An archive would be a file of this pod (none is mounted) unpacked into scratch
				// space (there is none): only a registry is a source here.
				return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "registry URL %q must start with docker://: push an oci-archive to a registry", *url)
			}
			r := &RegistrySource{URL: *url, AuthFile: *authFile, CAFile: *caFile, Insecure: *insecure, Architecture: *arch, PublicKeyFile: *publicKey, Egress: &cmd.Egress}
			if *authDir != "" {
				if err := r.loadCredentials(*authDir); err != nil {
					return nil, err
				}
			}
			o.Source = r
		case "file":
			o.Source, o.Format = &FileSource{Path: *path}, FormatRaw
		case "blank":
			o.Blank, o.BlankSize = true, *blankSize
		default:
			return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "unknown --source %q: http, s3, registry, file or blank", *sourceType)
		}
		if (*probe || *check) && o.Source == nil {
			return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "--probe and --check need a source to read")
		}
		if *check {
			cmd.Log.Info("Checking", "source", sourceName(o))
			return Check(ctx, o)
		}
		if *probe {
			cmd.Log.Info("Probing", "source", sourceName(o))
			return Probe(ctx, o)
		}
		cmd.Log.Info("Importing", "source", sourceName(o), "target", *target)
		return Import(ctx, o)
	})
}

func sourceName(o Options) string {
	if o.Blank {
		return fmt.Sprintf("blank %d bytes", o.BlankSize)
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

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }
