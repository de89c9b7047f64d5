package cdi

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/disk"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/storage"
)

// cdiStrategies are diskpipe's clone strategies in CDI's words.
var cdiStrategies = map[common.CloneStrategy]cdiv1.CDICloneStrategy{
	common.CloneStrategyCSIClone:     cdiv1.CloneStrategyCsiClone,
	common.CloneStrategySnapshot:     cdiv1.CloneStrategySnapshot,
	common.CloneStrategyHostAssisted: cdiv1.CloneStrategyHostAssisted,
}

// defaultClaimProperties are a class's claim properties when its StorageProfile's spec names
// none: what every CSI driver offers.
var defaultClaimProperties = []cdiv1.ClaimPropertySet{{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
	VolumeMode: ptr.To(corev1.PersistentVolumeFilesystem)}}

// ProfileReconciler keeps a StorageProfile of each StorageClass's name, which the class owns:
// its status says the class's provisioner, the clone strategy diskpipe prefers for it and the
// claim properties a DataVolume's spec.storage is completed with; its spec (written by the
// cluster's administrator, as with CDI) overrides the last two.
type ProfileReconciler struct {
	client.Client
	Strategies disk.StrategyDefaults
}

// Reconcile makes or updates the class's StorageProfile.
func (r *ProfileReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	class := &storagev1.StorageClass{}
	if err := r.Get(ctx, req.NamespacedName, class); err != nil || !class.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, client.IgnoreNotFound(err) // the profile goes with its class
	}
	p := &cdiv1.StorageProfile{ObjectMeta: metav1.ObjectMeta{Name: class.Name, Labels: map[string]string{LabelManagedBy: managedBy}}}
	if err := owned.Create(ctx, r.Client, class, p); err != nil {
		return ctrl.Result{}, err
	}
	if min, ok := minimumSizes[provisionerKey(class)]; ok && p.Annotations[AnnMinimumSize] == "" {
		patch := client.MergeFrom(p.DeepCopy())
		metav1.SetMetaDataAnnotation(&p.ObjectMeta, AnnMinimumSize, min)
		if err := r.Patch(ctx, p, patch); err != nil {
			return ctrl.Result{}, err
		}
	}
	snapshotClass, err := r.snapshotClass(ctx, class, p.Spec.SnapshotClass)
	if err != nil {
		return ctrl.Result{}, err
	}
	base := p.DeepCopy()
	p.Status = ProfileStatus(class, p.Spec, r.Strategies, snapshotClass)
	// A VolumeSnapshotClass made later is found by the next look (they are not watched: the
	// snapshot API may not be installed).
	again := ctrl.Result{RequeueAfter: 10 * time.Minute}
	if equality.Semantic.DeepEqual(base.Status, p.Status) {
		return again, nil
	}
	return again, r.Status().Patch(ctx, p, client.MergeFrom(base))
}

// AnnMinimumSize is, on a StorageProfile, the smallest volume its storage makes: a
// DataVolume's disk asks for at least this much, as in CDI.
const AnnMinimumSize = "cdi.kubevirt.io/minimumSupportedPvcSize"

// AnnCDICloneStrategy is CDI's annotation of a StorageClass that says its clone strategy:
// copy, snapshot or csi-clone.
const AnnCDICloneStrategy = "cdi.kubevirt.io/clone-strategy"

// ProfileSnapshotClass is the engine's storage.SnapshotClasses.Named with CDI's API served:
// the VolumeSnapshotClass a class's StorageProfile names in spec.snapshotClass (CDI's rule for
// its snapshot clones, and what KubeVirt's VM snapshots read in the status), before the
// StorageClass's own annotation. c reads the StorageProfile; none, or one naming nothing,
// names nothing.
func ProfileSnapshotClass(c client.Reader) func(context.Context, *storagev1.StorageClass) (*string, string, error) {
	return func(ctx context.Context, class *storagev1.StorageClass) (*string, string, error) {
		p := &cdiv1.StorageProfile{}
		if err := c.Get(ctx, client.ObjectKey{Name: class.Name}, p); err != nil {
			if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
				return nil, "", nil
			}
			return nil, "", err
		}
		return p.Spec.SnapshotClass, profileWhere(class), nil
	}
}

