// Command pause is the real cluster's sandbox ("pause") image: it holds a pod's namespaces and
// does nothing until it is told to stop. No pause image can be pulled here, so the harness
// builds this one (make pause-image).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	// As PID 1 of the pod, reap the children that other containers of a shared PID namespace
	// leave behind.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGCHLD)
	<-sig
}
