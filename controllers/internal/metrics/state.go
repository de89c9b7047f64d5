package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
)

var (
	objectsDesc = prometheus.NewDesc("diskpipe_objects",
		"Images, disks and exports by kind, namespace and phase.", []string{"kind", LabelNamespace, "phase"}, nil)
	bytesDoneDesc = prometheus.NewDesc("diskpipe_transfer_bytes_done",
		"Progress of each running import, clone or export, from its pod.", []string{"kind", LabelNamespace, "name"}, nil)
	bytesTotalDesc = prometheus.NewDesc("diskpipe_transfer_bytes_total",
		"Size of each running import, clone or export, when known.", []string{"kind", LabelNamespace, "name"}, nil)
	statusDesc = prometheus.NewDesc("diskpipe_object_status",
		"1 for each image, disk and export, labelled with its phase and the reason of its Ready condition: which ones failed, and why.",
		[]string{"kind", LabelNamespace, "name", "phase", LabelReason}, nil)
	goldenMissingDesc = prometheus.NewDesc("diskpipe_golden_image_missing",
		"1 for each image that was Ready and whose golden PVC no longer exists.", []string{"kind", LabelNamespace, "name"}, nil)
	outOfDateDesc = prometheus.NewDesc("diskpipe_scheduled_image_out_of_date_timestamp_seconds",
		"For each scheduled image, when it counts as out of date unless a check finds it up to date before: the second scheduled check after it last was.",
		[]string{"kind", LabelNamespace, "name"}, nil)
)

// item is what the collector reads of one object.
type item struct {
	kind, namespace, name string
	phase                 common.Phase
	conditions            []metav1.Condition
	transfer              *common.Transfer
	goldenPVC             string // images only: the PVC a Ready image stands on
	outOfDate             *metav1.Time
}

// State collects the state of diskpipe's objects from reader (the manager's cache) when
// Prometheus scrapes: nothing is kept between scrapes, so nothing can drift. Only the leader
// reports, so that sums over the manager's replicas count each object once (every replica
// has a cache; only the leader reconciles, and so counts operations).
type State struct {
	Reader client.Reader
	// Elected is closed once this replica leads (the manager's Elected()).
	Elected <-chan struct{}
}

var (
	installMu sync.Mutex
	installed *State
)

// Install makes reader the source of the state metrics in the manager's registry, in place
// of an earlier manager's (tests run several managers in one process, one after another),
// reported once elected is closed.
func Install(reader client.Reader, elected <-chan struct{}) error {
	installMu.Lock()
	defer installMu.Unlock()
	if installed != nil {
		ctrlmetrics.Registry.Unregister(installed)
	}
	installed = &State{Reader: reader, Elected: elected}
	return ctrlmetrics.Registry.Register(installed)
}

// Describe implements prometheus.Collector.
func (s *State) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{objectsDesc, statusDesc, bytesDoneDesc, bytesTotalDesc, goldenMissingDesc, outOfDateDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *State) Collect(ch chan<- prometheus.Metric) {
	select {
	case <-s.Elected:
	default:
		return // a standby replica: the leader reports
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	items, err := s.items(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(objectsDesc, err)
		return
	}
	type key struct{ kind, ns, phase string }
	counts := map[key]int{}
	for _, it := range items {
		phase := string(it.phase)
		if phase == "" {
			phase = string(common.PhasePending)
		}
		counts[key{it.kind, it.namespace, phase}]++
		reason := ""
		if c := meta.FindStatusCondition(it.conditions, common.ConditionReady); c != nil {
			reason = c.Reason
		}
		ch <- prometheus.MustNewConstMetric(statusDesc, prometheus.GaugeValue, 1, it.kind, it.namespace, it.name, phase, reason)
		if t := it.transfer; t != nil && running(it.phase) {
			ch <- prometheus.MustNewConstMetric(bytesDoneDesc, prometheus.GaugeValue, float64(t.BytesDone), it.kind, it.namespace, it.name)
			if t.BytesTotal > 0 {
				ch <- prometheus.MustNewConstMetric(bytesTotalDesc, prometheus.GaugeValue, float64(t.BytesTotal), it.kind, it.namespace, it.name)
			}
		}
		if it.goldenPVC != "" {
			pvc := &corev1.PersistentVolumeClaim{}
			err := s.Reader.Get(ctx, client.ObjectKey{Namespace: it.namespace, Name: it.goldenPVC}, pvc)
			missing := err != nil || pvc.DeletionTimestamp != nil
			ch <- prometheus.MustNewConstMetric(goldenMissingDesc, prometheus.GaugeValue, b2f(missing), it.kind, it.namespace, it.name)
		}
		if t := it.outOfDate; t != nil {
			ch <- prometheus.MustNewConstMetric(outOfDateDesc, prometheus.GaugeValue, float64(t.Unix()), it.kind, it.namespace, it.name)
		}
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(objectsDesc, prometheus.GaugeValue, float64(n), k.kind, k.ns, k.phase)
	}
}

func running(p common.Phase) bool {
	return p == common.PhaseImporting || p == common.PhaseCloning || p == common.PhaseExporting
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (s *State) items(ctx context.Context) ([]item, error) {
	var out []item
	image := func(kind string, o client.Object, st *common.ImageStatus) {
		it := item{kind: kind, namespace: o.GetNamespace(), name: o.GetName(), phase: st.Phase, conditions: st.Conditions, transfer: st.Transfer}
		if st.Phase == common.PhaseReady {
			it.goldenPVC = st.PVCName
		}
		if st.Schedule != nil {
			it.outOfDate = st.Schedule.OutOfDateTime
		}
		out = append(out, it)
	}
	disk := func(kind string, o client.Object, st *common.DiskStatus) {
		out = append(out, item{kind: kind, namespace: o.GetNamespace(), name: o.GetName(), phase: st.Phase, conditions: st.Conditions, transfer: st.Transfer})
	}
	var (
		vmis hypercloud.VirtualMachineImageList
		imts virtualmachine.ImageTemplateList
		pvcs hypercloud.VirtualMachinePvcList
		dvs  diskvolume.DiskVolumeList
		exps hypercloud.VirtualMachineVolumeExportList
	)
	for _, l := range []client.ObjectList{&vmis, &imts, &pvcs, &dvs, &exps} {
		if err := s.Reader.List(ctx, l); err != nil {
			return nil, err
		}
	}
	for i := range vmis.Items {
		image("VirtualMachineImage", &vmis.Items[i], &vmis.Items[i].Status)
	}
	for i := range imts.Items {
		image("ImageTemplate", &imts.Items[i], &imts.Items[i].Status)
	}
	for i := range pvcs.Items {
		disk("VirtualMachinePvc", &pvcs.Items[i], &pvcs.Items[i].Status)
	}
	for i := range dvs.Items {
		disk("DiskVolume", &dvs.Items[i], &dvs.Items[i].Status)
	}
	for i := range exps.Items {
		e := &exps.Items[i]
		out = append(out, item{kind: "VirtualMachineVolumeExport", namespace: e.Namespace, name: e.Name, phase: e.Status.Phase, conditions: e.Status.Conditions, transfer: e.Status.Transfer})
	}
	return out, nil
}
