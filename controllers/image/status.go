package image

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/internal/status"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// Condition reasons besides the importer's own (transfer.Reason) and the pod tracker's.
const (
	reasonImported         = "Imported"
	reasonWaitingForClones = "WaitingForClones"
)

// setImported records a successful import.
func setImported(st *common.ImageStatus, res *transfer.Result, pvc string) {
	now := metav1.Now()
	st.Phase, st.Progress, st.PVCName, st.Format, st.Digest, st.Revision = common.PhaseReady, "100%", pvc, res.Format, res.Digest, res.Revision
	st.VirtualSize = resource.NewQuantity(res.VirtualSize, resource.BinarySI)
	st.StoredSize = resource.NewQuantity(res.BytesRead, resource.BinarySI)
	st.CompletionTime = &now
	status.Work{Conditions: &st.Conditions}.SetReady(metav1.ConditionTrue, reasonImported,
		fmt.Sprintf("imported into PVC %s in %.0f s", pvc, res.DurationSeconds))
}
