package cdi

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
)

// phaseEvent is the event CDI records on a DataVolume as it enters phase, in CDI's reasons and
// words (ImportScheduled "Import into root scheduled", CloneSucceeded, UploadReady, ...), which
// tools and people watch; "" for a phase CDI records none for.
func phaseEvent(dv *cdiv1.DataVolume, phase cdiv1.DataVolumePhase) (typ, reason, note string) {
	claim := dv.Name
	kind := "Import"
	switch {
	case dv.Spec.Source != nil && dv.Spec.Source.Upload != nil:
		kind = "Upload"
	case clones(dv):
		kind = "Clone"
	}
	from := cloneSource(dv)
	notes := map[string]map[cdiv1.DataVolumePhase]string{
		"Import": {cdiv1.ImportScheduled: "Import into %[1]s scheduled", cdiv1.ImportInProgress: "Import into %[1]s in progress",
			cdiv1.Succeeded: "Successfully imported into PVC %[1]s", cdiv1.Failed: "Failed to import into PVC %[1]s"},
		"Upload": {cdiv1.UploadScheduled: "Upload into %[1]s scheduled", cdiv1.UploadReady: "Upload into %[1]s ready",
			cdiv1.Succeeded: "Successfully uploaded into %[1]s", cdiv1.Failed: "Upload into %[1]s failed"},
		"Clone": {cdiv1.CloneScheduled: "Cloning from %[2]s into %[3]s/%[1]s scheduled", cdiv1.CloneInProgress: "Cloning from %[2]s into %[3]s/%[1]s in progress",
			cdiv1.Succeeded: "Successfully cloned from %[2]s into %[3]s/%[1]s", cdiv1.Failed: "Cloning from %[2]s into %[3]s/%[1]s failed"},
	}
	format, ok := notes[kind][phase]
	if !ok {
		return "", "", ""
	}
	typ, reason = corev1.EventTypeNormal, kind+string(phase)
	switch phase {
	case cdiv1.Succeeded:
		reason = kind + "Succeeded"
	case cdiv1.Failed:
		typ, reason = corev1.EventTypeWarning, kind+"Failed"
	case cdiv1.ImportScheduled, cdiv1.ImportInProgress, cdiv1.CloneScheduled, cdiv1.CloneInProgress,
		cdiv1.UploadScheduled, cdiv1.UploadReady:
		reason = string(phase)
	}
	return typ, reason, fmt.Sprintf(format, claim, from, dv.Namespace)
}

// cloneSource is "namespace/name" of what a clone is made from: its PVC, snapshot or DataSource.
func cloneSource(dv *cdiv1.DataVolume) string {
	ns := func(n string) string {
		if n == "" {
			return dv.Namespace
		}
		return n
	}
	switch src, ref := dv.Spec.Source, dv.Spec.SourceRef; {
	case ref != nil:
		n := dv.Namespace
		if ref.Namespace != nil {
			n = ns(*ref.Namespace)
		}
		return n + "/" + ref.Name
	case src != nil && src.PVC != nil:
		return ns(src.PVC.Namespace) + "/" + src.PVC.Name
	case src != nil && src.Snapshot != nil:
		return ns(src.Snapshot.Namespace) + "/" + src.Snapshot.Name
	}
	return ""
}
