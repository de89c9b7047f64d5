// Package metrics holds the manager's Prometheus metrics: counters of the work importer,
// exporter and clone pods do (recorded by importpod.Tracker as it sees each pod end), and a
// collector that reads the state of every image, disk and export from the cache at scrape
// time. charts/diskpipe/files holds the alerts and the dashboard built on them; the chart
// test checks every name they use against a real manager's /metrics.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Labels of the operation counters.
const (
	LabelOperation = "operation" // import, clone, export
	LabelSource    = "source"    // http, s3, registry, objectStore, upload, pvc, ...; blank, copy, grow; bundled, s3
	LabelNamespace = "namespace"
	LabelReason    = "reason" // a transfer reason: NotFound, ChecksumMismatch, ...
)

var (
	opLabels = []string{LabelOperation, LabelSource, LabelNamespace}

	started = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "diskpipe_operations_started_total",
		Help: "Attempts started: importer, clone and exporter pods seen running or pending.",
	}, opLabels)
	succeeded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "diskpipe_operations_succeeded_total",
		Help: "Attempts that ended with the work done.",
	}, opLabels)
	failed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "diskpipe_operations_failed_total",
		Help: "Work that failed for good (the object is Failed), by reason.",
	}, append(opLabels, LabelReason))
	retried = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "diskpipe_operations_retried_total",
		Help: "Attempts that failed transiently and are retried, by reason.",
	}, append(opLabels, LabelReason))
	bytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "diskpipe_operation_bytes_total",
		Help: "Bytes written by successful attempts (to volumes, or to the object store for exports).",
	}, opLabels)
	duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "diskpipe_operation_duration_seconds",
		Help:    "Duration of successful attempts, as the pods measured them.",
		Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400},
	}, []string{LabelOperation, LabelSource})
)

func init() {
	ctrlmetrics.Registry.MustRegister(started, succeeded, failed, retried, bytes, duration)
}

// Op is one kind of work in one namespace.
type Op struct {
	Operation, Source, Namespace string
}

func (o Op) values(extra ...string) []string {
	return append([]string{o.Operation, o.Source, o.Namespace}, extra...)
}

// Started counts an attempt.
func (o Op) Started() { started.WithLabelValues(o.values()...).Inc() }

// Succeeded counts a successful attempt, its bytes and its duration.
func (o Op) Succeeded(written int64, seconds float64) {
	succeeded.WithLabelValues(o.values()...).Inc()
	bytes.WithLabelValues(o.values()...).Add(float64(max(written, 0)))
	duration.WithLabelValues(o.Operation, o.Source).Observe(seconds)
}

// Retried counts an attempt that failed transiently and is tried again.
func (o Op) Retried(reason string) { retried.WithLabelValues(o.values(reason)...).Inc() }

// Failed counts work that failed for good.
func (o Op) Failed(reason string) { failed.WithLabelValues(o.values(reason)...).Inc() }
