//go:build tools

// Package tools pins the Kubernetes binaries the tests, the demo and the real cluster run:
// kube-apiserver, kubectl, kube-controller-manager, kube-scheduler, kubelet and kube-proxy from
// k8s.io/kubernetes, etcd (cmd/etcd) from go.etcd.io/etcd/server/v3, and CoreDNS (cmd/coredns)
// with the real node's plugins, the csi-provisioner sidecar from
// github.com/kubernetes-csi/external-provisioner/v6, and the csi-snapshotter sidecar and
// snapshot-controller from github.com/kubernetes-csi/external-snapshotter/v8. go.mod takes every module a package of both
// these and diskpipe comes from at diskpipe's version, so that a fresh machine compiles each
// package once (hack/verify.sh checks it).
package tools

import (
	_ "github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter"
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
