// Package plugin is kubectl-diskpipe, the kubectl plugin (`kubectl diskpipe ...`): it waits
// for and describes diskpipe's objects with their progress, downloads exports with resume and
// checksum verification, and exports a PVC to a local file in one command. It takes every
// standard kubeconfig flag (k8s.io/cli-runtime), so it works with any credential kubectl does.
//
// Exit codes: 0 done, 1 failed for good, 2 usage.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// Exit codes.
const (
	ExitDone   = 0
	ExitFailed = 1
	ExitUsage  = 2
)

const usage = `kubectl diskpipe: diskpipe's images, disks and exports from the terminal.

Commands:
  upload NAME --file FILE     upload an image file to a VirtualMachineImage (or --kind imt) with an
                              upload source (--create makes it), with a progress bar; resumes by
                              itself after a drop, --resume after the command was stopped; then
                              waits until it is imported (--no-wait returns at once)
  wait KIND/NAME              wait until an image, disk or export is Ready, showing its progress
  describe KIND/NAME          its phase, progress and outcome, with what to do about a failure
  download EXPORT -o FILE     download an export's object: resumes after a drop, renews an expired
                              URL, verifies the sha256 in its status
  export PVC -o FILE          export a PVC (--format qcow2|raw, --compression none|zlib|zstd),
                              wait, download, and delete the export (--keep keeps it)

KIND is any name kubectl knows diskpipe's kinds by: virtualmachineimage (vmimage), imagetemplate
(imt), virtualmachinepvc (vmpvc), diskvolume (dvol), virtualmachinevolumeexport (vmve),
virtualmachine.virtualmachine.kubesphere.io (ksvm).

Flags:
`

// errUsage is a mistake on the command line.
type errUsage struct{ msg string }

func (e *errUsage) Error() string { return e.msg }

func usageError(format string, args ...any) error { return &errUsage{fmt.Sprintf(format, args...)} }

// options are what every command shares.
type options struct {
	config  *genericclioptions.ConfigFlags
	streams genericiooptions.IOStreams
	output  string // "" or json
	timeout time.Duration
	// what the commands take
	format, compression string
	keep                bool
	interval            time.Duration
	up                  uploadOptions
}

// Main runs the plugin with args (without the program name) and returns its exit code.
func Main(ctx context.Context, args []string, streams genericiooptions.IOStreams) int {
	o := &options{config: genericclioptions.NewConfigFlags(true), streams: streams}
	fs := pflag.NewFlagSet("kubectl-diskpipe", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.config.AddFlags(fs)
	fs.StringVarP(&o.output, "output", "o", "", "wait/describe: json prints the result as JSON; download/export: the file to write")
	fs.DurationVar(&o.timeout, "timeout", time.Hour, "how long to wait for an object or a download")
	fs.StringVar(&o.format, "format", "qcow2", "export: the file's format (qcow2 or raw)")
	fs.StringVar(&o.compression, "compression", "", "export: none, zlib or zstd (default none)")
	fs.BoolVar(&o.keep, "keep", false, "export: keep the VirtualMachineVolumeExport and its object after the download")
	fs.DurationVar(&o.interval, "interval", time.Second, "how often progress is read")
	fs.StringVar(&o.up.file, "file", "", "upload: the image file to send (qcow2, raw, vmdk, ..., compressed or not)")
	fs.StringVar(&o.up.kind, "kind", "vmimage", "upload: the image's kind, vmimage (VirtualMachineImage) or imt (ImageTemplate)")
	fs.BoolVar(&o.up.create, "create", false, "upload: make the image, with an upload source, if it does not exist")
	fs.StringVar(&o.up.size, "size", "", "upload --create: the golden PVC's size (default: the image's virtual size plus overhead)")
	fs.StringVar(&o.up.storageClass, "storage-class", "", "upload --create: the golden PVC's StorageClass")
	fs.StringVar(&o.up.checksum, "checksum", "", "upload --create: the image's checksum (sha256:<hex>), which the proxy verifies")
	fs.StringVar(&o.up.url, "url", "", "upload: the upload proxy's URL (default: the one the installation names, or its Service through the apiserver)")
	fs.BoolVar(&o.up.resume, "resume", false, "upload: continue an upload of which part is stored already (after the command was stopped)")
	fs.BoolVar(&o.up.noWait, "no-wait", false, "upload: return once the file is uploaded, without waiting for the import")
	help := fs.BoolP("help", "h", false, "show this help")
	err := fs.Parse(args)
	if err == nil && *help {
		fmt.Fprint(streams.Out, usage+fs.FlagUsages())
		return ExitDone
	}
	if err == nil {
		err = o.run(ctx, fs.Args())
	}
	var ue *errUsage
	switch {
	case err == nil:
		return ExitDone
	case errors.As(err, &ue) || strings.Contains(err.Error(), "flag"):
		fmt.Fprintf(streams.ErrOut, "kubectl diskpipe: %v\nRun 'kubectl diskpipe --help' for usage.\n", err)
		return ExitUsage
	default:
		fmt.Fprintf(streams.ErrOut, "kubectl diskpipe: %v\n", err)
		return ExitFailed
	}
}

func (o *options) run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usageError("a command is required: upload, wait, describe, download or export")
	}
	cmd, rest := args[0], args[1:]
	need := func(n int, what string) error {
		if len(rest) != n {
			return usageError("%s takes %s", cmd, what)
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	switch cmd {
	case "wait", "describe":
		if err := need(1, "KIND/NAME"); err != nil {
			return err
		}
		if o.output != "" && o.output != "json" {
			return usageError("-o %s: %s prints text, or JSON with -o json", o.output, cmd)
		}
		c, err := o.client()
		if err != nil {
			return err
		}
		ref, err := c.resolve(rest[0])
		if err != nil {
			return err
		}
		if cmd == "describe" {
			return o.describe(ctx, c, ref)
		}
		_, err = o.wait(ctx, c, ref)
		return err
	case "upload":
		if err := need(1, "the image's NAME"); err != nil {
			return err
		}
		if o.output != "" && o.output != "json" {
			return usageError("-o %s: upload prints text, or JSON with -o json; the file to send is --file", o.output)
		}
		c, err := o.client()
		if err != nil {
			return err
		}
		return o.upload(ctx, c, rest[0])
	case "download", "export":
		if err := need(1, map[string]string{"download": "EXPORT", "export": "PVC"}[cmd]); err != nil {
			return err
		}
		if o.output == "" || o.output == "json" {
			return usageError("%s needs the file to write: -o FILE", cmd)
		}
		c, err := o.client()
		if err != nil {
			return err
		}
		if cmd == "download" {
			return o.download(ctx, c, rest[0])
		}
		return o.export(ctx, c, rest[0])
	}
	return usageError("unknown command %q: upload, wait, describe, download or export", cmd)
}

// isTerminal says whether w is a terminal, where progress is a live bar rather than lines.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
