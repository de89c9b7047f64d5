package cdi

import (
	"cmp"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
)

// # A DataVolume's status
//
// The controller looks (observe, observeUpload: children made if missing, the claim, the
// staging image) and says what it saw in an observed; statusFrom, below, turns that into the
// DataVolume's phase, progress and conditions, as CDI writes them. Every phase a DataVolume
// takes is decided here and nowhere else.

// observed is what the controller saw of a DataVolume, from which its status follows.
type observed struct {
	// refused says why it cannot be made: a spec that cannot be served (InvalidSpec: it
	// fails), a source not served yet, a name another object holds.
	refused *refusal
	// prePopulated names the claim of a DataVolume whose claim was whole before it (CDI's
	// annotation, or a claim adopted); claim is that claim, nil while there is none.
	prePopulated string
	claim        *corev1.PersistentVolumeClaim
	// waiting is the phase of a DataVolume whose claim waits for its first consumer, the VM's
	// pod (WaitForFirstConsumer, PendingPopulation); waitingFor what happens then.
	waiting    cdiv1.DataVolumePhase
	waitingFor string
	// upload: the DataVolume takes an upload, into claim, staged by img and written by disk
	// (the populator's) once the upload is in.
	upload bool
	// img is the image that stages the source while it is not Ready.
	img *hypercloud.VirtualMachineImage
	// disk makes the claim (or fills an upload's).
	disk *diskvolume.DiskVolume
	// populating is the node a claim deferred to its VM's node is being filled on.
	populating string
}

// statusFrom is the status of dv, which the controller saw as o.
func statusFrom(dv *cdiv1.DataVolume, o observed) cdiv1.DataVolumeStatus {
	st := cdiv1.DataVolumeStatus{ClaimName: dv.Name, Phase: cdiv1.Pending, Progress: "N/A"}
	switch {
	case o.refused != nil:
		r := o.refused
		st.Conditions = conditions(r.reason, r.message, corev1.ConditionFalse, cmp.Or(r.running, r.reason), r.message)
		if r.reason == ReasonInvalidSpec {
			st.Phase = cdiv1.Failed
		}
	case o.prePopulated != "":
		st.ClaimName = o.prePopulated
		if o.claim == nil {
			msg := fmt.Sprintf("the DataVolume is marked %s=%s, and no PVC %s exists", annPrePopulated, o.prePopulated, o.prePopulated)
			st.Conditions = conditions(ReasonClaimNotFound, msg, corev1.ConditionFalse, ReasonClaimNotFound, msg)
			break
		}
		st.Phase, st.Progress = cdiv1.Succeeded, "100.0%"
		st.Conditions = doneConditions(boundCondition(o.claim), ReasonPrePopulated, ReasonPrePopulated)
	case o.waiting != "":
		return waitingStatus(dv, o.waiting, o.waitingFor)
	case o.populating != "":
		return populatingStatus(dv, o.populating)
	case o.upload:
		return uploadStatus(dv, o)
	case o.img != nil:
		return statusOfImport(dv, o.img)
	default:
		return statusOf(dv, o.disk)
	}
	return st
}

// uploadStatus is the status of a DataVolume of source upload: UploadScheduled, then
// UploadReady while the staging image waits for the bytes, then ImportInProgress while its
// claim is filled, Succeeded once the claim is bound.
func uploadStatus(dv *cdiv1.DataVolume, o observed) cdiv1.DataVolumeStatus {
	if o.claim != nil && o.claim.Status.Phase == corev1.ClaimBound {
		return cdiv1.DataVolumeStatus{ClaimName: dv.Name, Phase: cdiv1.Succeeded, Progress: "100.0%",
			Conditions: doneConditions(boundCondition(o.claim), "", ReasonCompleted)}
	}
	if o.disk == nil {
		st := statusOfImport(dv, cmp.Or(o.img, &hypercloud.VirtualMachineImage{})) // not made yet: Pending
		if st.Phase == cdiv1.ImportScheduled {
			st.Phase = cdiv1.UploadScheduled
		}
		return st
	}
	st := statusOf(dv, o.disk)
	if st.Phase == cdiv1.Succeeded || st.Phase == cdiv1.Pending {
		// Written, or not begun: either way the claim is not bound yet.
		msg := "the upload is in; PVC " + dv.Name + " is being filled from it"
		st.Phase, st.Progress = cdiv1.ImportInProgress, "N/A"
		st.Conditions = conditions(ReasonPending, msg, corev1.ConditionTrue, "", "")
	}
	return st
}

