package apis_test

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
)

// TestPrinterColumns creates one object of each kind, sets its status as a controller would,
// and reads kubectl's tables: the default and wide columns of each short name, and the
// diskpipe category that lists them all.
func TestPrinterColumns(t *testing.T) {
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "columns")
	if err != nil {
		t.Fatal(err)
	}
	gi := resource.MustParse("4Gi")
	now := metav1.Now()
	ready := []metav1.Condition{{Type: common.ConditionReady, Status: metav1.ConditionTrue, Reason: "Imported", LastTransitionTime: now}}
	importing := common.ImageStatus{Phase: common.PhaseImporting, Progress: "42.5%", VirtualSize: &gi,
		Format: "qcow2", PVCName: "golden-ubuntu", SourceType: "http"}
	disk := common.DiskStatus{Phase: common.PhaseReady, Capacity: &gi, PVCName: "root-disk",
		CloneStrategy: common.CloneStrategyCSIClone, Conditions: ready}
	size := common.StorageResources{Requests: common.StorageList{Storage: &gi}}

	vmimage := &hypercloud.VirtualMachineImage{
		ObjectMeta: metav1.ObjectMeta{Name: "ubuntu18.04", Namespace: ns},
		Spec:       hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{HTTP: "https://example.com/u.img"}},
	}
	vmpvc := &hypercloud.VirtualMachinePvc{
		ObjectMeta: metav1.ObjectMeta{Name: "root", Namespace: ns},
		Spec: hypercloud.VirtualMachinePvcSpec{VirtualMachineImageName: "ubuntu18.04",
			PVC: common.PVCTemplate{VolumeOptions: common.VolumeOptions{Resources: size}}},
	}
	vmve := &hypercloud.VirtualMachineVolumeExport{
		ObjectMeta: metav1.ObjectMeta{Name: "export", Namespace: ns},
		Spec: hypercloud.VirtualMachineVolumeExportSpec{PVCName: "root",
			ObjectStore: &common.ObjectStoreSource{BucketName: "exports", ObjectName: "root.qcow2"}},
	}
	imt := &virtualmachine.ImageTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "centos", Namespace: ns, Labels: map[string]string{virtualmachine.LabelOSFamily: "centos"}},
		Spec: virtualmachine.ImageTemplateSpec{Source: virtualmachine.ImageTemplateSource{
			Registry: &common.RegistrySource{URL: "docker://quay.io/containerdisks/centos-stream:9"}}},
	}
	dvol := &diskvolume.DiskVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: ns},
		Spec: diskvolume.DiskVolumeSpec{Source: diskvolume.DiskVolumeSource{Blank: &common.BlankSource{}},
			PVCTemplate: common.PVCTemplate{VolumeOptions: common.VolumeOptions{Resources: size}}},
	}
	ksvm := &virtualmachine.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: ns},
		Spec:       virtualmachine.VirtualMachineSpec{IPPool: "p1"},
	}
	ksvm.Spec.Hardware.Raw = []byte(`{"domain":{"devices":{}}}`)

	setStatus := func(obj client.Object, set func()) {
		t.Helper()
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatalf("creating %T: %v", obj, err)
		}
		set()
		if err := env.Client.Status().Update(ctx, obj); err != nil {
			t.Fatalf("setting status of %T: %v", obj, err)
		}
	}
	setStatus(vmimage, func() { vmimage.Status = importing })
	setStatus(vmpvc, func() { vmpvc.Status = disk })
	setStatus(vmve, func() {
		vmve.Status = hypercloud.VirtualMachineVolumeExportStatus{Phase: common.PhaseExporting, Progress: "10%",
			StoredSize: ptr.To(resource.MustParse("1Gi")), ObjectURL: "s3://exports/root.qcow2"}
	})
	setStatus(imt, func() {
		imt.Status = importing
		imt.Status.Phase, imt.Status.Progress, imt.Status.Conditions = common.PhaseReady, "100%", ready
	})
	setStatus(dvol, func() { dvol.Status = disk })
	setStatus(ksvm, func() {
		ksvm.Status = virtualmachine.VirtualMachineStatus{Phase: common.PhasePending, PrintableStatus: "Provisioning"}
	})

	cases := []struct {
		resource string
		header   []string
		row      []string
	}{
		{"vmimage", []string{"NAME", "PHASE", "PROGRESS", "SIZE", "REVISION", "LAST CHECK", "NEXT CHECK", "AGE"}, []string{"ubuntu18.04", "Importing", "42.5%", "4Gi"}},
		{"vmpvc", []string{"NAME", "IMAGE", "PHASE", "PROGRESS", "SIZE", "AGE"}, []string{"root", "ubuntu18.04", "Ready", "4Gi"}},
		{"vmve", []string{"NAME", "PVC", "PHASE", "PROGRESS", "SIZE", "AGE"}, []string{"export", "root", "Exporting", "10%", "1Gi"}},
		{"imt", []string{"NAME", "PHASE", "PROGRESS", "SIZE", "REVISION", "LAST CHECK", "NEXT CHECK", "AGE"}, []string{"centos", "Ready", "100%", "4Gi"}},
		{"dvol", []string{"NAME", "PHASE", "PROGRESS", "SIZE", "AGE"}, []string{"data", "Ready", "4Gi"}},
		{"ksvm", []string{"NAME", "PHASE", "STATUS", "READY", "AGE"}, []string{"vm1", "Pending", "Provisioning"}},
		{"vmimage -o wide", []string{"NAME", "PHASE", "PROGRESS", "SIZE", "REVISION", "LAST CHECK", "NEXT CHECK", "CURRENT", "READY", "FORMAT", "PVC", "SOURCE", "AGE"},
			[]string{"ubuntu18.04", "Importing", "42.5%", "4Gi", "qcow2", "golden-ubuntu", "http"}},
		{"imt -o wide", []string{"NAME", "PHASE", "PROGRESS", "SIZE", "REVISION", "LAST CHECK", "NEXT CHECK", "CURRENT", "READY", "FORMAT", "PVC", "SOURCE", "OS", "AGE"},
			[]string{"centos", "Ready", "100%", "4Gi", "True", "qcow2", "golden-ubuntu", "http", "centos"}},
		{"dvol -o wide", []string{"NAME", "PHASE", "PROGRESS", "SIZE", "READY", "PVC", "STRATEGY", "AGE"},
			[]string{"data", "Ready", "4Gi", "True", "root-disk", "CSIClone"}},
		{"virtualmachineimage", []string{"NAME", "PHASE", "PROGRESS", "SIZE", "REVISION", "LAST CHECK", "NEXT CHECK", "AGE"}, []string{"ubuntu18.04", "Importing"}},
	}
	for _, c := range cases {
		t.Run(c.resource, func(t *testing.T) {
			out, stderr, err := env.Kubectl(ctx, nil, append([]string{"get", "--namespace", ns}, strings.Fields(c.resource)...)...)
			if err != nil {
				t.Fatalf("kubectl get %s: %v\n%s", c.resource, err, stderr)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if len(lines) != 2 {
				t.Fatalf("want a header and one row, got:\n%s", out)
			}
			if got := columns(lines[0]); strings.Join(got, " ") != strings.Join(c.header, " ") {
				t.Errorf("header = %q, want %q", got, c.header)
			}
			row := columns(lines[1])
			for i, want := range c.row {
				if i >= len(row) || row[i] != want {
					t.Errorf("row = %q, want it to start %q", row, c.row)
					break
				}
			}
		})
	}

	// A scheduled image, in a namespace of its own: its revision, last and next checks by
	// default, its current revision's image with -o wide.
	sns, err := env.CreateNamespace(ctx, "columns-schedule")
	if err != nil {
		t.Fatal(err)
	}
	nightly := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: sns},
		Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{HTTP: "https://example.com/nightly.qcow2"},
			Schedule: &common.ImageSchedule{Cron: "0 */6 * * *"}}}
	next := metav1.NewTime(time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC))
	setStatus(nightly, func() {
		nightly.Status = common.ImageStatus{Phase: common.PhaseReady, Progress: "100%", VirtualSize: &gi, Revision: `"5f2a-40000000"`,
			Schedule: &common.ScheduleStatus{Current: "nightly-3fa9c1d2e0", LastCheckTime: &now, NextCheckTime: &next}}
	})
	for args, want := range map[string][]string{
		"":        {"nightly", "Ready", "100%", "4Gi", `"5f2a-40000000"`},
		"-o wide": {"nightly", "Ready", "100%", "4Gi", `"5f2a-40000000"`},
	} {
		out, stderr, err := env.Kubectl(ctx, nil, append([]string{"get", "vmimage", "--namespace", sns}, strings.Fields(args)...)...)
		if err != nil {
			t.Fatalf("kubectl get vmimage %s: %v\n%s", args, err, stderr)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		row := columns(lines[len(lines)-1])
		if len(row) < 8 || strings.Join(row[:5], " ") != strings.Join(want, " ") || row[6] != "2026-11-23T12:00:00Z" ||
			(args != "" && row[7] != "nightly-3fa9c1d2e0") {
			t.Errorf("kubectl get vmimage %s:\n%s", args, out)
		}
	}

	for _, list := range []string{"diskpipe", "vmimage,vmpvc,vmve,imt,dvol,ksvm"} {
		t.Run("get "+list, func(t *testing.T) {
			out, stderr, err := env.Kubectl(ctx, nil, "get", list, "--namespace", ns)
			if err != nil {
				t.Fatalf("kubectl get %s: %v\n%s", list, err, stderr)
			}
			for _, name := range []string{
				"virtualmachineimage.hypercloud.tmaxanc.com/ubuntu18.04",
				"virtualmachinepvc.hypercloud.tmaxanc.com/root",
				"virtualmachinevolumeexport.hypercloud.tmaxanc.com/export",
				"imagetemplate.virtualmachine.kubesphere.io/centos",
				"virtualmachine.virtualmachine.kubesphere.io/vm1",
				"diskvolume.diskvolume.kubesphere.io/data",
			} {
				if !strings.Contains(out, name) {
					t.Errorf("kubectl get %s lacks %s:\n%s", list, name, out)
				}
			}
		})
	}
}

// columns splits a kubectl table line on runs of two or more spaces, the separator kubectl
// puts between columns (a single space can stand inside one, as in "KUBEVIRT VM").
func columns(line string) []string {
	return regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(line), -1)
}
