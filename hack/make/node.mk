# The real node: its build (the node's Kubernetes binaries, CoreDNS, the CNI plugins, the CSI
# sidecars, its pause image) and its end-to-end suite, test/cluster. Included by the Makefile.

##@ Real node

# The real node's suite stops itself before go test's timeout, so that a run that is too slow
# ends with Ginkgo's report (the spec that was running, the failures, the cluster's health)
# rather than a dump of goroutines. With KubeVirt (installing it, booting VMs) it takes longer.
E2E_TIMEOUT ?= $(if $(filter 1,$(KUBEVIRT)),50m,25m)

.PHONY: cluster-tools
cluster-tools: tools cluster-bins ## Build what the real single-node cluster adds: kubelet, controller-manager, scheduler, kube-proxy, CoreDNS, CNI plugins, CSI sidecars, kube-router.

.PHONY: pause-image
pause-image: $(BIN)/image ## Build the real cluster's pause image (test/cluster/pause) as bin/pause-image.tar.
	CGO_ENABLED=0 GOOS=linux GOARCH=$(IMAGE_GOARCH) go build -trimpath -ldflags "-s -w" -o $(BIN)/linux_$(IMAGE_GOARCH)/pause ./test/cluster/pause
	$(BIN)/image build --out $(BIN)/pause-image.tar --ref diskpipe.test/pause:diskpipe --arch $(IMAGE_GOARCH) --entrypoint /pause pause=$(BIN)/linux_$(IMAGE_GOARCH)/pause

# KUBEVIRT=1 installs the real KubeVirt on the real node (make kubevirt kubevirt-images), and
# the specs that boot VMs under it run.
KUBEVIRT ?= 0
KUBEVIRT_DEPS_1 = kubevirt kubevirt-images

# NODES=3 makes the real cluster of three nodes (each its own network, containerd, kubelet and
# kube-proxy; see test/cluster); specs that need several nodes skip on one, saying so.
NODES ?= 1

# The real node skips the specs labelled local-proves: what they prove (a client's behaviour, a
# format's parsing, a controller's policy) is the same on any cluster, and make test runs them on
# the local cluster; that keeps CI's real node, KubeVirt's VMs included, in its time.
# The specs labelled bench measure (make bench-kubevirt and bench-fanout run them). E2E_LABELS= runs every spec
# on the real node.
E2E_LABELS ?= !local-proves && !bench

E2E_REAL = DISKPIPE_KUBEVIRT=$(KUBEVIRT) DISKPIPE_NODES=$(NODES) DISKPIPE_E2E_CLUSTER=real go test -v $(GO_TEST_FLAGS) -timeout 55m ./test/e2e/ \
	-args -ginkgo.v -ginkgo.timeout=$(E2E_TIMEOUT) -ginkgo.label-filter='$(E2E_LABELS)'

.PHONY: test-cluster test-cluster-deps test-cluster-suite
test-cluster: test-cluster-deps ## Run the end-to-end suite on a real cluster (as root): diskpipe installed by helm from its image; KUBEVIRT=1 adds the real KubeVirt, NODES=3 three nodes.
	$(E2E_REAL)

# What the real node needs, built and installed; test-cluster-suite runs the suite alone, on
# what is built (CI runs it beside make test).
test-cluster-deps: setup cluster-tools build image pause-image bootdisk $(KUBEVIRT_DEPS_$(KUBEVIRT))
	hack/setup.sh cluster

test-cluster-suite:
	$(E2E_REAL)

.PHONY: cluster-up
cluster-up: setup cluster-tools build image pause-image $(KUBEVIRT_DEPS_$(KUBEVIRT)) ## Start the real cluster (root) with diskpipe installed by its chart (KUBEVIRT=1: and KubeVirt; NODES=3: three nodes), and keep it until Ctrl-C.
	hack/setup.sh cluster
	DISKPIPE_KUBEVIRT=$(KUBEVIRT) DISKPIPE_NODES=$(NODES) go run ./test/cluster/up

# The real single-node cluster (test/cluster, make test-cluster) adds the node's and the control
# plane's other parts, CoreDNS, the CNI plugins and the real CSI sidecars, all from Go modules;
# containerd, runc and the registry come from Debian (hack/setup.sh cluster).
CNI_PLUGINS_VERSION ?= v1.7.1
CNI_PLUGINS := bridge loopback portmap host-local
CNI_DIR_bridge := main
CNI_DIR_loopback := main
CNI_DIR_portmap := meta
CNI_DIR_host-local := ipam
NODE_KUBE_BINS := $(addprefix $(BIN)/,kubelet kube-controller-manager kube-scheduler kube-proxy coredns csi-provisioner csi-snapshotter snapshot-controller)
CNI_BINS       := $(addprefix $(BIN)/cni/,$(CNI_PLUGINS))
KUBE_ROUTER    := $(BIN)/kube-router
CLUSTER_BINS   = $(NODE_KUBE_BINS) $(CNI_BINS) $(KUBE_ROUTER)

.PHONY: cluster-bins
cluster-bins: $(CLUSTER_BINS)

# The node's Kubernetes binaries, CoreDNS with only the plugins the node's Corefile uses
# (test/tools/cmd/coredns), the real external-provisioner and external-snapshotter (the sidecars
# and the snapshot-controller), on the Kubernetes libraries the Kubernetes binaries compile.
$(NODE_KUBE_BINS) &: test/tools/go.mod test/tools/go.sum test/tools/cmd/coredns/main.go
	$(call KUBE_CACHED_ALL,$(NODE_KUBE_BINS)) 'cd test/tools && go build -ldflags "$(KUBE_LDFLAGS)" -o $(BIN)/ \
		$(addprefix k8s.io/kubernetes/cmd/,kubelet kube-controller-manager kube-scheduler kube-proxy) ./cmd/coredns \
		github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner \
		$(addprefix github.com/kubernetes-csi/external-snapshotter/v8/cmd/,csi-snapshotter snapshot-controller)'

# kube-router's NetworkPolicy controller, which the real cluster runs on its nodes while a spec
# asks for NetworkPolicies to be enforced (test/cluster, EnforceNetworkPolicies).
$(KUBE_ROUTER): test/tools/kuberouter/go.mod test/tools/kuberouter/go.sum
	$(CACHED) 'cd test/tools/kuberouter && CGO_ENABLED=0 go build -trimpath -o $(BIN)/ github.com/cloudnativelabs/kube-router/v2/cmd/kube-router'

$(CNI_BINS) &:
	$(call CACHED_ALL,$(CNI_BINS)) 'GOBIN=$(BIN)/cni go install \
		$(foreach p,$(CNI_PLUGINS),github.com/containernetworking/plugins/plugins/$(CNI_DIR_$(p))/$(p)@$(CNI_PLUGINS_VERSION))'
