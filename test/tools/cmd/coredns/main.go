// Command coredns is CoreDNS v1.12 with the plugins the real node's Corefile uses (bind, errors,
// kubernetes, cache) and no others: the full set compiles the SDKs of three clouds and a
// tracer, and a Kubernetes client of its own.
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"

	"github.com/coredns/coredns/coremain"
)

func main() { coremain.Run() }
