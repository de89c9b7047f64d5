package disk

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
)

// AnnotationCloneStrategy on a StorageClass names the clone strategy preferred for disks of
// that class; a disk's spec.cloneStrategy overrides it.
const AnnotationCloneStrategy = "diskpipe.io/clone-strategy"

// StrategyDefaults are the installation's preferences (the chart's cloneStrategy values),
// below a disk's spec.cloneStrategy and its StorageClass's annotation.
type StrategyDefaults struct {
	// Default is preferred where nothing else says; Automatic (or empty) lets diskpipe choose
	// (automatic, below).
	Default common.CloneStrategy `json:"default,omitempty"`
	// StorageClasses maps a StorageClass name to the strategy preferred for its disks.
	StorageClasses map[string]common.CloneStrategy `json:"storageClasses,omitempty"`
}

// Preferred returns the strategy preferred for disks of class (nil: unknown) before the
// disk's own spec.cloneStrategy: the class's annotation AnnotationCloneStrategy, else the
// installation's value for the class, else its default; "" where the one that says is
// Automatic, or nothing says (diskpipe chooses: automatic, below). An annotation that names no
// strategy is not read, and ignored says so ("" otherwise).
func (d StrategyDefaults) Preferred(class *storagev1.StorageClass) (s common.CloneStrategy, ignored string) {
	s = d.Default
	if class != nil {
		if v, ok := d.StorageClasses[class.Name]; ok {
			s = v
		}
		if v, ok := class.Annotations[AnnotationCloneStrategy]; ok {
			if slices.Contains(knownStrategies(), common.CloneStrategy(v)) {
				s = common.CloneStrategy(v)
			} else {
				ignored = fmt.Sprintf("the StorageClass %s's annotation %s, %q, names none of %v and is not read", class.Name, AnnotationCloneStrategy, v, knownStrategies())
			}
		}
	}
	if s == StrategyAutomatic {
		return "", ignored
	}
	return s, ignored
}

// StrategyAutomatic is the installation default that leaves the strategy to diskpipe.
const StrategyAutomatic common.CloneStrategy = "Automatic"

// knownStrategies are the strategies an installation, or a class, may prefer.
func knownStrategies() []common.CloneStrategy {
	return append([]common.CloneStrategy{StrategyAutomatic}, strategies...)
}

// Validate refuses a strategy diskpipe does not know.
func (d StrategyDefaults) Validate() error {
	all := knownStrategies()
	if d.Default != "" && !slices.Contains(all, d.Default) {
		return fmt.Errorf("cloneStrategy.default %q is not one of %v", d.Default, all)
	}
	for class, s := range d.StorageClasses {
		if !slices.Contains(all, s) {
			return fmt.Errorf("cloneStrategy.storageClasses[%s] %q is not one of %v", class, s, all)
		}
	}
	return nil
}

// Reasons of the CloneStrategy condition.
const (
	reasonPreferred = "Preferred"
	reasonFellBack  = "FellBack"
)

// cloneFacts are what decides which strategies can make a disk from a golden PVC.
type cloneFacts struct {
	sourceNamespace, targetNamespace string
	sourceClass, targetClass         string
	sourceMode, targetMode           corev1.PersistentVolumeMode
	// sourceDriver and targetDriver are the classes' provisioners; "" when unknown.
	sourceDriver, targetDriver string
	// snapshotClass is the VolumeSnapshotClass the image's volume is snapshotted with (of the
	// target's driver where Snapshot is possible); "" when there is none, and noSnapshotClass
	// says why.
	snapshotClass, noSnapshotClass string
	// unreachable says why the node the disk is wanted on cannot use the image's volume (a
	// node-local volume on another node, a zone's volume in another zone); "" when it can, or
	// the node is not known yet. nodeLocal: the volume is one node's, whose snapshots are
	// restored only there (a zone's are restored anywhere).
	unreachable string
	nodeLocal   bool
	// shared: the image's volume is bound and not node-local (shared storage, or a zone's,
	// whose snapshots are restored anywhere), whatever node the disk is wanted on; and the
	// image serves more than one disk (not a DataVolume's staging image).
	shared bool
	// snapshotFailed says why the image's golden VolumeSnapshot cannot be restored (its error);
	// "" when it is fine or not made yet.
	snapshotFailed string
}

var strategies = []common.CloneStrategy{common.CloneStrategyCSIClone, common.CloneStrategySnapshot, common.CloneStrategyHostAssisted}

