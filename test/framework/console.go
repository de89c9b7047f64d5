package framework

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"time"

	realcluster "github.com/diskpipe/diskpipe/test/cluster"
	"github.com/diskpipe/diskpipe/test/freeport"
	"github.com/diskpipe/diskpipe/test/testenv"
)

// ConsoleURL is where a browser on this machine opens the console (its pages; the API under
// kapis/ beside them), and stop ends what reaching it needed.
func (l local) ConsoleURL(context.Context) (string, func(), error) {
	return l.GatewayURL + "/", func() {}, nil
}

// ConsoleURL on the real cluster is the gateway's Service through the apiserver's service
// proxy, reached with `kubectl proxy` as the administrator, as a person with a kubeconfig and
// no ingress opens it: the apiserver takes kubectl's Authorization for itself, so the page
// carries its user's token in X-Diskpipe-Token.
func (r real) ConsoleURL(ctx context.Context) (string, func(), error) {
	addr, err := freeport.Addr("127.0.0.1")
	if err != nil {
		return "", nil, err
	}
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.CommandContext(ctx, testenv.Path("bin", "kubectl"), "--kubeconfig", r.KubeconfigFile(), "proxy", "--address", "127.0.0.1", "--port", port) //nolint:gosec // the pinned kubectl
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			conn.Close()
			break
		}
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("kubectl proxy did not listen on %s", addr)
		}
	}
	return fmt.Sprintf("http://%s/api/v1/namespaces/%s/services/https:%s-gateway:443/proxy/", addr, realcluster.ReleaseNamespace, realcluster.Release), stop, nil
}
