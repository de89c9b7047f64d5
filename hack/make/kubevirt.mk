# The real KubeVirt of the real node: its commands, its images and its operator's manifest,
# built from Go modules and Debian packages. Included by the Makefile.

##@ KubeVirt

# Real KubeVirt for the real node (test/tools/kubevirt, a module of its own): its commands,
# virtctl and the tool that renders the operator's manifest. Every one is built with the same
# flags, so that KubeVirt's packages and their Kubernetes libraries compile once: cgo on (the
# handler, the launcher and virt-chroot link Debian's libvirt, libvirt-dev from hack/setup.sh
# kubevirt, and the kernel's kvm.h), with Go's own resolver and user lookup (netgo, osusergo),
# so that the others use no cgo at all and link statically, as the operator, api and
# controller must on diskpipe's minimal base. libvirt-dev's version is part of the cache key.
KUBEVIRT_STATIC  := virt-operator virt-api virt-controller virtctl manifest-templator
KUBEVIRT_CGO     := virt-handler virt-launcher virt-launcher-monitor virt-chroot virt-freezer virt-probe virt-tail
KUBEVIRT_PKG_manifest-templator := tools/manifest-templator
KUBEVIRT_BINS    := $(addprefix $(BIN)/kubevirt/,$(KUBEVIRT_STATIC) $(KUBEVIRT_CGO))
# VirtualMachineExport's server and proxy, static too, built apart: the build above stays as it
# was cached (Go's cache holds the packages they share with it).
KUBEVIRT_EXPORT  := $(addprefix $(BIN)/kubevirt/,virt-exportserver virt-exportproxy)

.PHONY: kubevirt
kubevirt: $(KUBEVIRT_BINS) $(KUBEVIRT_EXPORT) ## Build KubeVirt v1.7.0's commands into bin/kubevirt/ (the real node's KubeVirt).

$(KUBEVIRT_BINS) &: test/tools/kubevirt/go.mod test/tools/kubevirt/go.sum | setup-kubevirt
	CACHE_KEY="libvirt-dev $$(dpkg-query -W -f='$${Version}' libvirt-dev)" \
		$(call CACHED_ALL,$(KUBEVIRT_BINS)) 'cd test/tools/kubevirt && CGO_ENABLED=1 go build -trimpath -tags netgo,osusergo -o $(BIN)/kubevirt/ \
		$(foreach c,$(KUBEVIRT_STATIC) $(KUBEVIRT_CGO),kubevirt.io/kubevirt/$(or $(KUBEVIRT_PKG_$(c)),cmd/$(c)))'
	@for c in $(KUBEVIRT_STATIC); do \
		file $(BIN)/kubevirt/$$c | grep -q 'statically linked' || { echo "$(BIN)/kubevirt/$$c is not statically linked" >&2; exit 1; }; \
	done

$(KUBEVIRT_EXPORT) &: test/tools/kubevirt/go.mod test/tools/kubevirt/go.sum | setup-kubevirt $(KUBEVIRT_BINS)
	CACHE_KEY="libvirt-dev $$(dpkg-query -W -f='$${Version}' libvirt-dev)" \
		$(call CACHED_ALL,$(KUBEVIRT_EXPORT)) 'cd test/tools/kubevirt && CGO_ENABLED=1 go build -trimpath -tags netgo,osusergo -o $(BIN)/kubevirt/ \
		kubevirt.io/kubevirt/cmd/virt-exportserver kubevirt.io/kubevirt/cmd/virt-exportproxy'
	@for c in $(KUBEVIRT_EXPORT); do \
		file $$c | grep -q 'statically linked' || { echo "$$c is not statically linked" >&2; exit 1; }; \
	done

.PHONY: setup-kubevirt
setup-kubevirt: setup
	hack/setup.sh kubevirt

# KubeVirt's images, as OCI archives in bin/kubevirt/ that the real node pushes to its
# registry: the operator, api, controller and the export server and proxy (VirtualMachineExport)
# on diskpipe's minimal base; the handler and the
# launcher on Debian root filesystems (test/kubevirt/rootfs.sh: libvirt, QEMU, the virtqemud
# shim). Each is rebuilt only when what it holds changes.
KUBEVIRT_VERSION := v1.7.0
KUBEVIRT_IMAGES  := virt-operator virt-api virt-controller virt-exportserver virt-exportproxy virt-handler virt-launcher
KUBEVIRT_FILES_virt-operator   := virt-operator
KUBEVIRT_FILES_virt-api        := virt-api
KUBEVIRT_FILES_virt-controller := virt-controller
KUBEVIRT_FILES_virt-exportserver := virt-exportserver
KUBEVIRT_FILES_virt-exportproxy  := virt-exportproxy
KUBEVIRT_FILES_virt-handler    := virt-handler virt-chroot
KUBEVIRT_FILES_virt-launcher   := virt-launcher virt-launcher-monitor virt-freezer virt-probe virt-tail node-labeller.sh container-disk
KUBEVIRT_IMAGE_ARGS_virt-handler  := --rootfs $(BIN)/kubevirt/handler-rootfs.tar --user 0:0
KUBEVIRT_IMAGE_ARGS_virt-launcher := --rootfs $(BIN)/kubevirt/launcher-rootfs.tar --user 0:0 --cap usr/bin/virt-launcher-monitor=cap_net_bind_service

