package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/diskpipe/diskpipe/test/framework"
)

// startCluster starts the local cluster (the fast default) or the real single-node cluster
// (--cluster=real, make demo CLUSTER=real), on which helm installs diskpipe's image and
// KubeVirt runs the VM.
func startCluster(ctx context.Context, kind, dir string) (framework.Cluster, error) {
	switch kind {
	case framework.Local:
		say("Starting the local cluster (etcd, kube-apiserver, object store, manager, upload proxy, node agent, CSI stand-in) in %s", dir)
		return framework.Start(ctx, framework.Options{Kind: kind, Dir: dir, Log: os.Stdout})
	case framework.Real:
		say("Starting a real single-node Kubernetes (etcd, kube-apiserver, controller-manager, scheduler, kubelet, containerd, kube-proxy, CoreDNS, CSI sidecars), KubeVirt installed by its operator, then helm install diskpipe from its image")
		return framework.Start(ctx, framework.Options{Kind: kind, Dir: dir, Log: os.Stdout, KubeVirt: true})
	}
	return nil, fmt.Errorf("--cluster=%s: want %s or %s", kind, framework.Local, framework.Real)
}

// storeEndpoint is the bundled store's address as awscli and curl reach it.
func storeEndpoint(ctx context.Context, c framework.Cluster) string {
	endpoint, _, _, err := c.StoreAccess(ctx)
	if err != nil {
		return "(the store's address: " + err.Error() + ")"
	}
	return endpoint
}

// logs says where the cluster's logs are.
func logs(c framework.Cluster) string { return strings.Join(c.LogDirs(), " and ") }
