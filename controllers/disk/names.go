package disk

import (
	"strings"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
)

// Condition types and reasons of disks, besides Ready and the importer's reasons.
const (
	ConditionCloneStrategy = "CloneStrategy"
	// ConditionCopySource: which volume a replica is copied from, and why (copySource).
	ConditionCopySource = "CopySource"

	reasonMade                  = "Made"
	reasonWaitingForConsumer    = "WaitingForFirstConsumer"
	reasonWaitingForBinding     = "WaitingForBinding"
	reasonTooSmall              = "TooSmall"
	reasonSizeRequired          = "SizeRequired"
	reasonNameTaken             = "NameTaken"
	reasonVolumeNotBound        = "VolumeNotBound"
	reasonSnapshotNotFound      = "SnapshotNotFound"
	reasonWaitingForCloneSource = "WaitingForCloneSource"
	// ReasonSourceUnreachable: the VM's pod was scheduled to a node the image's node-local
	// volume does not reach, where a CSI clone or restore of it cannot be made.
	ReasonSourceUnreachable = "SourceUnreachable"
)

// Annotations of the PVCs of a disk an importer pod fills.
const (
	// AnnotationPrime, on a disk's PVC, names the PVC of diskpipe's (the prime) whose volume
	// it is given once the importer has filled that.
	AnnotationPrime = "diskpipe.io/prime"
	// AnnotationFilled, on a prime PVC, says its volume holds the whole disk and how it was
	// made.
	AnnotationFilled = "diskpipe.io/filled"
)

// PrimeName names the PVC an importer pod fills for the disk of that UID.
func PrimeName(uid types.UID) string { return "prime-" + string(uid) }

// PrimeOf is the UID of the disk whose prime name is (PrimeName), false when name is none.
func PrimeOf(name string) (types.UID, bool) {
	uid, ok := strings.CutPrefix(name, "prime-")
	if _, err := uuid.Parse(uid); !ok || err != nil || len(uid) != 36 {
		return "", false
	}
	return types.UID(uid), true
}

// PopulateName is the name of the DiskVolume the populator makes to fill the claim of UID uid.
func PopulateName(uid types.UID) string { return "populate-" + string(uid) }

// AnnotationDeferredRevision is, on the claim of a disk deferred to its VM's node, the revision
// of the scheduled image it was planned from and sized for, which the populator copies.
const AnnotationDeferredRevision = "diskpipe.io/deferred-revision"

// Deferred says whether pvc is the claim of a disk deferred to its VM's node, which the
// populator fills there.
func Deferred(pvc *corev1.PersistentVolumeClaim) bool {
	ref := pvc.Spec.DataSourceRef
	return ref != nil && ref.APIGroup != nil && ((*ref.APIGroup == diskvolume.GroupVersion.Group && ref.Kind == "DiskVolume") ||
		(*ref.APIGroup == hypercloud.GroupVersion.Group && ref.Kind == "VirtualMachinePvc"))
}

// AnnotationBindImmediately on a disk of a class that binds at the first consumer asks for its
// volume now, not where its VM's pod is scheduled later (CDI's
// cdi.kubevirt.io/storage.bind.immediate.requested of a DataVolume).
const AnnotationBindImmediately = "diskpipe.io/bind-immediately"
