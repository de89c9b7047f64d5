//go:build tools

// Package tools pins the Kubernetes binaries the tests and the demo run: kube-apiserver and kubectl
// from k8s.io/kubernetes, and etcd (cmd/etcd) from go.etcd.io/etcd/server/v3.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
