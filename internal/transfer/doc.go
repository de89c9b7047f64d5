// Package transfer is what the importer and the exporter share about a long copy: the
// stable reason codes of their failures, the JSON result they leave in the pod's termination
// message, their exit codes, and the progress they expose as Prometheus metrics and log lines.
// The controllers read the same types back, so the contract lives in one place.
package transfer
