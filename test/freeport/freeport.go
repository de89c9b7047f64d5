// Package freeport finds an address nothing listens on, for a server a test starts later: in
// another process, or in code that takes an address rather than a listener.
//
// The port is drawn outside the kernel's ephemeral range (32768–60999 on Linux). A port taken
// there and closed again is free for the kernel to hand out at once, to any process listening
// on port 0 or dialling out: with test packages running in parallel, another package's server
// took the envtest webhook port before the manager bound it, and the apiserver's admission
// calls reached a plain HTTP server. Below the range, only a process choosing the same number
// can take the port.
//
// It is drawn below Kubernetes' NodePort range (30000–32767) too: with the real node's cluster
// running beside the tests, kube-proxy's rules send a NodePort's packets to the Service although
// nothing listens on the port, so a port that looks free there is not (a test registry on
// 30900 answered as the cluster's object store).
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
)

const (
	low  = 20000
	high = 29999 // below the NodePort range, itself below the kernel's ephemeral range
)

// Port returns a port on host that was free a moment ago.
func Port(host string) (int, error) {
	var last error
	for range 100 {
		port := low + rand.IntN(high-low+1) //nolint:gosec // not a secret
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			last = err
			continue
		}
		if err := l.Close(); err != nil {
			return 0, err
		}
		return port, nil
	}
	return 0, fmt.Errorf("no free port on %s between %d and %d: %w", host, low, high, last)
}

// Addr returns host:port for a port on host that was free a moment ago.
func Addr(host string) (string, error) {
	port, err := Port(host)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(host, strconv.Itoa(port)), nil
}