// waitingStatus is the status, in phase, of a DataVolume whose claim waits for its first
// consumer, the VM's pod; what says what happens to the claim then.
func waitingStatus(dv *cdiv1.DataVolume, phase cdiv1.DataVolumePhase, what string) cdiv1.DataVolumeStatus {
	msg := what + " when its first consumer, the VM's pod, is scheduled (StorageClass volumeBindingMode WaitForFirstConsumer)"
	return cdiv1.DataVolumeStatus{ClaimName: dv.Name, Phase: phase, Progress: "N/A",
		Conditions: conditions(ReasonPending, msg, corev1.ConditionFalse, ReasonWaitForFirstConsumer, msg)}
}

// populatingStatus is the status of a DataVolume whose claim, deferred to its VM's node, is
// being filled on node: CDI's phase of the copy (its populators go from PendingPopulation to
// the copy's phases), not Succeeded before the claim is bound.
func populatingStatus(dv *cdiv1.DataVolume, node string) cdiv1.DataVolumeStatus {
	phase := cdiv1.ImportInProgress
	if clones(dv) {
		phase = cdiv1.CloneInProgress
	}
	msg := fmt.Sprintf("PVC %s is being filled on node %s, where the VM's pod was scheduled (the claim's events say how)", dv.Name, node)
	return cdiv1.DataVolumeStatus{ClaimName: dv.Name, Phase: phase, Progress: "N/A",
		Conditions: conditions(ReasonPending, msg, corev1.ConditionTrue, "", msg)}
}

// clones says whether CDI would clone dv's bytes (its phases CloneScheduled and
// CloneInProgress): a pvc or snapshot source, or a DataSource, which names one of the two.
func clones(dv *cdiv1.DataVolume) bool {
	src := dv.Spec.Source
	return dv.Spec.SourceRef != nil || src != nil && (src.PVC != nil || src.Snapshot != nil)
}

// statusOf is the status of a DataVolume made by disk.
func statusOf(dv *cdiv1.DataVolume, disk *diskvolume.DiskVolume) cdiv1.DataVolumeStatus {
	ds := disk.Status
	st := cdiv1.DataVolumeStatus{ClaimName: dv.Name, RestartCount: ds.Retries, Progress: progress(ds)}
	ready := meta.FindStatusCondition(ds.Conditions, common.ConditionReady)
	why, msg := ReasonPending, "PVC "+dv.Name+" Pending"
	if ready != nil && ready.Message != "" {
		why, msg = ready.Reason, ready.Message
	}
	copying := clones(dv)
	switch ds.Phase {
	case common.PhaseReady:
		st.Phase = cdiv1.Succeeded
		st.Conditions = doneConditions(cdiv1.DataVolumeCondition{Type: cdiv1.DataVolumeBound, Status: corev1.ConditionTrue, Reason: ReasonBound,
			Message: "PVC " + dv.Name + " Bound"}, "", ReasonCompleted)
		return st
	case common.PhaseFailed:
		st.Phase = cdiv1.Failed
		st.Conditions = conditions(why, msg, corev1.ConditionFalse, ReasonError, msg)
		return st
	case common.PhaseImporting, common.PhaseCloning:
		st.Phase = cdiv1.ImportInProgress
		if copying {
			st.Phase = cdiv1.CloneInProgress
		}
		st.Conditions = conditions(ReasonPending, "PVC "+dv.Name+" Pending", corev1.ConditionTrue, "", "")
		return st
	default:
		st.Phase = cdiv1.Pending
		if ds.PVCName != "" {
			st.Phase = cdiv1.ImportScheduled
			if copying {
				st.Phase = cdiv1.CloneScheduled
			}
		}
		st.Conditions = conditions(why, msg, corev1.ConditionFalse, why, msg)
		return st
	}
}

