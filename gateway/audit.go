package gateway

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the gateway's: requests by operation, resource and status code, and their
// durations.
type Metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewMetrics registers the gateway's metrics in reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "diskpipe_gateway_requests_total",
			Help: "Requests to the console's gateway, by operation, resource and status code."}, []string{"operation", "resource", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "diskpipe_gateway_request_duration_seconds",
			Help: "How long the gateway took to answer, by operation and resource.", Buckets: prometheus.DefBuckets}, []string{"operation", "resource"}),
	}
	reg.MustRegister(m.requests, m.duration)
	return m
}

// observe counts one request; a resource the gateway does not serve counts as "other", so
// that no caller makes series at will.
func (m *Metrics) observe(op, resource string, code int, took time.Duration) {
	if resources[resource] == nil {
		resource = "other"
	}
	m.requests.WithLabelValues(op, resource, strconv.Itoa(code)).Inc()
	m.duration.WithLabelValues(op, resource).Observe(took.Seconds())
}
