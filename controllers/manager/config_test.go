package manager_test

import (
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/manager"
	"github.com/diskpipe/diskpipe/test/testenv"
)

// TestLoadChartConfig loads the configuration file the chart renders, with non-default
// values, as the manager does at start.
func TestLoadChartConfig(t *testing.T) {
	g := NewWithT(t)
	objs, _, err := testenv.RenderChart(t.Context(), testenv.ChartRelease, "diskpipe-system", "--show-only", "templates/manager.yaml",
		"-f", testenv.Path("test", "chart", "testdata", "nondefault.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	var data string
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" {
			data, _, _ = unstructured.NestedString(o.Object, "data", "config.yaml")
		}
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	g.Expect(os.WriteFile(path, []byte(data), 0o600)).To(Succeed())
	cfg, err := manager.LoadConfig(path)
	g.Expect(err).NotTo(HaveOccurred())
	imp := cfg.Importer
	g.Expect(imp.Image).To(Equal("registry.example.com/diskpipe:v9.9.9"))
	g.Expect(imp.ImagePullPolicy).To(Equal(corev1.PullAlways))
	g.Expect(imp.ImagePullSecrets).To(Equal([]corev1.LocalObjectReference{{Name: "regcred"}}))
	g.Expect(imp.ServiceAccountName).To(Equal("vm-importer"))
	g.Expect(imp.NodeSelector).To(Equal(map[string]string{"storage": "true"}))
	g.Expect(imp.Tolerations).To(HaveLen(1))
	g.Expect(imp.PriorityClassName).To(Equal("high"))
	g.Expect(imp.Resources.Limits.Memory().String()).To(Equal("1Gi"))
	g.Expect(imp.NetworkPolicy.ManagerNamespace).To(Equal("diskpipe-system"))
	g.Expect(imp.NetworkPolicy.ManagerLabels).To(HaveKeyWithValue("app.kubernetes.io/component", "manager"))
	g.Expect(imp.NetworkPolicy.StoreLabels).To(HaveKeyWithValue("app.kubernetes.io/component", "objectstore"))
	g.Expect(imp.NetworkPolicy.StorePort).To(BeNumerically(">", 0))
	g.Expect(imp.ClusterCIDRs).To(Equal([]string{"10.244.0.0/16", "10.96.0.0/12"}))
	g.Expect(imp.AllowedDestinations).To(Equal([]string{"10.244.0.1", "mirror.images.svc.cluster.local"}))
	g.Expect(cfg.CloneStrategy.Default).To(Equal(common.CloneStrategySnapshot))
	g.Expect(cfg.CloneStrategy.StorageClasses).To(HaveKeyWithValue("nfs", common.CloneStrategyHostAssisted))
	g.Expect(cfg.FilesystemOverhead.For("cephfs")).To(Equal(0.1))
	g.Expect(cfg.VirtualMachines.AllowHostDisk).To(BeTrue())
	g.Expect(cfg.FilesystemOverhead.For("cephrbd")).To(Equal(0.055))

	// A misspelt key or an unknown strategy stops the manager rather than being ignored.
	for body, want := range map[string]string{
		"importer:\n  nodeSelecter: {a: b}\n":               `unknown field "nodeSelecter"`,
		"cloneStrategy:\n  storageClasses: {nfs: Rsync}\n":  `cloneStrategy.storageClasses[nfs] "Rsync" is not one of`,
		"filesystemOverhead:\n  storageClasses: {nfs: 6}\n": `filesystemOverhead of StorageClass nfs is 6: give a fraction from 0 to 0.5`,
		"importer:\n  clusterCIDRs: [10.96.0.0]\n":          `importer.clusterCIDRs: "10.96.0.0" is not a CIDR`,
		"importer:\n  allowedDestinations: [\"a b\"]\n":     `importer.allowedDestinations: "a b" is neither a CIDR, an address nor a host name`,
		"cloneStrategy:\n  default: Fastest\n":              `cloneStrategy.default "Fastest" is not one of [Automatic CSIClone Snapshot HostAssisted]`,
	} {
		g.Expect(os.WriteFile(path, []byte(body), 0o600)).To(Succeed())
		_, err := manager.LoadConfig(path)
		g.Expect(err).To(MatchError(ContainSubstring(want)))
	}
	// The chart's default, Automatic, and no value at all leave the strategy to diskpipe.
	for _, body := range []string{"cloneStrategy:\n  default: Automatic\n", "{}\n"} {
		g.Expect(os.WriteFile(path, []byte(body), 0o600)).To(Succeed())
		cfg, err := manager.LoadConfig(path)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(cfg.CloneStrategy.Preferred(nil)).To(BeEmpty(), body)
	}
	// A class may be left to diskpipe where the default is another.
	g.Expect(os.WriteFile(path, []byte("cloneStrategy:\n  default: CSIClone\n  storageClasses: {ceph: Automatic}\n"), 0o600)).To(Succeed())
	cfg, err = manager.LoadConfig(path)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cfg.CloneStrategy.Preferred(&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "ceph"}})).To(BeEmpty())
	g.Expect(cfg.CloneStrategy.Preferred(nil)).To(Equal(common.CloneStrategyCSIClone))
}
