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

	"github.com/diskpipe/diskpipe/internal/contract"
	"github.com/diskpipe/diskpipe/internal/seal"
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
	a := contract.DefaultExport()
	contract.Bind(fs, &a)
	if err := fs.Parse(args); err != nil {
		return transfer.ExitUsage
	}
	cmd := transfer.NewCommand(stderr)
	if err := cmd.Configure(a.Pod); err != nil {
		fmt.Fprintln(stderr, err)
		return transfer.ExitUsage
	}
	store := objectstore.ClientConfig{Endpoint: a.Endpoint, Region: a.Region, BucketLookup: a.BucketLookup, CAFile: a.CAFile, Insecure: a.Insecure, Egress: &cmd.Egress}
	switch a.Action {
	case "export":
	case "presign", "delete":
		return cmd.Run(ctx, "Export", func(ctx context.Context) (*transfer.Result, error) {
			return objectAction(ctx, a.Action, store, a.CredentialsDir, a.Bucket, a.Object, a.DownloadURLExpiry, a.SealKey, a.SealContext)
		})
	default:
		fmt.Fprintf(stderr, "--action %q: export, presign or delete\n", a.Action)
		return transfer.ExitUsage
	}
	return cmd.Run(ctx, "Export", func(ctx context.Context) (*transfer.Result, error) {
		if a.Source == "" {
			return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "--source is required")
		}
		if a.BackupIndex != "" && a.Output != "" {
			return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "--backup-index keeps backups in a store, not in --output")
		}
		sink, where, err := openSink(ctx, sinkFlags{
			output: a.Output, bucket: a.Bucket, object: a.Object, createBucket: a.CreateBucket, keepStale: a.KeepStaleUploads, partSize: a.PartSize, parallel: a.ParallelUploads,
			client:   store,
			credsDir: a.CredentialsDir, source: a.Source, format: a.Format, compression: a.Compression, log: cmd.Log,
		})
		if err != nil {
			return nil, err
		}
		cmd.Log.Info("Exporting", "source", a.Source, "to", where, "format", a.Format, "compression", a.Compression)
		o := Options{Source: a.Source, DeclaredSize: a.Size, Format: Format(a.Format),
			Compression: Compression(a.Compression), Sink: sink, Workers: a.Workers, Progress: cmd.Progress, Log: cmd.Log}
		var res *transfer.Result
		if a.BackupIndex != "" {
			if a.BackupCheckpoint == "" {
				return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "--backup-checkpoint is required with --backup-index")
			}
			cfg := store
			if a.CredentialsDir != "" {
				if err := cfg.LoadCredentials(a.CredentialsDir); err != nil {
					return nil, err
				}
			}
			c, cerr := objectstore.NewClient(cfg)
			if cerr != nil {
				return nil, cerr
			}
			res, err = Keep(ctx, o, BackupOptions{Client: c, Bucket: a.Bucket, Index: a.BackupIndex, Object: a.Object,
				Checkpoint: a.BackupCheckpoint, Full: a.BackupFull, MaxChain: a.BackupMaxChain, KeepFulls: a.BackupKeepFulls, Log: cmd.Log})
		} else {
			res, err = Export(ctx, o)
		}
		if res == nil {
			res = &transfer.Result{}
		}
		res.URL = where
		if err == nil && a.DownloadURLExpiry > 0 && a.Output == "" {
			signed, perr := objectAction(ctx, "presign", store, a.CredentialsDir, a.Bucket, a.Object, a.DownloadURLExpiry, a.SealKey, a.SealContext)
			if perr != nil { // the export stands; the manager says there is no URL and why
				cmd.Log.Warn("Could not sign a download URL", "error", perr)
				return res, nil
			}
			res.SealedDownloadURL, res.DownloadURLExpiresAt = signed.SealedDownloadURL, signed.DownloadURLExpiresAt
		}
		return res, err
	})
}

// objectAction presigns a download URL of bucket/object, sealed to sealKey (the result is
// read by whoever may read pods), or deletes it (an object already gone is deleted).
func objectAction(ctx context.Context, action string, cfg objectstore.ClientConfig, credsDir, bucket, object string, expiry time.Duration, sealKey, sealContext string) (*transfer.Result, error) {
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
	if sealKey == "" || sealContext == "" {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "--seal-key and --seal-context are required to presign: a download URL is never left in the result in the clear")
	}
	at := time.Now().Add(expiry)
	u, err := c.PresignGet(ctx, bucket, object, expiry)
	if err != nil {
		return nil, err
	}
	sealed, err := seal.Seal(sealKey, []byte(u.String()), contract.DownloadSealContext(sealContext, at))
	if err != nil {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "--seal-key: %v", err)
	}
	res.SealedDownloadURL, res.DownloadURLExpiresAt = sealed, &at
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
