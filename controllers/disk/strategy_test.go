package disk

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
)

// TestChoose is the strategy decision, case by case: each strategy is taken when possible,
// from the preferred one down, and the message names every reason to fall back.
func TestChoose(t *testing.T) {
	fs, blk := corev1.PersistentVolumeFilesystem, corev1.PersistentVolumeBlock
	same := cloneFacts{sourceNamespace: "a", targetNamespace: "a", sourceClass: "ceph", targetClass: "ceph",
		sourceMode: fs, targetMode: fs, sourceDriver: "rbd", targetDriver: "rbd", snapshotClass: "rbd-snap"}
	with := func(f func(*cloneFacts)) cloneFacts { c := same; f(&c); return c }
	for _, tc := range []struct {
		name      string
		preferred common.CloneStrategy
		facts     cloneFacts
		want      common.CloneStrategy
		reason    string
		msg       string
	}{
		{"csi clone", common.CloneStrategyCSIClone, same, common.CloneStrategyCSIClone, reasonPreferred, "CSIClone, as preferred"},
		{"snapshot preferred", common.CloneStrategySnapshot, same, common.CloneStrategySnapshot, reasonPreferred, "Snapshot, as preferred"},
		{"host-assisted preferred", common.CloneStrategyHostAssisted, same, common.CloneStrategyHostAssisted, reasonPreferred, "HostAssisted, as preferred"},
		{"other class, same driver", common.CloneStrategyCSIClone, with(func(c *cloneFacts) { c.targetClass = "ceph-fast" }),
			common.CloneStrategySnapshot, reasonFellBack,
			`Snapshot, because CSIClone is not possible: the image's storage class is "ceph" and the disk's "ceph-fast"`},
		{"no snapshot class", common.CloneStrategySnapshot, with(func(c *cloneFacts) {
			c.snapshotClass, c.noSnapshotClass = "", `no VolumeSnapshotClass for the driver "rbd"`
		}),
			common.CloneStrategyHostAssisted, reasonFellBack,
			`HostAssisted, because Snapshot is not possible: no VolumeSnapshotClass for the driver "rbd"`},
		{"other namespace", common.CloneStrategyCSIClone, with(func(c *cloneFacts) { c.targetNamespace = "b" }),
			common.CloneStrategyHostAssisted, reasonFellBack,
			"HostAssisted, because CSIClone is not possible: the image is in namespace a and the disk in b; " +
				"Snapshot is not possible: the image is in namespace a and the disk in b"},
		{"volume modes differ", common.CloneStrategyCSIClone, with(func(c *cloneFacts) { c.targetMode = blk }),
			common.CloneStrategyHostAssisted, reasonFellBack,
			"HostAssisted, because CSIClone is not possible: the image is a Filesystem volume and the disk a Block volume; " +
				"Snapshot is not possible: the image is a Filesystem volume and the disk a Block volume"},
		{"no CSI driver", common.CloneStrategyCSIClone, with(func(c *cloneFacts) { c.targetDriver, c.targetClass = "", "gone" }),
			common.CloneStrategyHostAssisted, reasonFellBack,
			`HostAssisted, because CSIClone is not possible: the storage class "gone" does not exist or names no CSI driver; ` +
				`Snapshot is not possible: the storage class "gone" does not exist or names no CSI driver`},
		{"node-local image on another node", common.CloneStrategyCSIClone,
			with(func(c *cloneFacts) {
				c.unreachable, c.nodeLocal = "the image's volume is on nodes with node in n1, and the disk is wanted on n2", true
			}),
			common.CloneStrategyHostAssisted, reasonFellBack,
			"HostAssisted, because CSIClone is not possible: the image's volume is on nodes with node in n1, and the disk is wanted on n2; " +
				"Snapshot is not possible: the image's volume is on nodes with node in n1, and the disk is wanted on n2"},
		{"zonal image in another zone", common.CloneStrategyCSIClone,
			with(func(c *cloneFacts) {
				c.unreachable = "the image's volume is on nodes with zone in a, and the disk is wanted on node b1"
			}),
			common.CloneStrategySnapshot, reasonFellBack,
			"Snapshot, because CSIClone is not possible: the image's volume is on nodes with zone in a, and the disk is wanted on node b1"},
		// Automatic: nothing prefers a strategy.
		{"automatic on shared storage with a snapshot class", "", with(func(c *cloneFacts) { c.shared = true }),
			common.CloneStrategySnapshot, reasonPreferred,
			"Snapshot of the image's golden VolumeSnapshot, the default on shared storage whose driver has a VolumeSnapshotClass: one snapshot serves every disk of the image"},
		{"automatic, a zone's volume in another zone", "", with(func(c *cloneFacts) {
			c.shared, c.unreachable = true, "the image's volume is on nodes with zone in a, and the disk is wanted on node b1"
		}),
			common.CloneStrategySnapshot, reasonPreferred,
			"Snapshot of the image's golden VolumeSnapshot, the default on shared storage whose driver has a VolumeSnapshotClass: one snapshot serves every disk of the image"},
		{"automatic on node-local storage", "", same, common.CloneStrategyCSIClone, reasonPreferred, "CSIClone, as preferred"},
		{"automatic on shared storage without a snapshot class", "", with(func(c *cloneFacts) {
			c.shared, c.snapshotClass, c.noSnapshotClass = true, "", `the StorageProfile ceph's spec.snapshotClass names the VolumeSnapshotClass "gone", which does not exist`
		}),
			common.CloneStrategyCSIClone, reasonFellBack,
			`CSIClone, because Snapshot is not possible: the StorageProfile ceph's spec.snapshotClass names the VolumeSnapshotClass "gone", which does not exist`},
		{"automatic, the golden snapshot failed", "", with(func(c *cloneFacts) {
			c.shared, c.snapshotFailed = true, "the image's golden VolumeSnapshot vmim-a-golden failed: no backup target"
		}),
			common.CloneStrategyCSIClone, reasonFellBack,
			"CSIClone, because Snapshot is not possible: the image's golden VolumeSnapshot vmim-a-golden failed: no backup target"},
		{"automatic on shared storage, another driver", "", with(func(c *cloneFacts) { c.shared, c.targetClass, c.targetDriver = true, "nfs", "nfs.csi" }),
			common.CloneStrategyHostAssisted, reasonFellBack,
			`HostAssisted, because CSIClone is not possible: the image's storage class is "ceph" and the disk's "nfs"; ` +
				`Snapshot is not possible: the image's driver is "rbd" and the disk's "nfs.csi"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, reason, msg := choose(tc.preferred, tc.facts)
			if got != tc.want || reason != tc.reason || msg != tc.msg {
				t.Errorf("choose(%s) = %s, %s, %q; want %s, %s, %q", tc.preferred, got, reason, msg, tc.want, tc.reason, tc.msg)
			}
		})
	}
}

// TestCloneButForNode: a replica is asked for exactly when a CSI clone fails only for the
// image's node: the same rule cannot applies, reachability aside.
func TestCloneButForNode(t *testing.T) {
	fs, blk := corev1.PersistentVolumeFilesystem, corev1.PersistentVolumeBlock
	away := cloneFacts{sourceNamespace: "a", targetNamespace: "a", sourceClass: "local", targetClass: "local",
		sourceMode: fs, targetMode: fs, sourceDriver: "lvm", targetDriver: "lvm", nodeLocal: true,
		unreachable: "the image's volume is on node n1, and the disk's pod on n2"}
	with := func(f func(*cloneFacts)) cloneFacts { c := away; f(&c); return c }
	for _, tc := range []struct {
		name  string
		facts cloneFacts
		want  bool
	}{
		{"only the node", away, true},
		{"reached", with(func(c *cloneFacts) { c.unreachable = "" }), false},
		{"network storage", with(func(c *cloneFacts) { c.nodeLocal = false }), false},
		{"other namespace", with(func(c *cloneFacts) { c.targetNamespace = "b" }), false},
		{"other class", with(func(c *cloneFacts) { c.targetClass = "local-fast" }), false},
		{"other mode", with(func(c *cloneFacts) { c.targetMode = blk }), false},
		{"no driver", with(func(c *cloneFacts) { c.targetDriver = "" }), false},
	} {
		if got := tc.facts.cloneButForNode(); got != tc.want {
			t.Errorf("%s: cloneButForNode = %v, want %v", tc.name, got, tc.want)
		}
		reached := tc.facts
		reached.unreachable = ""
		if tc.want && reached.cannot(common.CloneStrategyCSIClone) != "" {
			t.Errorf("%s: a replica is asked for where a CSI clone would fail on the node too: %s", tc.name, reached.cannot(common.CloneStrategyCSIClone))
		}
	}
}

// TestPreferred: the class's annotation, else the installation's value for the class, else its
// default; Automatic at any of them leaves the choice to diskpipe (""), and an annotation that
// names no strategy is not read.
func TestPreferred(t *testing.T) {
	class := func(name, annotation string) *storagev1.StorageClass {
		sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if annotation != "" {
			sc.Annotations = map[string]string{AnnotationCloneStrategy: annotation}
		}
		return sc
	}
	chart := StrategyDefaults{Default: common.CloneStrategyCSIClone,
		StorageClasses: map[string]common.CloneStrategy{"ceph": StrategyAutomatic, "nfs": common.CloneStrategyHostAssisted}}
	for _, tc := range []struct {
		name     string
		defaults StrategyDefaults
		class    *storagev1.StorageClass
		want     common.CloneStrategy
	}{
		{"the default", chart, class("lvm", ""), common.CloneStrategyCSIClone},
		{"unknown class", chart, nil, common.CloneStrategyCSIClone},
		{"the class's value", chart, class("nfs", ""), common.CloneStrategyHostAssisted},
		{"the class's value: Automatic", chart, class("ceph", ""), ""},
		{"the annotation over the class's value", chart, class("nfs", "Snapshot"), common.CloneStrategySnapshot},
		{"the annotation: Automatic", chart, class("lvm", "Automatic"), ""},
		{"an annotation that names none", chart, class("nfs", "Rsync"), common.CloneStrategyHostAssisted},
		{"nothing says", StrategyDefaults{}, class("lvm", ""), ""},
		{"the default: Automatic", StrategyDefaults{Default: StrategyAutomatic}, class("lvm", ""), ""},
	} {
		got, ignored := tc.defaults.Preferred(tc.class)
		if got != tc.want {
			t.Errorf("%s: Preferred = %q, want %q", tc.name, got, tc.want)
		}
		if misnamed := tc.class != nil && tc.class.Annotations[AnnotationCloneStrategy] == "Rsync"; (ignored != "") != misnamed {
			t.Errorf("%s: ignored = %q", tc.name, ignored)
		}
	}
	if err := chart.Validate(); err != nil {
		t.Errorf("Automatic for a class: %v", err)
	}
}
