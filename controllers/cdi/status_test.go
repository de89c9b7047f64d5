package cdi

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
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
	// A DataSource names a PVC or a snapshot: CDI clones it, and says so.
	dv.Spec.Source, dv.Spec.SourceRef = nil, &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Name: "fedora"}
	if st := statusOf(dv, importing); st.Phase != cdiv1.CloneInProgress {
		t.Errorf("a copy of a DataSource's PVC: %s", st.Phase)
	}
	scheduled := &diskvolume.DiskVolume{Status: common.DiskStatus{Phase: common.PhasePending, PVCName: "root"}}
	if st := statusOf(dv, scheduled); st.Phase != cdiv1.CloneScheduled {
		t.Errorf("a copy of a DataSource's PVC, not begun: %s", st.Phase)
	}
}

// TestStatusOfImport: while its staging image imports, a DataVolume is ImportScheduled, then
// ImportInProgress (CloneInProgress for a pvc source) with the import's progress; an upload
// waiting for its bytes is UploadReady, the phase virtctl image-upload waits for; a failed
// import fails it with KubeVirt's "Error".
func TestStatusOfImport(t *testing.T) {
	dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Name: "root"}, Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Upload: &cdiv1.DataVolumeSourceUpload{}}}}
	img := func(phase common.Phase, reason, msg string, tr *common.Transfer) *hypercloud.VirtualMachineImage {
		return &hypercloud.VirtualMachineImage{Status: common.ImageStatus{Phase: phase, Transfer: tr, Retries: 1,
			Conditions: []metav1.Condition{{Type: common.ConditionReady, Status: metav1.ConditionFalse, Reason: reason, Message: msg}}}}
	}
	for _, c := range []struct {
		img  *hypercloud.VirtualMachineImage
		src  *cdiv1.DataVolumeSource
		want string
	}{
		{img(common.PhasePending, "WaitingForUpload", "upload the image", nil), nil, "UploadReady N/A WaitingForUpload"},
		{img(common.PhasePending, "Pending", "probing", nil), &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{}}, "ImportScheduled N/A Pending"},
		{img(common.PhaseImporting, "Running", "", &common.Transfer{BytesDone: 1, BytesTotal: 4}), &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{}},
			"ImportInProgress 25.00% Pending"},
		{img(common.PhaseImporting, "Running", "", nil), &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{}}, "CloneInProgress N/A Pending"},
		{img(common.PhaseFailed, "SourceNotFound", "404 Not Found", nil), nil, "Failed N/A SourceNotFound Error: 404 Not Found"},
	} {
		if c.src != nil {
			dv.Spec.Source = c.src
		}
		st := statusOfImport(dv, c.img)
		got := fmt.Sprintf("%s %s %s", st.Phase, st.Progress, findCondition(st.Conditions, cdiv1.DataVolumeBound).Reason)
		if st.Phase == cdiv1.Failed {
			r := findCondition(st.Conditions, cdiv1.DataVolumeRunning)
			got += " " + r.Reason + ": " + r.Message
		}
		if got != c.want || st.RestartCount != 1 {
			t.Errorf("got %q (restarts %d), want %q", got, st.RestartCount, c.want)
		}
	}
}

