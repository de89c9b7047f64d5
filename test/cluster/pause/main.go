// Command pause is the real cluster's sandbox ("pause") image: it holds a pod's namespaces and
// does nothing until it is told to stop. No pause image can be pulled here, so the harness
// builds this one (make pause-image). The harness also runs it as PID 1 of the node's own PID
// namespace (test/cluster, nodeNamespace).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	// As PID 1, reap the children that others leave behind (a pod's containers sharing its PID
	// namespace; on the node, the shims containerd starts).
	child := make(chan os.Signal, 1)
	signal.Notify(child, syscall.SIGCHLD)
	for {
		select {
		case <-sig:
			return
		case <-child:
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
