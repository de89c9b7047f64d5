package cdi

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/disk"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
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
	base := p.DeepCopy()
	p.Status = ProfileStatus(class, p.Spec, r.Strategies)
	if equality.Semantic.DeepEqual(base.Status, p.Status) {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{}, r.Status().Patch(ctx, p, client.MergeFrom(base))
}

// ProfileStatus is the status of class's StorageProfile of spec.
func ProfileStatus(class *storagev1.StorageClass, spec cdiv1.StorageProfileSpec, strategies disk.StrategyDefaults) cdiv1.StorageProfileStatus {
	preferred := strategies.For(class)
	if s, ok := class.Annotations[disk.AnnotationCloneStrategy]; ok {
		preferred = common.CloneStrategy(s)
	}
	st := cdiv1.StorageProfileStatus{StorageClass: &class.Name, Provisioner: &class.Provisioner, ClaimPropertySets: defaultClaimProperties,
		SnapshotClass: spec.SnapshotClass, DataImportCronSourceFormat: spec.DataImportCronSourceFormat}
	if s, ok := cdiStrategies[preferred]; ok {
		st.CloneStrategy = &s
	}
	if spec.CloneStrategy != nil {
		st.CloneStrategy = spec.CloneStrategy
	}
	if len(spec.ClaimPropertySets) > 0 {
		st.ClaimPropertySets = spec.ClaimPropertySets
	}
	return st
}

// diskStrategy is the clone strategy a StorageProfile's spec asks for, in diskpipe's words
// (nil: none).
func diskStrategy(p *cdiv1.StorageProfile) *common.CloneStrategy {
	if p.Spec.CloneStrategy == nil {
		return nil
	}
	for d, c := range cdiStrategies {
		if c == *p.Spec.CloneStrategy {
			return &d
		}
	}
	return nil
}
