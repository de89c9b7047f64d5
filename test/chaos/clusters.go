package main

import (
	"context"
	"io"
	"path/filepath"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/internal/tenancy"
	"github.com/diskpipe/diskpipe/objectstore"
	realcluster "github.com/diskpipe/diskpipe/test/cluster"
	"github.com/diskpipe/diskpipe/test/localcluster"
	"github.com/diskpipe/diskpipe/test/testenv"
)

// cluster is what a run asks of a cluster: the local one (the default) or the real node
// (-cluster=real, make chaos CLUSTER=real).
type cluster interface {
	APIClient() client.Client
	Namespace(ctx context.Context, name string) error
	// HostAddress is where the run's HTTP source listens so that pods reach it.
	HostAddress() string
	VolumePath(ns, pvc string) string
	KillPod(ns, name string) error
	// RestartManager kills the manager without warning and brings it back.
	RestartManager() error
	StopStore() error
	StartStore() error
	// AWS runs awscli against the bundled store as root.
	AWS(ctx context.Context, args ...string) (string, error)
	StoreClient(ctx context.Context) (*objectstore.Client, error)
	StoreSecretKey(ctx context.Context) (string, error)
	// ManagerCounter sums a counter over every run of the manager.
	ManagerCounter(name string) (float64, error)
	// LogDirs hold every log of the run's processes and pods, searched for secrets.
	LogDirs() []string
	Stop()
}

func startCluster(ctx context.Context, kind, dir string, log io.Writer) (cluster, error) {
	if kind == "real" {
		c, err := realcluster.Start(ctx, realcluster.DefaultOptions(log))
		if err != nil {
			return nil, err
		}
		// The kubelet removes a finished pod's log; the run keeps them all to search them.
		kept := filepath.Join(dir, "pod-logs")
		if err := c.KeepPodLogs(ctx, kept); err != nil {
			c.Stop()
			return nil, err
		}
		return real{c, kept}, nil
	}
	c, err := localcluster.Start(ctx, localcluster.Options{Bin: testenv.Path("bin"), Dir: filepath.Join(dir, "cluster"), Log: log})
	if err != nil {
		return nil, err
	}
	return local{c, filepath.Join(dir, "cluster")}, nil
}

// real adapts the real node: its logs are the components' and the pods' kept by KeepPodLogs.
type real struct {
	*realcluster.Cluster
	kept string
}

func (r real) LogDirs() []string { return []string{r.kept, filepath.Join(r.Dir(), "logs")} }

// local adapts the local cluster: every process and pod logs under its directory.
type local struct {
	*localcluster.Cluster
	dir string
}

func (l local) APIClient() client.Client { return l.Client }
func (l local) HostAddress() string      { return "127.0.0.1" }
func (l local) LogDirs() []string        { return []string{l.dir} }
func (l local) AWS(ctx context.Context, args ...string) (string, error) {
	return l.Store.AWS(ctx, l.Store.SecretKey, args...)
}
func (l local) StopStore() error  { l.Store.Kill(); return nil }
func (l local) StartStore() error { l.Store.Restart(); return nil }
func (l local) StoreClient(context.Context) (*objectstore.Client, error) {
	c, err := objectstore.NewClient(l.Store.ClientConfig())
	if err == nil {
		c.ResolveNamespaces(tenancy.UIDs(l.Client))
	}
	return c, err
}
func (l local) StoreSecretKey(context.Context) (string, error) { return l.Store.SecretKey, nil }
