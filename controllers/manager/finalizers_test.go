package manager_test

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/admission"
	"github.com/diskpipe/diskpipe/controllers/export"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
)

// TestFinalizerPolicy: with the chart's MutatingAdmissionPolicy, the apiserver itself gives a
// new image or export its controller's finalizer, keeps the finalizers the object came with,
// adds none twice, and leaves other kinds alone. No manager runs: the finalizers are there
// when Create returns.
func TestFinalizerPolicy(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "finalizers")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(env.InstallFinalizerPolicy(ctx)).To(Succeed())
	t.Cleanup(func() { // t.Context() is done by now
		_ = env.Client.Delete(context.Background(), admission.FinalizerPolicyBinding())
		_ = env.Client.Delete(context.Background(), admission.FinalizerPolicy())
	})

	vmi := func(name string, finalizers ...string) *hypercloud.VirtualMachineImage {
		o := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Finalizers: finalizers},
			Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{HTTP: common.HTTPURL("https://images.example.com/a.qcow2")}}}
		return o
	}
	for _, tc := range []struct {
		name string
		obj  client.Object
		want []string
	}{
		{"image", vmi("plain"), []string{goldenimage.Finalizer}},
		{"image with another finalizer", vmi("kept", "example.com/keep"), []string{"example.com/keep", goldenimage.Finalizer}},
		{"image with the finalizer already", vmi("once", goldenimage.Finalizer), []string{goldenimage.Finalizer}},
		{"image template", &virtualmachine.ImageTemplate{ObjectMeta: metav1.ObjectMeta{Name: "centos", Namespace: ns},
			Spec: virtualmachine.ImageTemplateSpec{Source: virtualmachine.ImageTemplateSource{
				HTTP: &common.HTTPSource{URL: "https://images.example.com/centos.qcow2"}}}}, []string{goldenimage.Finalizer}},
		{"export", &hypercloud.VirtualMachineVolumeExport{ObjectMeta: metav1.ObjectMeta{Name: "offsite", Namespace: ns},
			Spec: hypercloud.VirtualMachineVolumeExportSpec{PVCName: "disk",
				ObjectStore: &common.ObjectStoreSource{BucketName: "vmexport", ObjectName: "disk.qcow2"}}}, []string{export.Finalizer}},
		{"disk (not the policy's)", &diskvolume.DiskVolume{ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: ns},
			Spec: diskvolume.DiskVolumeSpec{Source: diskvolume.DiskVolumeSource{Image: &diskvolume.ImageSource{
				Name: "plain", Kind: diskvolume.ImageKindVirtualMachineImage}}}}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(env.Client.Create(ctx, tc.obj)).To(Succeed())
			g.Expect(tc.obj.GetFinalizers()).To(Equal(tc.want))
			// What was stored, not only what Create answered.
			g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(tc.obj), tc.obj)).To(Succeed())
			g.Expect(tc.obj.GetFinalizers()).To(Equal(tc.want))
			tc.obj.SetFinalizers(nil)
			g.Expect(env.Client.Update(ctx, tc.obj)).To(Succeed())
			g.Expect(env.Client.Delete(ctx, tc.obj)).To(Succeed())
		})
	}
}
