//go:build tools

// Package tools pins KubeVirt's commands.
package tools

import (
	_ "kubevirt.io/kubevirt/cmd/virt-api"
	_ "kubevirt.io/kubevirt/cmd/virt-chroot"
	_ "kubevirt.io/kubevirt/cmd/virt-controller"
	_ "kubevirt.io/kubevirt/cmd/virt-exportproxy"
	_ "kubevirt.io/kubevirt/cmd/virt-exportserver"
	_ "kubevirt.io/kubevirt/cmd/virt-freezer"
	_ "kubevirt.io/kubevirt/cmd/virt-handler"
	_ "kubevirt.io/kubevirt/cmd/virt-launcher"
	_ "kubevirt.io/kubevirt/cmd/virt-launcher-monitor"
	_ "kubevirt.io/kubevirt/cmd/virt-operator"
	_ "kubevirt.io/kubevirt/cmd/virt-probe"
	_ "kubevirt.io/kubevirt/cmd/virt-tail"
	_ "kubevirt.io/kubevirt/cmd/virtctl"
	_ "kubevirt.io/kubevirt/tools/manifest-templator"
	_ "kubevirt.io/kubevirt/tools/resource-generator"
)