// statusOfImport is the status of a DataVolume whose source img is still being imported.
func statusOfImport(dv *cdiv1.DataVolume, img *hypercloud.VirtualMachineImage) cdiv1.DataVolumeStatus {
	is := img.Status
	st := cdiv1.DataVolumeStatus{ClaimName: dv.Name, RestartCount: is.Retries, Progress: progressOf(is.Transfer)}
	why, msg := ReasonPending, "PVC "+dv.Name+" Pending"
	if ready := meta.FindStatusCondition(is.Conditions, common.ConditionReady); ready != nil && ready.Message != "" {
		why, msg = ready.Reason, ready.Message
	}
	switch is.Phase {
	case common.PhaseFailed:
		st.Phase = cdiv1.Failed
		st.Conditions = conditions(why, msg, corev1.ConditionFalse, ReasonError, msg)
	case common.PhaseImporting:
		st.Phase = cdiv1.ImportInProgress
		if clones(dv) {
			st.Phase = cdiv1.CloneInProgress
		}
		st.Conditions = conditions(ReasonPending, "PVC "+dv.Name+" Pending", corev1.ConditionTrue, "", "")
	default:
		st.Phase = cdiv1.ImportScheduled
		if why == goldenimage.ReasonWaitingForUpload {
			// virtctl image-upload sends the image once it reads this phase.
			st.Phase = cdiv1.UploadReady
		}
		st.Conditions = conditions(why, msg, corev1.ConditionFalse, why, msg)
	}
	return st
}

// progress is a disk's progress as CDI writes it: "42.10%", "N/A" when unknown.
func progress(ds common.DiskStatus) cdiv1.DataVolumeProgress {
	if ds.Phase == common.PhaseReady {
		return "100.0%"
	}
	return progressOf(ds.Transfer)
}

// progressOf is a transfer's progress as CDI writes it: "42.10%", "N/A" when unknown.
func progressOf(t *common.Transfer) cdiv1.DataVolumeProgress {
	if t != nil && t.BytesTotal > 0 {
		return cdiv1.DataVolumeProgress(fmt.Sprintf("%.2f%%", float64(t.BytesDone)*100/float64(t.BytesTotal)))
	}
	return "N/A"
}

// conditions are a DataVolume's Bound, Ready and Running conditions while it is not ready
// (its claim is not bound before then).
func conditions(boundReason, boundMsg string, running corev1.ConditionStatus, runningReason, runningMsg string) []cdiv1.DataVolumeCondition {
	return []cdiv1.DataVolumeCondition{
		{Type: cdiv1.DataVolumeBound, Status: corev1.ConditionFalse, Reason: boundReason, Message: boundMsg},
		{Type: cdiv1.DataVolumeReady, Status: corev1.ConditionFalse},
		{Type: cdiv1.DataVolumeRunning, Status: running, Reason: runningReason, Message: runningMsg},
	}
}

// doneConditions are a DataVolume's conditions once its disk is whole: bound is its Bound
// condition, readyReason and runningReason the reasons of Ready (True) and Running (False).
func doneConditions(bound cdiv1.DataVolumeCondition, readyReason, runningReason string) []cdiv1.DataVolumeCondition {
	return []cdiv1.DataVolumeCondition{bound, {Type: cdiv1.DataVolumeReady, Status: corev1.ConditionTrue, Reason: readyReason},
		{Type: cdiv1.DataVolumeRunning, Status: corev1.ConditionFalse, Reason: runningReason}}
}

func boundCondition(pvc *corev1.PersistentVolumeClaim) cdiv1.DataVolumeCondition {
	if pvc.Status.Phase == corev1.ClaimBound {
		return cdiv1.DataVolumeCondition{Type: cdiv1.DataVolumeBound, Status: corev1.ConditionTrue, Reason: ReasonBound, Message: "PVC " + pvc.Name + " Bound"}
	}
	return cdiv1.DataVolumeCondition{Type: cdiv1.DataVolumeBound, Status: corev1.ConditionFalse, Reason: string(pvc.Status.Phase),
		Message: "PVC " + pvc.Name + " " + string(pvc.Status.Phase)}
}

func findCondition(cs []cdiv1.DataVolumeCondition, t cdiv1.DataVolumeConditionType) *cdiv1.DataVolumeCondition {
	for i := range cs {
		if cs[i].Type == t {
			return &cs[i]
		}
	}
	return nil
}
