# diskpipe's build, code generation, tests and demo. `make help` lists the targets.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
.DEFAULT_GOAL := help

ROOT := $(abspath .)
BIN  := $(ROOT)/bin
export PATH := $(BIN):$(PATH)
# Every build, run and test of this module compiles its dependencies the same way, so that each
# is compiled once on a fresh machine rather than once for the tests, once for the image and once
# for the importer: cgo on (the importer links libdeflate), Go's own resolver and user lookup
# (the image's binaries are static), and -trimpath (the image is the same from any clone). The
# tools keep Go's defaults (CACHED).
export GOFLAGS ?= -buildvcs=false -trimpath -tags=netgo,osusergo

# Pinned tool versions.
CONTROLLER_TOOLS_VERSION ?= v0.23.0
CRD_REF_DOCS_VERSION     ?= v0.3.0
GOLANGCI_LINT_VERSION    ?= v2.15.0
KUBE_VERSION             ?= v1.37.0
HELM_VERSION             ?= v4.3.1

CONTROLLER_GEN := $(BIN)/controller-gen
CRD_REF_DOCS   := $(BIN)/crd-ref-docs
GOLANGCI_LINT  := $(BIN)/golangci-lint
KUBE_BINS      := $(BIN)/kube-apiserver $(BIN)/etcd $(BIN)/kubectl
HELM           := $(BIN)/helm

# envtest finds kube-apiserver, etcd and kubectl here.
export KUBEBUILDER_ASSETS := $(BIN)

# 40m: in CI the local cluster's suite shares the cores with the real node's (.ci/run).
GO_TEST_FLAGS ?= -count=1 -timeout 40m
##@ General

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*##/ { printf "  %-18s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: generate
generate: $(CONTROLLER_GEN) $(CRD_REF_DOCS) ## Write the generated deepcopy functions of apis/, the API reference (docs/api.md) and the troubleshooting page's reasons.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./apis/...
	$(CRD_REF_DOCS) --source-path=./apis --config=hack/crd-ref-docs/config.yaml --renderer=markdown --output-path=docs/api.md --log-level=error
	go run ./hack/docs reasons

