//go:build tools

// Package tools pins csi-provisioner.
package tools

import _ "github.com/kubernetes-csi/external-provisioner/v5/cmd/csi-provisioner"
