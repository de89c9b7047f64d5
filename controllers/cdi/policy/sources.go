package policy

import (
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/controllers/admission"
)

// SourceKinds are CDI's kinds whose source may be in another namespace, checked by diskpipe's
// sources webhook with CDI's rule (create on datavolumes/source there; KubeVirt's
// virt-controller has it, and KubeVirt checks the user who made the VM):
//   - a DataVolume made from another namespace's PVC, snapshot or DataSource;
//   - a DataSource naming another namespace's source: its status would otherwise tell anyone
//     whether a PVC or snapshot of any namespace exists, and whether it is ready.
//
// Both are checked on update too, when the update changes the source.
func SourceKinds() []admission.SourceKind {
	gv := cdiv1.SchemeGroupVersion
	return []admission.SourceKind{
		{Resource: gv.WithResource("datavolumes"), Kind: "DataVolume", Updates: true,
			New:    func() client.Object { return &cdiv1.DataVolume{} },
			Source: func(o client.Object) *admission.Source { return dataVolumeSource(o.(*cdiv1.DataVolume)) }},
		{Resource: gv.WithResource("datasources"), Kind: "DataSource", Updates: true,
			New:    func() client.Object { return &cdiv1.DataSource{} },
			Source: func(o client.Object) *admission.Source { return dataSourceSource(o.(*cdiv1.DataSource)) }},
	}
}

// dataVolumeSource is what a DataVolume is made from in another namespace than its own, if
// anything.
func dataVolumeSource(dv *cdiv1.DataVolume) *admission.Source {
	s := &admission.Source{}
	switch src, ref := dv.Spec.Source, dv.Spec.SourceRef; {
	case ref != nil && ref.Namespace != nil:
		s.Kind, s.Namespace, s.Name = "DataSource", *ref.Namespace, ref.Name
	case src != nil && src.PVC != nil:
		s.Kind, s.Namespace, s.Name = "PersistentVolumeClaim", src.PVC.Namespace, src.PVC.Name
	case src != nil && src.Snapshot != nil:
		s.Kind, s.Namespace, s.Name = "VolumeSnapshot", src.Snapshot.Namespace, src.Snapshot.Name
	}
	if s.Namespace == "" || s.Namespace == dv.Namespace {
		return nil
	}
	return s
}

// dataSourceSource is what a DataSource names in another namespace than its own, if anything.
func dataSourceSource(ds *cdiv1.DataSource) *admission.Source {
	s := &admission.Source{}
	switch src := ds.Spec.Source; {
	case src.PVC != nil:
		s.Kind, s.Namespace, s.Name = "PersistentVolumeClaim", src.PVC.Namespace, src.PVC.Name
	case src.Snapshot != nil:
		s.Kind, s.Namespace, s.Name = "VolumeSnapshot", src.Snapshot.Namespace, src.Snapshot.Name
	case src.DataSource != nil:
		s.Kind, s.Namespace, s.Name = "DataSource", src.DataSource.Namespace, src.DataSource.Name
	}
	if s.Namespace == "" || s.Namespace == ds.Namespace {
		return nil
	}
	return s
}
