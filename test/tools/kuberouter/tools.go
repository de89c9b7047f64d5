//go:build tools

// Package tools pins kube-router's command.
package tools

import _ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