// TestStatusFrom: every phase a DataVolume takes, from what the controller saw.
func TestStatusFrom(t *testing.T) {
	dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Name: "root"}, Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{}}}}
	clone := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Name: "root"}, Spec: cdiv1.DataVolumeSpec{SourceRef: &cdiv1.DataVolumeSourceRef{Kind: "DataSource", Name: "fedora"}}}
	upload := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Name: "up"}, Spec: cdiv1.DataVolumeSpec{Source: &cdiv1.DataVolumeSource{Upload: &cdiv1.DataVolumeSourceUpload{}}}}
	claim := func(phase corev1.PersistentVolumeClaimPhase) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "root"}, Status: corev1.PersistentVolumeClaimStatus{Phase: phase}}
	}
	waitingForUpload := &hypercloud.VirtualMachineImage{Status: common.ImageStatus{Phase: common.PhasePending,
		Conditions: []metav1.Condition{{Type: common.ConditionReady, Status: metav1.ConditionFalse, Reason: "WaitingForUpload", Message: "upload it"}}}}
	disk := func(phase common.Phase) *diskvolume.DiskVolume {
		return &diskvolume.DiskVolume{Status: common.DiskStatus{Phase: phase, PVCName: "root"}}
	}
	for _, c := range []struct {
		what string
		dv   *cdiv1.DataVolume
		o    observed
		want string // phase progress claim Bound's reason / Running's status and reason
	}{
		{"a spec that cannot be served", dv, observed{refused: &refusal{reason: ReasonInvalidSpec, message: "no"}}, "Failed N/A root InvalidSpec/False InvalidSpec"},
		{"a child the API refused", dv, observed{refused: &refusal{reason: ReasonInvalidSpec, running: ReasonError, message: "bad URL"}}, "Failed N/A root InvalidSpec/False Error"},
		{"a name taken", dv, observed{refused: &refusal{reason: ReasonResourceExists, message: "taken"}}, "Pending N/A root ErrResourceExists/False ErrResourceExists"},
		{"a source not served yet", dv, observed{refused: &refusal{reason: ReasonSourceNotServed, message: "later"}}, "Pending N/A root SourceNotServed/False SourceNotServed"},
		{"a pre-populated claim missing", dv, observed{prePopulated: "old"}, "Pending N/A old ClaimNotFound/False ClaimNotFound"},
		{"a pre-populated claim", dv, observed{prePopulated: "root", claim: claim(corev1.ClaimBound)}, "Succeeded 100.0% root Bound/False PrePopulated"},
		{"a claim waiting for the VM's pod", dv, observed{waiting: cdiv1.WaitForFirstConsumer, waitingFor: "PVC root is bound"}, "WaitForFirstConsumer N/A root Pending/False WaitForFirstConsumer"},
		{"a claim deferred to the VM's node, waiting for it", dv, observed{waiting: cdiv1.PendingPopulation, waitingFor: "PVC root is filled on the VM's node"}, "PendingPopulation N/A root Pending/False WaitForFirstConsumer"},
		{"a claim deferred to the VM's node, filled there", dv, observed{disk: disk(common.PhaseReady), populating: "node-b"}, "ImportInProgress N/A root Pending/True "},
		{"a clone deferred to the VM's node, filled there", clone, observed{disk: disk(common.PhaseReady), populating: "node-b"}, "CloneInProgress N/A root Pending/True "},
		{"an import staged", dv, observed{img: &hypercloud.VirtualMachineImage{}}, "ImportScheduled N/A root Pending/False Pending"},
		{"a disk being made", dv, observed{disk: disk(common.PhaseImporting)}, "ImportInProgress N/A root Pending/True "},
		{"a disk made", dv, observed{disk: disk(common.PhaseReady)}, "Succeeded 100.0% root Bound/False Completed"},
		{"an upload's image not made yet", upload, observed{upload: true, claim: claim(corev1.ClaimPending), img: &hypercloud.VirtualMachineImage{}}, "UploadScheduled N/A up Pending/False Pending"},
		{"an upload waited for", upload, observed{upload: true, claim: claim(corev1.ClaimPending), img: waitingForUpload}, "UploadReady N/A up WaitingForUpload/False WaitingForUpload"},
		{"an upload in, its claim waiting for the VM's pod", upload, observed{waiting: cdiv1.PendingPopulation, waitingFor: "filled"}, "PendingPopulation N/A up Pending/False WaitForFirstConsumer"},
		{"an upload in, its claim being filled", upload, observed{upload: true, claim: claim(corev1.ClaimPending), disk: disk(common.PhaseReady)}, "ImportInProgress N/A up Pending/True "},
		{"an upload done", upload, observed{upload: true, claim: claim(corev1.ClaimBound)}, "Succeeded 100.0% up Bound/False Completed"},
	} {
		st := statusFrom(c.dv, c.o)
		bound, running := findCondition(st.Conditions, cdiv1.DataVolumeBound), findCondition(st.Conditions, cdiv1.DataVolumeRunning)
		got := fmt.Sprintf("%s %s %s %s/%s %s", st.Phase, st.Progress, st.ClaimName, bound.Reason, running.Status, running.Reason)
		if got != c.want {
			t.Errorf("%s: got %q, want %q", c.what, got, c.want)
		}
	}
}
