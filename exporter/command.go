package exporter

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore"
)

// Main runs the exporter command with args (without the program name) and returns its exit
// code: 0 done, 1 failed for good, 3 failed transiently, 64 bad usage. The result is written
// as JSON to the termination message path.
//
// --action export (the default) exports --source; presign only signs a download URL of the
// object, and delete only deletes it: what the manager asks of a pod for an external store,
// whose keys only the pod reads (a Secret volume of the user's namespace).
func Main(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("exporter", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cmd := transfer.NewCommand(stderr)
	cmd.Flags(fs, 192<<20)
	var (
		source      = fs.String("source", "", "disk.img on a filesystem volume, or a block device")
		declared    = fs.Int64("size", 0, "the disk's expected size in bytes; a shorter disk fails the export")
		format      = fs.String("format", "qcow2", "qcow2 or raw")
		compression = fs.String("compression", "none", "qcow2 cluster compression: none, zlib or zstd")
		output      = fs.String("output", "", "write to this local file instead of an object store")
		endpoint    = fs.String("endpoint", "", "the store's URL")
		region      = fs.String("region", "", "the bucket's region")
		lookup      = fs.String("bucket-lookup", "Auto", "Auto, Path or VirtualHost")
		bucket      = fs.String("bucket", "", "the bucket")
		object      = fs.String("object", "", "the object")
		createBkt   = fs.Bool("create-bucket", false, "create the bucket if it does not exist")
		keepStale   = fs.Bool("keep-stale-uploads", false, "leave earlier unfinished uploads of the object alone (the manager aborted them: a credential scoped to one object may not list the bucket's uploads)")
		s3Creds     = fs.String("s3-credentials-dir", "", "directory with the files accessKeyId and secretAccessKey (a mounted Secret)")
		caFile      = fs.String("ca-file", "", "PEM CA bundle that verifies the store")
		insecure    = fs.Bool("insecure", false, "skip verification of the store's certificate")
		partSize    = fs.Int("part-size", 16<<20, "smallest multipart part in bytes")
		parallel    = fs.Int("parallel-uploads", 4, "parts uploaded at once")
		workers     = fs.Int("workers", 4, "goroutines reading and compressing clusters")
		action      = fs.String("action", "export", "export, presign (a download URL of the object) or delete (the object)")
		urlExpiry   = fs.Duration("download-url-expiry", 0, "after exporting (or with --action presign), sign a download URL valid this long")
	)
	if err := fs.Parse(args); err != nil {
		return transfer.ExitUsage
	}
	store := objectstore.ClientConfig{Endpoint: *endpoint, Region: *region, BucketLookup: *lookup, CAFile: *caFile, Insecure: *insecure, Egress: &cmd.Egress}
	switch *action {
	case "export":
	case "presign", "delete":
		return cmd.Run(ctx, "Export", func(ctx context.Context) (*transfer.Result, error) {
			return objectAction(ctx, *action, store, *s3Creds, *bucket, *object, *urlExpiry)
		})
	default:
		fmt.Fprintf(stderr, "--action %q: export, presign or delete\n", *action)
		return transfer.ExitUsage
	}
	return cmd.Run(ctx, "Export", func(ctx context.Context) (*transfer.Result, error) {
		if *source == "" {
			return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "--source is required")
		}
		sink, where, err := openSink(ctx, sinkFlags{
			output: *output, bucket: *bucket, object: *object, createBucket: *createBkt, keepStale: *keepStale, partSize: *partSize, parallel: *parallel,
			client:   store,
			credsDir: *s3Creds, source: *source, format: *format, compression: *compression, log: cmd.Log,
		})
		if err != nil {
			return nil, err
		}
		cmd.Log.Info("Exporting", "source", *source, "to", where, "format", *format, "compression", *compression)
		res, err := Export(ctx, Options{Source: *source, DeclaredSize: *declared, Format: Format(*format),
			Compression: Compression(*compression), Sink: sink, Workers: *workers, Progress: cmd.Progress, Log: cmd.Log})
		res.URL = where
		if err == nil && *urlExpiry > 0 && *output == "" {
			signed, perr := objectAction(ctx, "presign", store, *s3Creds, *bucket, *object, *urlExpiry)
			if perr != nil { // the export stands; the manager says there is no URL and why
				cmd.Log.Warn("Could not sign a download URL", "error", perr)
				return res, nil
			}
			res.DownloadURL, res.DownloadURLExpiresAt = signed.DownloadURL, signed.DownloadURLExpiresAt
		}
		return res, err
	})
}

// objectAction presigns a download URL of bucket/object, or deletes it (an object already
// gone is deleted).
func objectAction(ctx context.Context, action string, cfg objectstore.ClientConfig, credsDir, bucket, object string, expiry time.Duration) (*transfer.Result, error) {
	if credsDir != "" {
		if err := cfg.LoadCredentials(credsDir); err != nil {
			return nil, err
		}
	}
	c, err := objectstore.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	res := &transfer.Result{Succeeded: true, URL: objectstore.ObjectURL(bucket, object)}
	if action == "delete" {
		if err := c.RemoveObject(ctx, bucket, object, minio.RemoveObjectOptions{}); err != nil {
			return nil, objectstore.Classify(err, "deleting "+res.URL)
		}
		return res, nil
	}
	if expiry <= 0 {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "--download-url-expiry is required to presign")
	}
	at := time.Now().Add(expiry)
	u, err := c.PresignGet(ctx, bucket, object, expiry)
	if err != nil {
		return nil, err
	}
	res.DownloadURL, res.DownloadURLExpiresAt = u.String(), &at
	return res, nil
}

type sinkFlags struct {
	output, bucket, object  string
	createBucket, keepStale bool
	partSize, parallel      int
	client                  objectstore.ClientConfig
	credsDir                string
	source, format          string
	compression             string
	log                     *slog.Logger
}

// openSink opens the local file or starts the multipart upload.
func openSink(ctx context.Context, f sinkFlags) (Sink, string, error) {
	if f.output != "" {
		s, err := NewFileSink(f.output)
		return s, f.output, err
	}
	if f.credsDir != "" {
		if err := f.client.LoadCredentials(f.credsDir); err != nil {
			return nil, "", err
		}
	}
	c, err := objectstore.NewClient(f.client)
	if err != nil {
		return nil, "", err
	}
	size := int64(0)
	if d, err := os.Open(f.source); err == nil {
		size, _ = d.Seek(0, io.SeekEnd) // a device's size too: an upper bound of the image's, for the part size
		d.Close()
	}
	s, err := NewMultipartSink(ctx, c, SinkOptions{
		Bucket: f.bucket, Object: f.object, ExpectedSize: size, PartSize: f.partSize, Parallel: f.parallel,
		Log: f.log, CreateBucket: f.createBucket, KeepStale: f.keepStale,
		Metadata: map[string]string{"diskpipe-format": f.format, "diskpipe-compression": f.compression,
			"diskpipe-source-size": strconv.FormatInt(size, 10)},
	})
	return s, objectstore.ObjectURL(f.bucket, f.object), err
}
