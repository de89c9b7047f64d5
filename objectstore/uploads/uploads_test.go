package uploads_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/objectstore/objectstoretest"
	"github.com/diskpipe/diskpipe/objectstore/uploads"
	"github.com/diskpipe/diskpipe/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.RunTests(m, &env) }

// TestSweep, on a real apiserver and store: the uploads of an image that is gone, or of one
// deleted and made again under its name, are removed whole (object, marker, state, unfinished
// parts); those of images that are there, and objects that are no upload's, stay.
func TestSweep(t *testing.T) {
	g := NewWithT(t)
	ctx := t.Context()
	store := objectstoretest.Start(t)
	root := store.Client()
	ns, err := env.CreateNamespace(ctx, "sweep")
	g.Expect(err).NotTo(HaveOccurred())
	image := func(name string) *hypercloud.VirtualMachineImage {
		vmi := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{Upload: &common.UploadSource{}}}}
		g.Expect(env.Client.Create(ctx, vmi)).To(Succeed())
		return vmi
	}
	kept := image("kept")
	image("remade")
	keptKey := uploads.ObjectKey(ns, "virtualmachineimages", "kept", string(kept.UID))
	staleKey := uploads.ObjectKey(ns, "virtualmachineimages", "remade", "00000000-0000-0000-0000-000000000001")
	goneKey := uploads.ObjectKey(ns, "virtualmachineimages", "gone", "00000000-0000-0000-0000-000000000002")
	partsKey := uploads.ObjectKey(ns, "imagetemplates", "parts", "00000000-0000-0000-0000-000000000003")

	g.Expect(root.MakeBucket(ctx, uploads.Bucket, minio.MakeBucketOptions{})).To(Succeed())
	put := func(keys ...string) {
		for _, k := range keys {
			_, err := root.PutObject(ctx, uploads.Bucket, k, strings.NewReader("bytes"), 5, minio.PutObjectOptions{})
			g.Expect(err).NotTo(HaveOccurred())
		}
	}
	put(keptKey, uploads.MarkerKey(keptKey), staleKey, uploads.MarkerKey(staleKey), uploads.StateKey(goneKey), "notes/readme")
	core := minio.Core{Client: root.Client}
	_, err = core.NewMultipartUpload(ctx, uploads.Bucket, partsKey, minio.PutObjectOptions{})
	g.Expect(err).NotTo(HaveOccurred())

	removed, err := uploads.Sweep(ctx, root, env.Client)
	g.Expect(err).NotTo(HaveOccurred())
	slices.Sort(removed)
	want := []string{goneKey, partsKey, staleKey}
	slices.Sort(want)
	g.Expect(removed).To(Equal(want))

	var left []string
	for obj := range root.ListObjects(ctx, uploads.Bucket, minio.ListObjectsOptions{Recursive: true}) {
		g.Expect(obj.Err).NotTo(HaveOccurred())
		left = append(left, obj.Key)
	}
	g.Expect(left).To(ConsistOf(keptKey, uploads.MarkerKey(keptKey), "notes/readme"))
	list, err := core.ListMultipartUploads(ctx, uploads.Bucket, "", "", "", "", 100)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(list.Uploads).To(BeEmpty(), "the unfinished parts of a gone image are aborted")

	again, err := uploads.Sweep(ctx, root, env.Client)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(again).To(BeEmpty(), "a second sweep finds nothing")
}
