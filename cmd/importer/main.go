// Command importer copies a disk image from a source into a PVC; it is what an importer pod
// runs. See importer.Main for its flags, exit codes and result.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/diskpipe/diskpipe/importer"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := importer.Main(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}
