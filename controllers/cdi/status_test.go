package cdi

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
)

// TestStatusOf: a failed disk is a Failed DataVolume whose Running condition is False with
// reason "Error" and the disk's message, which is what KubeVirt shows as the VM's
// DataVolumeError; a transfer's progress reads as CDI writes it; a copy is a clone.
func TestStatusOf(t *testing.T) {
	dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Name: "root"}, Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}}}
	failed := &diskvolume.DiskVolume{Status: common.DiskStatus{Phase: common.PhaseFailed, Retries: 3, Conditions: []metav1.Condition{{Type: common.ConditionReady,
		Status: metav1.ConditionFalse, Reason: "ImportFailed", Message: "the source is not a disk image"}}}}
	st := statusOf(dv, failed)
	running := findCondition(st.Conditions, cdiv1.DataVolumeRunning)
	if st.Phase != cdiv1.Failed || st.RestartCount != 3 || running == nil || running.Status != corev1.ConditionFalse || running.Reason != "Error" ||
		running.Message != "the source is not a disk image" {
		t.Errorf("a failed disk: %+v", st)
	}
	importing := &diskvolume.DiskVolume{Status: common.DiskStatus{Phase: common.PhaseImporting, Transfer: &common.Transfer{BytesDone: 421, BytesTotal: 1000}}}
	if st := statusOf(dv, importing); st.Phase != cdiv1.ImportInProgress || st.Progress != "42.10%" {
		t.Errorf("an import: %s %s", st.Phase, st.Progress)
	}
	dv.Spec.Source = &cdiv1.DataVolumeSource{Snapshot: &cdiv1.DataVolumeSourceSnapshot{Name: "s"}}
	if st := statusOf(dv, importing); st.Phase != cdiv1.CloneInProgress {
		t.Errorf("a restore: %s", st.Phase)
	}
}
