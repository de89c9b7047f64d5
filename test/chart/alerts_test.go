package chart

import (
	"encoding/json"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// promParser parses PromQL as Prometheus does.
var promParser = parser.NewParser(parser.Options{})

// ruleGroups parses the chart's alert rules with Prometheus's own rule file parser, which
// validates the expressions, durations and templates.
func ruleGroups(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	groups, errs := rulefmt.Parse(readFile(t, "charts", "diskpipe", "files", "prometheus-rules.yaml"), false,
		model.UTF8Validation, promParser, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatalf("the alert rules do not parse: %v", errs)
	}
	return groups
}

// TestPrometheusRule: the chart's PrometheusRule carries exactly the rule file.
func TestPrometheusRule(t *testing.T) {
	objs := render(t, "monitoring", "--set", "metrics.prometheusRule.enabled=true", "--show-only", "templates/monitoring.yaml")
	rule := find(objs, "PrometheusRule")
	if rule == nil {
		t.Fatal("no PrometheusRule")
	}
	// It is a PrometheusRule as Prometheus Operator's types define it, with no unknown field.
	var typed monitoringv1.PrometheusRule
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(rule.Object, &typed, true); err != nil {
		t.Fatalf("the PrometheusRule does not decode strictly: %v", err)
	}
	monitor := find(render(t, "monitoring", "--set", "metrics.serviceMonitor.enabled=true", "--show-only", "templates/monitoring.yaml"), "ServiceMonitor")
	var sm monitoringv1.ServiceMonitor
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(monitor.Object, &sm, true); err != nil {
		t.Fatalf("the ServiceMonitor does not decode strictly: %v", err)
	}
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "metrics" ||
		sm.Spec.Selector.MatchLabels["app.kubernetes.io/component"] != "manager" {
		t.Fatalf("the ServiceMonitor does not scrape the manager's metrics port: %+v", sm.Spec)
	}
	spec, _ := yaml.Marshal(rule.Object["spec"])
	groups, errs := rulefmt.Parse(spec, false, model.UTF8Validation, promParser, slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	want := ruleGroups(t)
	if len(groups.Groups) != len(want.Groups) || len(groups.Groups[0].Rules) != len(want.Groups[0].Rules) {
		t.Fatalf("the PrometheusRule has %d groups, the rule file %d", len(groups.Groups), len(want.Groups))
	}
}

// TestAlerts evaluates each alert with Prometheus's rule engine over made-up series, minute
// by minute as Prometheus would, and checks which alerts fire.
func TestAlerts(t *testing.T) {
	byName := map[string]rulefmt.Rule{}
	for _, g := range ruleGroups(t).Groups {
		for _, r := range g.Rules {
			byName[r.Alert] = r
		}
	}
	const img = `{kind="VirtualMachineImage",namespace="vms",name="centos"}`
	const op = `{namespace="vms",operation="import",source="http"`
	cases := []struct {
		name, alert, series string
		at                  time.Duration
		fires               bool
	}{
		{"five failures in an hour", "DiskpipeOperationsFailing",
			`diskpipe_operations_failed_total` + op + `,reason="NotFound"} 0 1 2 3 4 5x10`, 15 * time.Minute, true},
		{"two failures", "DiskpipeOperationsFailing",
			`diskpipe_operations_failed_total` + op + `,reason="NotFound"} 0 1 2x10`, 12 * time.Minute, false},
		{"retries and no success", "DiskpipeAttemptsFailing",
			`diskpipe_operations_retried_total` + op + `,reason="SourceUnavailable"} 0 1 2 3 4 5 6x10`, 16 * time.Minute, true},
		{"retries that end in a success", "DiskpipeAttemptsFailing",
			`diskpipe_operations_retried_total` + op + `,reason="SourceUnavailable"} 0 1 2 3 4 5 6x10
			 diskpipe_operations_succeeded_total` + op + `} 0x6 1x10`, 16 * time.Minute, false},
		{"no progress for 10 minutes", "DiskpipeTransferStalled",
			`diskpipe_transfer_bytes_done` + img + ` 0+1000x5 5000x20`, 20 * time.Minute, true},
		{"steady progress", "DiskpipeTransferStalled",
			`diskpipe_transfer_bytes_done` + img + ` 0+1000x25`, 20 * time.Minute, false},
		{"a transfer 5 minutes old", "DiskpipeTransferStalled",
			`diskpipe_transfer_bytes_done` + img + ` _x15 0x10`, 20 * time.Minute, false},
		{"golden PVC gone for 10 minutes", "DiskpipeGoldenImageMissing",
			`diskpipe_golden_image_missing` + img + ` 1x15`, 10 * time.Minute, true},
		{"golden PVC gone for 3 minutes", "DiskpipeGoldenImageMissing",
			`diskpipe_golden_image_missing` + img + ` 1x15`, 3 * time.Minute, false},
		{"golden PVC there", "DiskpipeGoldenImageMissing",
			`diskpipe_golden_image_missing` + img + ` 0x15`, 10 * time.Minute, false},
		// The out-of-date time is a timestamp: the series start at Unix time 0.
		{"out of date since minute 5", "DiskpipeScheduledImageOutOfDate",
			`diskpipe_scheduled_image_out_of_date_timestamp_seconds` + img + ` 300x30`, 25 * time.Minute, true},
		{"out of date for 10 minutes only", "DiskpipeScheduledImageOutOfDate",
			`diskpipe_scheduled_image_out_of_date_timestamp_seconds` + img + ` 300x30`, 15 * time.Minute, false},
		{"each check moves the time on", "DiskpipeScheduledImageOutOfDate",
			`diskpipe_scheduled_image_out_of_date_timestamp_seconds` + img + ` 600+60x30`, 30 * time.Minute, false},
	}
	tested := map[string]bool{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, ok := byName[c.alert]
			if !ok {
				t.Fatalf("no alert %s", c.alert)
			}
			tested[c.alert] = true
			expr, err := promParser.ParseExpr(r.Expr)
			if err != nil {
				t.Fatal(err)
			}
			store := promqltest.LoadedStorage(t, "load 1m\n  "+c.series)
			t.Cleanup(func() { _ = store.Close() })
			engine := promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery)
			rule := rules.NewAlertingRule(r.Alert, expr, time.Duration(r.For), 0, labels.FromMap(r.Labels),
				labels.FromMap(r.Annotations), labels.EmptyLabels(), "", false, slog.New(slog.DiscardHandler))
			query := rules.EngineQueryFunc(engine, store)
			for ts := time.Duration(0); ts <= c.at; ts += time.Minute {
				if _, err := rule.Eval(t.Context(), 0, time.Unix(0, 0).Add(ts), query, nil, 0); err != nil {
					t.Fatal(err)
				}
			}
			var firing []*rules.Alert
			for _, a := range rule.ActiveAlerts() {
				if a.State == rules.StateFiring {
					firing = append(firing, a)
				}
			}
			if got := len(firing) > 0; got != c.fires {
				t.Fatalf("%s firing=%v at %s, want %v", c.alert, got, c.at, c.fires)
			}
			for _, a := range firing {
				if a.Labels.Get("namespace") != "vms" || a.Annotations.Get("summary") == "" || strings.Contains(a.Annotations.Get("summary"), "<no value>") {
					t.Errorf("the alert lacks its namespace or a summary: %v %v", a.Labels, a.Annotations)
				}
				t.Logf("fires: %s", a.Annotations.Get("summary"))
			}
		})
	}
	for name := range byName {
		if !tested[name] {
			t.Errorf("alert %s has no test", name)
		}
	}
}

// TestDashboard: every query of the Grafana dashboard parses as PromQL, and the chart ships
// the file as it is.
func TestDashboard(t *testing.T) {
	raw := readFile(t, "charts", "diskpipe", "files", "grafana-dashboard.json")
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	variable := regexp.MustCompile(`\$\{?[a-z_]+\}?`)
	n := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			if _, err := promParser.ParseExpr(variable.ReplaceAllString(tg.Expr, ".*")); err != nil {
				t.Errorf("panel %q: %v", p.Title, err)
			}
			n++
		}
	}
	if n < 8 {
		t.Fatalf("only %d queries", n)
	}
	objs := render(t, "monitoring", "--set", "metrics.dashboard.enabled=true", "--show-only", "templates/monitoring.yaml")
	shipped, _, _ := unstructured.NestedString(find(objs, "ConfigMap").Object, "data", "diskpipe.json")
	if strings.TrimSpace(shipped) != strings.TrimSpace(string(raw)) {
		t.Fatal("the chart's dashboard ConfigMap differs from files/grafana-dashboard.json")
	}
}