// automatic is the strategy when nothing prefers one (preferred ""): a disk of an image whose
// volume is not node-local (shared storage: Ceph RBD, a SAN; or a zone's disks, whose snapshots
// are restored in any zone) is restored from the image's one golden VolumeSnapshot where its
// driver has a VolumeSnapshotClass (CDI's default too): one snapshot serves every disk of the
// image, where a CSI clone makes one of its own each time (Ceph RBD's clones of a volume
// snapshot it, and flatten past a depth). Elsewhere, and on node-local storage (whose snapshots
// are restored only on their node, and whose disks on other nodes are clones of the image's
// replica there), CSIClone first.
func automatic(f cloneFacts) common.CloneStrategy {
	if f.shared && f.cannot(common.CloneStrategySnapshot) == "" {
		return common.CloneStrategySnapshot
	}
	return common.CloneStrategyCSIClone
}

// snapshotDefault is the condition's message of a disk that automatic restores from the golden
// snapshot.
const snapshotDefault = "Snapshot of the image's golden VolumeSnapshot, the default on shared storage whose driver has a VolumeSnapshotClass: one snapshot serves every disk of the image"

// choose returns the first strategy, from preferred (automatic when "") down the order
// CSIClone, Snapshot, HostAssisted, that can make the disk, with the condition reason and a
// message that says why each one before it could not.
func choose(preferred common.CloneStrategy, f cloneFacts) (common.CloneStrategy, string, string) {
	auto := preferred == ""
	if auto {
		if automatic(f) == common.CloneStrategySnapshot {
			return common.CloneStrategySnapshot, reasonPreferred, snapshotDefault
		}
		preferred = common.CloneStrategyCSIClone
	}
	var why []string
	start := 0
	for i, s := range strategies {
		if s == preferred {
			start = i
		}
	}
	for _, s := range strategies[start:] {
		reason := f.cannot(s)
		if reason == "" && auto && f.shared && len(why) == 0 {
			// The default on shared storage, a restore, was not possible: the message says why.
			return s, reasonFellBack, fmt.Sprintf("%s, because %s is not possible: %s", s, common.CloneStrategySnapshot, f.cannot(common.CloneStrategySnapshot))
		}
		if reason == "" {
			msg := fmt.Sprintf("%s, as preferred", s)
			r := reasonPreferred
			if len(why) > 0 {
				msg, r = fmt.Sprintf("%s, because %s", s, strings.Join(why, "; ")), reasonFellBack
			}
			return s, r, msg
		}
		why = append(why, fmt.Sprintf("%s is not possible: %s", s, reason))
	}
	panic("HostAssisted is always possible")
}

// cannot says why strategy s cannot make the disk; "" when it can.
func (f cloneFacts) cannot(s common.CloneStrategy) string {
	if s == common.CloneStrategyHostAssisted {
		return ""
	}
	if f.unreachable != "" && (s == common.CloneStrategyCSIClone || f.nodeLocal) {
		// A CSI clone of a volume is made only where the volume is; a restore of a node-local
		// volume's snapshot only on its node.
		return f.unreachable
	}
	return f.cannotOnImageNode(s)
}

// cloneButForNode says whether a CSI clone could make the disk were the image's node-local
// volume on the disk's node: what a replica there makes possible.
func (f cloneFacts) cloneButForNode() bool {
	return f.unreachable != "" && f.nodeLocal && f.cannotOnImageNode(common.CloneStrategyCSIClone) == ""
}

// cannotOnImageNode says why strategy s (not HostAssisted) cannot make the disk even where the
// image's volume is reached; "" when it can there.
func (f cloneFacts) cannotOnImageNode(s common.CloneStrategy) string {
	switch {
	case f.sourceNamespace != f.targetNamespace:
		return fmt.Sprintf("the image is in namespace %s and the disk in %s", f.sourceNamespace, f.targetNamespace)
	case f.sourceMode != f.targetMode:
		return fmt.Sprintf("the image is a %s volume and the disk a %s volume", f.sourceMode, f.targetMode)
	case f.targetDriver == "":
		return fmt.Sprintf("the storage class %q does not exist or names no CSI driver", f.targetClass)
	}
	if s == common.CloneStrategyCSIClone {
		if f.sourceClass != f.targetClass {
			return fmt.Sprintf("the image's storage class is %q and the disk's %q", f.sourceClass, f.targetClass)
		}
		return ""
	}
	switch {
	case f.sourceDriver != f.targetDriver:
		return fmt.Sprintf("the image's driver is %q and the disk's %q", f.sourceDriver, f.targetDriver)
	case f.snapshotClass == "":
		return f.noSnapshotClass
	case f.snapshotFailed != "":
		return f.snapshotFailed
	}
	return ""
}

func modeOf(m *corev1.PersistentVolumeMode) corev1.PersistentVolumeMode {
	if m == nil {
		return corev1.PersistentVolumeFilesystem
	}
	return *m
}

func nameOf(sc *storagev1.StorageClass) string {
	if sc == nil {
		return ""
	}
	return sc.Name
}

func driverOf(sc *storagev1.StorageClass) string {
	if sc == nil {
		return ""
	}
	return sc.Provisioner
}
