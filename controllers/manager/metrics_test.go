package manager_test

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/internal/ctrltest"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/test/testenv"
)

// TestOperationMetrics drives imports to success, to a permanent failure and through a retry,
// leaves one running and removes a golden PVC, then scrapes the manager's /metrics: the
// counters, the state gauges, and every metric the chart's alerts and dashboard use are there.
func TestOperationMetrics(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	h := startShared(t)
	addr, mgr := h.metricsAddr, h.mgr
	ns, err := env.CreateNamespace(ctx, "metrics")
	g.Expect(err).NotTo(HaveOccurred())
	image := func(name string, retry int32) *hypercloud.VirtualMachineImage {
		size := resource.MustParse("1Gi")
		v := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{HTTP: common.HTTPURL("https://images.example.com/" + name + ".qcow2")},
				Retry: ptr.To(common.RetryLimit(retry))}}
		v.Spec.Resources.Requests.Storage = &size
		g.Expect(env.Client.Create(ctx, v)).To(Succeed())
		return v
	}
	phaseOf := func(v *hypercloud.VirtualMachineImage) func() common.Phase {
		return func() common.Phase {
			_ = env.Client.Get(ctx, client.ObjectKeyFromObject(v), v)
			return v.Status.Phase
		}
	}
	ok, bad, flaky, running := image("ok", 0), image("bad", 0), image("flaky", 1), image("running", 0)
	ctrltest.Complete(t, env, ns, "vmim-ok-import-0", transfer.Result{BytesWritten: 3 << 20, DurationSeconds: 42, VirtualSize: 1 << 30})
	ctrltest.Kubelet(t, env, ns, "vmim-bad-import-0", corev1.PodFailed,
		&transfer.Result{Reason: transfer.ReasonSourceNotFound, Message: "404 Not Found"}, transfer.ExitFailed)
	ctrltest.Kubelet(t, env, ns, "vmim-flaky-import-0", corev1.PodFailed,
		&transfer.Result{Reason: transfer.ReasonSourceUnavailable, Transient: true, Message: "connection reset"}, transfer.ExitTransient)
	ctrltest.Complete(t, env, ns, "vmim-flaky-import-1", transfer.Result{BytesWritten: 1 << 20, DurationSeconds: 3, VirtualSize: 1 << 30})
	mgr.Metrics <- "diskpipe_transfer_bytes_done 500\ndiskpipe_transfer_bytes_total 2000\n"
	ctrltest.Kubelet(t, env, ns, "vmim-running-import-0", corev1.PodRunning, nil, 0)
	// A scheduled image, checked once: its check is counted, and its out-of-date time served.
	nightly := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: ns},
		Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{Registry: &common.RegistrySource{URL: "docker://registry.example.com/nightly:latest"}},
			Schedule: &common.ImageSchedule{Cron: "@daily"}}}
	g.Expect(env.Client.Create(ctx, nightly)).To(Succeed())
	ctrltest.Complete(t, env, ns, "vmim-nightly-check-0", transfer.Result{Revision: "sha256:" + strings.Repeat("1", 64)})
	g.Eventually(phaseOf(ok), 20*time.Second).Should(Equal(common.PhaseReady))
	g.Eventually(phaseOf(flaky), 20*time.Second).Should(Equal(common.PhaseReady))
	g.Eventually(phaseOf(bad), 20*time.Second).Should(Equal(common.PhaseFailed))
	g.Eventually(func() *common.Transfer { phaseOf(running)(); return running.Status.Transfer }, 20*time.Second).ShouldNot(BeNil())
	// The golden PVC of "ok" is deleted (the pvc-protection finalizer holds it, as a pod would).
	g.Expect(env.Client.Delete(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ok.Status.PVCName}})).To(Succeed())

	var families map[string]*dto.MetricFamily
	value := func(name string, labels map[string]string) float64 {
		f := families[name]
		if f == nil {
			return -1
		}
		for _, m := range f.GetMetric() {
			match := true
			for _, l := range m.GetLabel() {
				if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
					match = false
				}
			}
			if match {
				switch {
				case m.Counter != nil:
					return m.GetCounter().GetValue()
				case m.Gauge != nil:
					return m.GetGauge().GetValue()
				case m.Histogram != nil:
					return float64(m.GetHistogram().GetSampleCount())
				}
			}
		}
		return -1
	}
	imp := map[string]string{"operation": "import", "source": "http", "namespace": ns}
	with := func(k, v string) map[string]string {
		m := map[string]string{k: v}
		for a, b := range imp {
			m[a] = b
		}
		return m
	}
	g.Eventually(func() (string, error) {
		_, body, err := get("http://" + addr + "/metrics")
		if err != nil {
			return "", err
		}
		tp := expfmt.NewTextParser(model.UTF8Validation)
		families, err = tp.TextToMetricFamilies(strings.NewReader(body))
		return fmt.Sprint(value("diskpipe_golden_image_missing", map[string]string{"namespace": ns, "name": "ok"}),
			value("diskpipe_objects", map[string]string{"namespace": ns, "phase": "Ready"}),
			value("diskpipe_operations_succeeded_total", map[string]string{"operation": "check", "source": "registry", "namespace": ns})), err
	}, 20*time.Second, 200*time.Millisecond).Should(Equal("1 2 1"))
	// @daily: out of date after the second midnight to come, if no check finds it up to date.
	g.Expect(value("diskpipe_scheduled_image_out_of_date_timestamp_seconds", map[string]string{"namespace": ns, "name": "nightly"})).
		To(BeNumerically(">", time.Now().Add(24*time.Hour).Unix()))
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"diskpipe_operations_started_total", imp, 5}, // ok, bad, flaky twice, running
		{"diskpipe_operations_succeeded_total", imp, 2},
		{"diskpipe_operations_failed_total", with("reason", "SourceNotFound"), 1},
		{"diskpipe_operations_retried_total", with("reason", "SourceUnavailable"), 1},
		{"diskpipe_operation_bytes_total", imp, 4 << 20},
		{"diskpipe_operation_duration_seconds", map[string]string{"operation": "import", "source": "http"}, 2},
		{"diskpipe_objects", map[string]string{"namespace": ns, "kind": "VirtualMachineImage", "phase": "Failed"}, 1},
		{"diskpipe_objects", map[string]string{"namespace": ns, "kind": "VirtualMachineImage", "phase": "Importing"}, 1},
		{"diskpipe_transfer_bytes_done", map[string]string{"namespace": ns, "name": "running"}, 500},
		{"diskpipe_transfer_bytes_total", map[string]string{"namespace": ns, "name": "running"}, 2000},
		{"diskpipe_golden_image_missing", map[string]string{"namespace": ns, "name": "flaky"}, 0},
		{"diskpipe_object_status", map[string]string{"namespace": ns, "name": "bad", "phase": "Failed", "reason": "SourceNotFound"}, 1},
		{"diskpipe_object_status", map[string]string{"namespace": ns, "name": "flaky", "phase": "Ready", "reason": "Imported"}, 1},
	} {
		g.Expect(value(c.name, c.labels)).To(Equal(c.want), "%s%v", c.name, c.labels)
	}

	// Every metric the chart's alerts and dashboard query is one this manager serves.
	used := chartMetricNames(t)
	g.Expect(used).To(ContainElements("diskpipe_operations_failed_total", "diskpipe_transfer_bytes_done", "workqueue_depth"))
	for _, name := range used {
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
		g.Expect(families).To(HaveKey(base), "the chart queries %s, which the manager does not serve", name)
	}
}

// chartMetricNames are the metric names in the chart's alert rules and dashboard queries.
func chartMetricNames(t *testing.T) []string {
	t.Helper()
	p := parser.NewParser(parser.Options{})
	var exprs []string
	rules, errs := rulefmt.ParseFile(testenv.Path("charts", "diskpipe", "files", "prometheus-rules.yaml"), false, model.UTF8Validation, p, nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	raw, err := os.ReadFile(testenv.Path("charts", "diskpipe", "files", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Targets []struct{ Expr string } `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	for _, panel := range dash.Panels {
		for _, tg := range panel.Targets {
			exprs = append(exprs, regexp.MustCompile(`\$\{?[a-z_]+\}?`).ReplaceAllString(tg.Expr, ".*"))
		}
	}
	seen := map[string]bool{}
	for _, e := range exprs {
		expr, err := p.ParseExpr(e)
		if err != nil {
			t.Fatalf("%q: %v", e, err)
		}
		parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok && vs.Name != "" {
				seen[vs.Name] = true
			}
			return nil
		})
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