func profileWhere(class *storagev1.StorageClass) string {
	return fmt.Sprintf("the StorageProfile %s's spec.snapshotClass", class.Name)
}

// snapshotClass is the VolumeSnapshotClass of class's StorageProfile, whose spec names named:
// as the engine chooses it (storage.SnapshotClasses), "" when there is none.
func (r *ProfileReconciler) snapshotClass(ctx context.Context, class *storagev1.StorageClass, named *string) (string, error) {
	classes := storage.SnapshotClasses{Reader: r.Client, Named: func(context.Context, *storagev1.StorageClass) (*string, string, error) {
		return named, profileWhere(class), nil
	}}
	name, _, err := classes.For(ctx, class)
	return name, err
}

// ProfileStatus is the status of class's StorageProfile of spec, whose VolumeSnapshotClass is
// snapshotClass ("" when it has none).
func ProfileStatus(class *storagev1.StorageClass, spec cdiv1.StorageProfileSpec, strategies disk.StrategyDefaults, snapshotClass string) cdiv1.StorageProfileStatus {
	preferred, _ := strategies.Preferred(class)
	st := cdiv1.StorageProfileStatus{StorageClass: &class.Name, Provisioner: &class.Provisioner, ClaimPropertySets: defaultClaimProperties,
		DataImportCronSourceFormat: spec.DataImportCronSourceFormat}
	if snapshotClass != "" {
		st.SnapshotClass = &snapshotClass
		if st.DataImportCronSourceFormat == nil && slices.Contains(snapshotSources, provisionerKey(class)) {
			st.DataImportCronSourceFormat = ptr.To(cdiv1.DataImportCronSourceFormatSnapshot)
		}
	}
	if sets := classProperties(class); len(sets) > 0 {
		st.ClaimPropertySets = sets
	}
	if s, ok := cdiStrategies[preferred]; ok {
		st.CloneStrategy = &s
	}
	if s, ok := class.Annotations[AnnCDICloneStrategy]; ok && slices.Contains(slices.Collect(maps.Values(cdiStrategies)), cdiv1.CDICloneStrategy(s)) {
		st.CloneStrategy = ptr.To(cdiv1.CDICloneStrategy(s))
	}
	if spec.CloneStrategy != nil {
		st.CloneStrategy = spec.CloneStrategy
	}
	if len(spec.ClaimPropertySets) > 0 {
		st.ClaimPropertySets = spec.ClaimPropertySets
	}
	return st
}

// diskStrategy is the clone strategy a StorageProfile's spec, or CDI's annotation of its class,
// asks for, in diskpipe's words (nil: none; diskpipe chooses).
func diskStrategy(p *cdiv1.StorageProfile, class *storagev1.StorageClass) *common.CloneStrategy {
	want := p.Spec.CloneStrategy
	if s, ok := class.Annotations[AnnCDICloneStrategy]; ok && want == nil {
		want = ptr.To(cdiv1.CDICloneStrategy(s))
	}
	if want == nil {
		return nil
	}
	for d, c := range cdiStrategies {
		if c == *want {
			return &d
		}
	}
	return nil
}

// claimPropertySet is the set of sets a DataVolume's spec.storage is completed from: the first
// of the volume mode it asks for, else the first (nil: none).
func claimPropertySet(sets []cdiv1.ClaimPropertySet, mode *corev1.PersistentVolumeMode) *cdiv1.ClaimPropertySet {
	for i := range sets {
		if mode != nil && sets[i].VolumeMode != nil && *sets[i].VolumeMode == *mode {
			return &sets[i]
		}
	}
	if len(sets) == 0 {
		return nil
	}
	return &sets[0]
}

// AnnDefaultVirtClass marks the StorageClass KubeVirt's disks take when they name none, before
// the cluster's default class.
const AnnDefaultVirtClass = "storageclass.kubevirt.io/is-default-virt-class"
