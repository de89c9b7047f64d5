// Command exporter converts a PVC's disk to qcow2 (or raw) and streams it into an object
// store; it is what an exporter pod runs. See exporter.Main for its flags and result.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/diskpipe/diskpipe/exporter"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := exporter.Main(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}