# The kinds of CDI's API the chart installs with cdi.compatibility.enabled: those KubeVirt and
# virtctl read. CDI's volume populator sources (VolumeImportSource, ...) are not served.
CDI_KINDS := datavolumes datasources dataimportcrons storageprofiles cdiconfigs cdis

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Write the CRDs into charts/diskpipe/files/crds and CDI's into files/cdi (templates/crds.yaml installs them), CDI's admission policies into files/cdi-policies, the manager's ClusterRole, and the VolumeSnapshot, KubeVirt VirtualMachine and Prometheus Operator CRDs tests install into test/crds.
	rm -f charts/diskpipe/files/crds/*.yaml test/crds/snapshot/*.yaml
	$(CONTROLLER_GEN) crd paths=./apis/... output:crd:dir=charts/diskpipe/files/crds
	$(CONTROLLER_GEN) rbac:roleName=diskpipe-manager paths=./controllers/... output:rbac:dir=charts/diskpipe/templates/rbac
	$(CONTROLLER_GEN) crd paths=github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1 output:crd:dir=test/crds/snapshot
	rm -rf charts/diskpipe/files/cdi
	$(CONTROLLER_GEN) crd paths=kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1 output:crd:dir=charts/diskpipe/files/cdi
	find charts/diskpipe/files/cdi -type f $(foreach k,$(CDI_KINDS),! -name cdi.kubevirt.io_$(k).yaml) -delete
	go run ./hack/cdipolicies charts/diskpipe/files/cdi-policies
	rm -rf test/crds/kubevirt
	$(CONTROLLER_GEN) crd:allowDangerousTypes=true paths=kubevirt.io/api/core/v1 output:crd:dir=test/crds/kubevirt
	find test/crds/kubevirt -type f ! -name kubevirt.io_virtualmachines.yaml -delete
	go run ./hack/crdcolumns test/crds/kubevirt/kubevirt.io_virtualmachines.yaml \
		Age:date:.metadata.creationTimestamp Status:string:.status.printableStatus "Ready:string:.status.conditions[?(@.type=='Ready')].status"
	rm -rf test/crds/monitoring
	$(CONTROLLER_GEN) crd paths=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1 output:crd:dir=test/crds/monitoring
	find test/crds/monitoring -type f ! -name '*_servicemonitors.yaml' ! -name '*_prometheusrules.yaml' -delete

.PHONY: verify
verify: $(CRD_REF_DOCS) ## Fail when generated files, docs links or go.mod are stale, or a binary or large file is tracked.
	hack/verify.sh

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint.
	$(GOLANGCI_LINT) run ./...

.PHONY: chart
chart: $(HELM) ## helm lint and helm template the chart with its default values and with each of test/chart/testdata.
	$(HELM) lint --strict charts/diskpipe
	$(HELM) template diskpipe charts/diskpipe --namespace diskpipe-system > /dev/null
	@for f in test/chart/testdata/*.yaml; do \
		echo "helm lint/template -f $$f"; \
		$(HELM) lint --strict charts/diskpipe -f $$f > /dev/null && \
		$(HELM) template diskpipe charts/diskpipe --namespace diskpipe-system -f $$f > /dev/null || exit 1; \
	done

# The console's pages: npm ci installs exactly package-lock.json's packages (Preact, hash-wasm,
# esbuild) and esbuild bundles them into gateway/web/dist, which the gateway's binary embeds.
WEB_SRC := $(shell find gateway/web/src -type f) gateway/web/build.mjs gateway/web/package.json gateway/web/package-lock.json
WEB     := gateway/web/dist/index.html

.PHONY: web
web: $(WEB) ## Build the console's pages into gateway/web/dist (npm ci and esbuild, at package-lock.json's versions).

$(WEB): $(WEB_SRC)
	cd gateway/web && npm ci --no-audit --no-fund --loglevel=error && npm run --silent build

.PHONY: build
build: setup web ## Build diskpipe's binaries into bin/.
	go build -o $(BIN)/ ./cmd/...

##@ Image

# The image's name; its tag is the chart's appVersion, which is the chart's default image tag.
VERSION       ?= $(shell sed -n 's/^appVersion: *"*\([^"]*\)"*/\1/p' charts/diskpipe/Chart.yaml)
IMAGE         ?= ghcr.io/diskpipe/diskpipe:$(VERSION)
IMAGE_ARCHIVE ?= $(BIN)/diskpipe-image.tar
IMAGE_BINS    := manager importer exporter uploadproxy objectstore gateway
IMAGE_GOARCH  ?= $(shell go env GOARCH)

# The importer links libdeflate (Debian's libdeflate-dev) through cgo to inflate compressed qcow2
# clusters, and liblzma (liblzma-dev) to decode xz. Every binary is linked statically, with Go's
# own resolver and user lookup, so the image holds nothing but the binaries; they are built as
# the tests' are (GOFLAGS above), so a fresh machine compiles the dependencies once.
.PHONY: image
image: setup web $(BIN)/image ## Build diskpipe's image (no Docker, no base image; reproducible) as an OCI archive: bin/diskpipe-image.tar.
	CGO_ENABLED=1 GOOS=linux GOARCH=$(IMAGE_GOARCH) go build -trimpath -tags netgo,osusergo \
		-ldflags "-s -w -linkmode external -extldflags -static" -o $(BIN)/linux_$(IMAGE_GOARCH)/ $(addprefix ./cmd/,$(IMAGE_BINS))
	@for b in $(IMAGE_BINS); do \
		if ! file $(BIN)/linux_$(IMAGE_GOARCH)/$$b | grep -q 'statically linked'; then \
			echo "image: $(BIN)/linux_$(IMAGE_GOARCH)/$$b is not statically linked" >&2; exit 1; fi; \
	done
	$(BIN)/image build --out $(IMAGE_ARCHIVE) --ref $(IMAGE) --arch $(IMAGE_GOARCH) $(foreach b,$(IMAGE_BINS),$(b)=$(BIN)/linux_$(IMAGE_GOARCH)/$(b))

