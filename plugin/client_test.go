package plugin

import (
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery/fake"
	clienttesting "k8s.io/client-go/testing"
)

// TestOwnResource: a name diskpipe's kinds share with another API (KubeVirt's
// VirtualMachineInstanceMigration is vmim, diskpipe's former short name for images) is
// diskpipe's; a name only the other API has is not.
func TestOwnResource(t *testing.T) {
	g := NewWithT(t)
	disc := &fake.FakeDiscovery{Fake: &clienttesting.Fake{Resources: []*metav1.APIResourceList{
		{GroupVersion: "kubevirt.io/v1", APIResources: []metav1.APIResource{
			{Name: "virtualmachineinstancemigrations", SingularName: "virtualmachineinstancemigration", Kind: "VirtualMachineInstanceMigration", ShortNames: []string{"vmim", "vmims"}}}},
		{GroupVersion: "hypercloud.tmaxanc.com/v1alpha1", APIResources: []metav1.APIResource{
			{Name: "virtualmachineimages/status", Kind: "VirtualMachineImage"},
			{Name: "virtualmachineimages", SingularName: "virtualmachineimage", Kind: "VirtualMachineImage", ShortNames: []string{"vmimage"}}}},
	}}}
	images := schema.GroupVersionResource{Group: "hypercloud.tmaxanc.com", Version: "v1alpha1", Resource: "virtualmachineimages"}
	for _, name := range []string{"vmimage", "vmim", "VMIM", "virtualmachineimage", "virtualmachineimages", "VirtualMachineImage"} {
		gvr, ok := ownResource(disc, name)
		g.Expect(ok).To(BeTrue(), name)
		g.Expect(gvr).To(Equal(images), name)
	}
	for _, name := range []string{"vmims", "virtualmachineinstancemigrations", "status"} {
		_, ok := ownResource(disc, name)
		g.Expect(ok).To(BeFalse(), name)
	}
}
