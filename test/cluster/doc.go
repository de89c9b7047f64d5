// Package cluster runs a real Kubernetes of one node or several on this machine, as root, and installs
// diskpipe on it with its Helm chart from the image `make image` builds. It is the third rung
// of diskpipe's test clusters: envtest has an apiserver and nothing else, test/localcluster
// stands in for the kubelet and CSI with processes and directories, and this package runs the
// real parts.
//
// What runs, all built from Go modules into bin/ (make cluster-tools) or installed from Debian
// (hack/setup.sh cluster):
//
//   - etcd, kube-apiserver (Node and RBAC authorization, Pod Security admission),
//     kube-controller-manager (garbage collector, PV binder, pvc-protection, namespaces,
//     Deployments, StatefulSets, ...), kube-scheduler, kubelet and kube-proxy (iptables), all
//     v1.37.0, with certificates the package issues;
//   - containerd and runc from Debian, the CNI bridge, host-local, loopback and portmap plugins
//     (the pod network is the bridge dp0, 10.244.0.0/24, whose address is the node's), a pause
//     image built here;
//   - CoreDNS serving cluster.local on the node's address, which the kubelet gives pods as
//     their nameserver;
//   - a registry (Debian's docker-registry on 127.0.0.1) holding diskpipe's image and the pause
//     image: containerd pulls them from it, as a cluster pulls from a registry;
//   - NetworkPolicies, enforced only while a spec asks (EnforceNetworkPolicies, netpol.go):
//     kube-router's policy controller (its firewall alone, iptables and ipset) on each node;
//   - CSI: the real external-provisioner, csi-snapshotter and snapshot-controller driving the
//     harness's own driver (csi.go), registered with the kubelet through its plugin
//     registration socket. The driver is a fixture (volumes are directories, block volumes
//     loop devices); the sidecars and the kubelet that drive it are not.
//
// The harness's own parts (the CSI driver, its sidecars, CoreDNS) run on the host as
// processes with the cluster's admin credentials rather than as pods: they would otherwise need
// images and privileged host mounts of their own, and what is under test is diskpipe, which
// runs as pods, installed by `helm install` into a namespace that enforces Pod Security
// "restricted".
//
// With Options.Nodes past one, every further node has a network namespace of its own, joined
// to the machine by a veth pair (node.go), with its own containerd, kubelet and kube-proxy;
// the CSI driver serves each node's kubelet, and its class LocalClass makes node-local volumes
// with CSI topology.
//
// Everything lives under one directory (default /var/lib/diskpipe-cluster). Stop, and Start
// before it begins, take down what a previous run left: processes, containers, mounts, loop
// devices, network namespaces, the bridge, iptables chains, cgroups and the sysctls the
// kubelet changes.
package cluster
