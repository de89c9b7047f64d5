package image

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// Condition reasons besides the importer's own (transfer.Reason).
const (
	reasonPending           = "Pending"
	reasonImporting         = "Importing"
	reasonRetrying          = "Retrying"
	reasonImported          = "Imported"
	reasonSizeRequired      = "SizeRequired"
	reasonUnsupportedSource = "UnsupportedSource"
)

func setReady(st *common.ImageStatus, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: common.ConditionReady, Status: status, Reason: reason, Message: msg})
}

func setFailed(st *common.ImageStatus, reason, msg string) {
	st.Phase = common.PhaseFailed
	setReady(st, metav1.ConditionFalse, reason, msg)
}

// setImported records a successful import.
func setImported(st *common.ImageStatus, res *transfer.Result, pvc string) {
	now := metav1.Now()
	st.Phase, st.Progress, st.PVCName, st.Format, st.Digest = common.PhaseReady, "100%", pvc, res.Format, res.Digest
	st.VirtualSize = resource.NewQuantity(res.VirtualSize, resource.BinarySI)
	st.StoredSize = resource.NewQuantity(res.BytesRead, resource.BinarySI)
	st.CompletionTime = &now
	if st.Transfer != nil {
		st.Transfer.BytesDone = st.Transfer.BytesTotal
	}
	setReady(st, metav1.ConditionTrue, reasonImported,
		fmt.Sprintf("imported into PVC %s in %.0f s", pvc, res.DurationSeconds))
}

// percent prints a transfer's progress, e.g. "42.5%".
func percent(t *common.Transfer) string {
	if t == nil || t.BytesTotal <= 0 {
		return ""
	}
	return fmt.Sprintf("%.1f%%", 100*float64(min(t.BytesDone, t.BytesTotal))/float64(t.BytesTotal))
}
