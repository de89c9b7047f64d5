// Command up starts the real single-node cluster with diskpipe installed (make cluster-up) and
// keeps it until interrupted; it prints how to point kubectl at it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/diskpipe/diskpipe/test/cluster"
)

func main() {
	kubevirt := flag.Bool("kubevirt", os.Getenv("DISKPIPE_KUBEVIRT") == "1", "install the real KubeVirt too (make kubevirt-images)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o := cluster.DefaultOptions(os.Stderr)
	o.KubeVirt = *kubevirt
	c, err := cluster.Start(ctx, o)
	if err != nil {
		stop()
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1) //nolint:gocritic // stop() ran
	}
	fmt.Printf("The cluster is up (%d nodes: %s), with diskpipe installed. In another terminal:\n  export KUBECONFIG=%s\n  kubectl get pods -A -o wide\nCtrl-C takes it down.\n",
		len(c.NodeNames()), strings.Join(c.NodeNames(), ", "), c.Kubeconfig)
	<-ctx.Done()
	c.Stop()
}