# hack/image: builds and pushes OCI images without a container engine; -trimpath makes it the same
# binary in every clone, so that the images it builds are found in hack/cached's cache (it is an
# input of theirs: built as the tools are, with Go's default flags).
$(BIN)/image: $(filter-out %_test.go,$(wildcard hack/image/*.go))
	GOFLAGS=$(TOOL_GOFLAGS) go build -trimpath -o $@ ./hack/image

.PHONY: image-push
image-push: image ## Push the image to a registry: make image-push IMAGE=registry.example.com/diskpipe:0.1.0.
	$(BIN)/image push --archive $(IMAGE_ARCHIVE) $(IMAGE)

##@ Test

.PHONY: setup
setup: ## Install the Debian packages the tests use (qemu-utils, awscli, ...).
	hack/setup.sh

.PHONY: tools
tools: $(CONTROLLER_GEN) $(CRD_REF_DOCS) $(KUBE_BINS) $(HELM) ## Build the pinned tools, helm and the Kubernetes binaries.


# The tests' bootable disk (test/bootdisk): Debian's kernel and busybox, syslinux, in raw, qcow2
# and vmdk; rebuilt when its recipe changes, booted once under QEMU when made.
BOOTDISK := $(BIN)/bootdisk/disk.raw

.PHONY: bootdisk
bootdisk: $(BOOTDISK) ## Make the tests' bootable disk (bin/bootdisk) from Debian packages.

$(BOOTDISK): $(wildcard test/bootdisk/*.go test/bootdisk/build/*.go) | setup
	go run ./test/bootdisk/build $(BIN)/bootdisk

# The local cluster leaves out the specs labelled real-proves: they run the same on both
# clusters, and CI runs them on the real node (make test-cluster), where they prove more.
# E2E_LOCAL_LABELS= runs every spec on the local cluster.
E2E_LOCAL_LABELS ?= !real-proves

.PHONY: test
# test/e2e is named first so that go test builds and starts it first: it mostly waits on its
# cluster's pods, and the other packages, mostly busy, fill those waits.
test: setup tools build bootdisk ## Run every test: unit, envtest integration, end to end (test/e2e on the local cluster).
	DISKPIPE_E2E_LABELS='$(E2E_LOCAL_LABELS)' go test $(GO_TEST_FLAGS) ./test/e2e/ ./...

# A count (Nx), not a duration: with a duration Go 1.26's fuzz coordinator can fail a clean run
# with "context deadline exceeded" as the time runs out (go.dev/issue/75804, fixed in Go 1.27).
# 60000 executions take about 7 s per target here.
FUZZTIME ?= 60000x
# Each input that finds new coverage is minimized, for up to a minute by default: a run that
# finds twenty spent most of 14 minutes minimizing (FuzzQcow2Stream in CI). A count bounds it;
# a crasher is still kept, only less minimized.
FUZZMINIMIZETIME ?= 200x
# FuzzImportQcow2 and FuzzImportMapped run whole imports: under the fuzzer's instrumentation they
# manage about one input a second, too few for a short run to find anything, so CI leaves them
# out (their seed corpora still run in every `go test`; run them with `make fuzz-imports`).
FUZZ_TARGETS := importer:FuzzSniff importer:FuzzQcow2Header importer:FuzzOVF importer:FuzzQcow2Stream importer:FuzzVMDKStream importer:FuzzOVA importer:FuzzXzGuard
FUZZ_IMPORT_TARGETS := importer:FuzzImportQcow2 importer:FuzzImportMapped
# The fuzz binaries are built by Go 1.27.3, which the go command takes from the module proxy
# (76 MB, once a machine): Go 1.26's fuzzing coordinator can fail a target that found nothing
# with "context deadline exceeded" when a duration FUZZTIME ends on a busy machine
# (go.dev/issue/75804, fixed in 1.27). Everything else builds with the machine's Go.
FUZZ_GOTOOLCHAIN ?= go1.27.3

.PHONY: fuzz
# Each package's instrumented test binary is linked once (go test -c -fuzz), not once per
# target, and run in the package's directory, where a crasher lands, with go test's corpus cache.
fuzz: setup ## Run each fuzz target for FUZZTIME (default 60000x executions); found crashers land in testdata/fuzz.
	@set -e; mkdir -p $(BIN)/fuzz; \
	for pkg in $(sort $(foreach t,$(FUZZ_TARGETS),$(firstword $(subst :, ,$(t))))); do \
		GOTOOLCHAIN=$(FUZZ_GOTOOLCHAIN) go test -c -fuzz=. -o $(BIN)/fuzz/$$(echo $$pkg | tr / _).test ./$$pkg/; \
	done; \
	for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "fuzz $$pkg $$fn for $(FUZZTIME)"; \
		cache=$$(go env GOCACHE)/fuzz/$$(go list ./$$pkg); \
		(cd $$pkg && $(BIN)/fuzz/$$(echo $$pkg | tr / _).test -test.run='^$$' -test.fuzz="^$$fn\$$" -test.fuzztime=$(FUZZTIME) \
			-test.fuzzminimizetime=$(FUZZMINIMIZETIME) -test.fuzzcachedir=$$cache); \
	done

.PHONY: bench-import
bench-import: setup build ## Import a 4 GiB qcow2 (and gzip, xz, zstd, a VM artifact) over HTTP beside curl and qemu-img; prints the ratios.
	go run ./test/bench import

.PHONY: bench-copy
bench-copy: setup build ## Copy a 4 GiB disk between two importers as a clone source serves it to a writer (a host-assisted copy between nodes) beside curl and qemu-img; prints both sides' peak RSS.
	go run ./test/bench copy

.PHONY: bench-export
bench-export: setup build ## Export a 4 GiB disk to the bundled store beside qemu-img convert + aws s3 cp.
	go run ./test/bench export

.PHONY: bench-upload
bench-upload: setup tools build ## Upload a 4 GiB disk with kubectl diskpipe through the upload proxy beside aws s3 cp into the same store, then from the console's page in Chromium; prints the ratios and the proxy's, gateway's and tab's peak RSS.
	go run ./test/bench upload

.PHONY: bench-restore
bench-restore: setup build ## Restore a 4 GiB disk from a 4-layer backup chain in the bundled store beside aws s3 cp + qemu-img rebase and convert; prints the ratios, peak RSS and bytes written.
	go run ./test/bench restore

.PHONY: bench-controllers
bench-controllers: tools build ## Create 1,000 images and 5,000 DiskVolumes against envtest; prints objects/s and the manager's peak RSS.
	go run ./test/bench controllers

# CHAOS_FLAGS sizes the chaos run; .ci/run uses a small one, `make chaos` alone the full size
# (50 images, 100 disks, 10 exports, 20 manager kills, 10 pod kills, 2 store restarts).
CHAOS_FLAGS ?=

# CLUSTER=real runs the demo or the chaos suite on the real cluster (root; what make
# test-cluster uses); NODES=3 runs the chaos suite on three nodes, stopping their agents.
CLUSTER ?= local
CLUSTER_DEPS_local = setup tools build bootdisk
CLUSTER_DEPS_real = setup cluster-tools build image pause-image bootdisk

.PHONY: chaos
chaos: $(CLUSTER_DEPS_$(CLUSTER)) ## Import, clone and export at scale on the local cluster (CLUSTER=real: on a real node) while killing the manager, pods and the store; prints a table, fails when anything was lost or left over.
	$(if $(filter real,$(CLUSTER)),hack/setup.sh cluster)
	DISKPIPE_NODES=$(NODES) go run ./test/chaos -cluster=$(CLUSTER) $(CHAOS_FLAGS)

.PHONY: bench
bench: bench-import bench-copy bench-export bench-upload bench-restore bench-controllers ## Run every benchmark (bench-kubevirt and bench-fanout, which need root, apart).

.PHONY: bench-kubevirt
bench-kubevirt: ## Boot five VMs at once from one golden image under the real KubeVirt on the real node (root); prints each one's time and where it went.
	$(MAKE) test-cluster KUBEVIRT=1 E2E_LABELS='bench && !nodes'

.PHONY: bench-fanout
bench-fanout: ## Fan a golden image of 1 GiB out to twelve VMs on three real nodes (root), through replicas made on demand, pre-warmed replicas and host copies; prints the times and bytes of each.
	$(MAKE) test-cluster KUBEVIRT=1 NODES=3 E2E_LABELS='bench && nodes'

.PHONY: fuzz-imports
fuzz-imports: ## Run the whole-import fuzz targets for FUZZTIME each.
	$(MAKE) fuzz FUZZ_TARGETS="$(FUZZ_IMPORT_TARGETS)"


.PHONY: demo
demo: $(CLUSTER_DEPS_$(CLUSTER)) $(if $(filter real,$(CLUSTER)),kubevirt kubevirt-images) ## Run the whole pipeline on a local cluster (CLUSTER=real: on a real node, where KubeVirt boots the VM); DEMO_FLAGS=--keep keeps it running.
	$(if $(filter real,$(CLUSTER)),hack/setup.sh cluster)
	go run ./test/demo --cluster=$(CLUSTER) $(DEMO_FLAGS)

# Tools

# The tools, the Kubernetes binaries and KubeVirt are built through hack/cached: a clean clone on
# a machine that built one before copies it from ~/.cache/diskpipe/bin, keyed by the command,
# its prerequisites' contents and the toolchain, instead of linking it again. The tools are built
# with Go's default flags (CACHED); the Kubernetes binaries with this module's GOFLAGS
# (KUBE_CACHED_ALL), see test/tools. Commands that share packages are built by one `go build` (a
# grouped target): side by side under make -j, two builds would each compile what they share.
TOOL_GOFLAGS := -buildvcs=false
CACHED = GOFLAGS=$(TOOL_GOFLAGS) hack/cached $@ -- $^ --
CACHED_ALL = GOFLAGS=$(TOOL_GOFLAGS) hack/cached $(1) -- $^ --
KUBE_CACHED_ALL = hack/cached $(1) -- $^ --

$(CONTROLLER_GEN):
	$(CACHED) 'GOBIN=$(BIN) go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)'

$(CRD_REF_DOCS):
	$(CACHED) 'GOBIN=$(BIN) go install github.com/elastic/crd-ref-docs@$(CRD_REF_DOCS_VERSION)'

$(HELM):
	$(CACHED) 'GOBIN=$(BIN) go install -ldflags "-X helm.sh/helm/v4/internal/version.version=$(HELM_VERSION)" helm.sh/helm/v4/cmd/helm@$(HELM_VERSION)'

$(GOLANGCI_LINT):
	$(CACHED) 'GOBIN=$(BIN) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)'

# kube-apiserver, etcd and kubectl come from test/tools, a module of their own so that
# k8s.io/kubernetes's dependency graph stays out of diskpipe's go.mod. Its go.mod pins every
# module a package of both builds comes from to diskpipe's version (hack/verify.sh checks it), and
# they are built with diskpipe's GOFLAGS, so that on a fresh machine the Kubernetes libraries,
# gRPC, etcd's client and the rest compile once, not once for the tests and once for the tools.
KUBE_LDFLAGS := -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
	-X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37

# After diskpipe's build (order only): side by side, both would compile what they share.
$(KUBE_BINS) &: test/tools/go.mod test/tools/go.sum test/tools/cmd/etcd/main.go | build
	$(call KUBE_CACHED_ALL,$(KUBE_BINS)) 'cd test/tools && go build -ldflags "$(KUBE_LDFLAGS)" -o $(BIN)/ \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl ./cmd/etcd'

# The real node's build and suite, and KubeVirt's build, apart from diskpipe's own.
include hack/make/node.mk hack/make/kubevirt.mk