.PHONY: kubevirt-images
kubevirt-images: $(foreach i,$(KUBEVIRT_IMAGES),$(BIN)/kubevirt/$(i)-image.tar) $(BIN)/kubevirt/kubevirt-operator.yaml ## Build KubeVirt's images for the real node into bin/kubevirt/.

# A root filesystem takes minutes of downloads: hack/cached keeps it under the hash of the
# script that made it.
$(BIN)/kubevirt/%-rootfs.tar: test/kubevirt/rootfs.sh | setup-kubevirt
	$(CACHED) 'test/kubevirt/rootfs.sh $* $@'

# The script virt-handler's init container runs from the launcher image: what libvirt says of
# the host's CPU, for the node's labels.
# (go mod download first: on a fresh machine, go list -m names no directory for a module that
# is not downloaded yet.)
KUBEVIRT_SOURCE = $$(cd test/tools/kubevirt && go mod download kubevirt.io/kubevirt && go list -m -f '{{.Dir}}' kubevirt.io/kubevirt)
$(BIN)/kubevirt/node-labeller.sh: test/tools/kubevirt/go.mod
	mkdir -p $(@D)
	src=$(KUBEVIRT_SOURCE) && cp "$$src/cmd/virt-launcher/node-labeller/node-labeller.sh" $@
	chmod 0755 $@

# KubeVirt's one C helper, which a hot-plugged volume's attachment pod runs from the launcher
# image (it holds the volume's mount open): static, as KubeVirt builds it.
$(BIN)/kubevirt/container-disk: test/tools/kubevirt/go.mod | setup
	mkdir -p $(@D)
	src=$(KUBEVIRT_SOURCE) && gcc -static -O2 -o $@ "$$src/cmd/container-disk-v2alpha/main.c"

$(BIN)/kubevirt/virt-handler-image.tar: $(BIN)/kubevirt/handler-rootfs.tar
$(BIN)/kubevirt/virt-launcher-image.tar: $(BIN)/kubevirt/launcher-rootfs.tar

define KUBEVIRT_IMAGE_RULE
$(BIN)/kubevirt/$(1)-image.tar: $(addprefix $(BIN)/kubevirt/,$(KUBEVIRT_FILES_$(1))) $(BIN)/image
	$$(CACHED) '$(BIN)/image build --out $$@ --ref kubevirt.diskpipe.test/$(1):$(KUBEVIRT_VERSION) --arch $(IMAGE_GOARCH) \
		--entrypoint /usr/bin/$(1) $(KUBEVIRT_IMAGE_ARGS_$(1)) $(foreach f,$(KUBEVIRT_FILES_$(1)),usr/bin/$(f)=$(BIN)/kubevirt/$(f))'
endef
$(foreach i,$(KUBEVIRT_IMAGES),$(eval $(call KUBEVIRT_IMAGE_RULE,$(i))))

# virt-operator's manifest as KubeVirt's release renders it (its CRD, RBAC and Deployment),
# naming the images as the real node's registry serves them.
KUBEVIRT_REGISTRY := 127.0.0.1:5055/kubevirt
$(BIN)/kubevirt/kubevirt-operator.yaml: $(BIN)/kubevirt/manifest-templator
	mod=$(KUBEVIRT_SOURCE) && \
	$(BIN)/kubevirt/manifest-templator --process-files --generated-manifests-dir $$mod/manifests/generated \
		--input-file $$mod/manifests/release/kubevirt-operator.yaml.in > $@.in && \
	$(BIN)/kubevirt/manifest-templator --process-vars --namespace kubevirt --container-prefix $(KUBEVIRT_REGISTRY) \
		--container-tag $(KUBEVIRT_VERSION) --image-pull-policy IfNotPresent --kubevirt-logo-path /dev/null --input-file $@.in > $@.tmp
	rm -f $@.in && mv $@.tmp $@
