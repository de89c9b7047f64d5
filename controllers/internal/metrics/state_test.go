package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
)

// TestOnlyTheLeaderReports: a standby replica, whose cache holds the same objects, reports no
// state, so sums over replicas count each object once (one step, with a fake client; the
// manager's tests scrape a real manager).
func TestOnlyTheLeaderReports(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{hypercloud.AddToScheme, virtualmachine.AddToScheme, diskvolume.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	vmi := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "img", Namespace: "vms"},
		Status: common.ImageStatus{Phase: common.PhaseImporting, Transfer: &common.Transfer{BytesDone: 1, BytesTotal: 2}}}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(vmi).Build()
	count := func(s *State) int {
		ch := make(chan prometheus.Metric, 100)
		s.Collect(ch)
		close(ch)
		n := 0
		for range ch {
			n++
		}
		return n
	}
	elected := make(chan struct{})
	s := &State{Reader: reader, Elected: elected}
	if n := count(s); n != 0 {
		t.Fatalf("a standby replica reported %d series", n)
	}
	close(elected)
	// diskpipe_objects, diskpipe_object_status, bytes done and total
	if n := count(s); n != 4 {
		t.Fatalf("the leader reported %d series, want 4", n)
	}
}
