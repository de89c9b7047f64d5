package uploadproxy_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/objectstore/uploads"
	"github.com/diskpipe/diskpipe/uploadproxy"
	"github.com/diskpipe/diskpipe/uploadproxy/cdiupload"
)

// stored says whether anything of image name's upload is in the store: its object, state,
// marker or unfinished parts.
func (f *fixture) stored(t *testing.T, name string) []string {
	t.Helper()
	key := objectKey(t, f, name)
	var found []string
	for obj := range f.store.Client().ListObjects(t.Context(), uploads.Bucket, minio.ListObjectsOptions{Prefix: key, Recursive: true}) {
		found = append(found, obj.Key)
	}
	core := minio.Core{Client: f.store.Client().Client}
	list, err := core.ListMultipartUploads(t.Context(), uploads.Bucket, key, "", "", "", 100)
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	for _, up := range list.Uploads {
		found = append(found, "parts of "+up.Key)
	}
	return found
}

// TestUploadsBounded: a namespace's storage quota bounds what its uploads keep: an upload
// that would pass it is refused before a byte is stored, with what is kept and the bound's
// source; once an image's upload is removed, the next is taken. Another namespace's uploads
// do not count.
func TestUploadsBounded(t *testing.T) {
	f := setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	size := int64(len(f.image))
	g.Expect(env.Client.Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "storage", Namespace: f.ns},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourceRequestsStorage: resource.MustParse("40Mi"),
			corev1.ResourceRequestsCPU: resource.MustParse("1")}}})).To(Succeed())
	for _, name := range []string{"first", "second"} {
		f.newImage(t, name, "")
	}
	resp, msg := f.do(t, http.MethodPut, "first", f.uploader, f.image, "")
	g.Expect(resp.StatusCode).To(Equal(http.StatusCreated), msg)

	resp, msg = f.do(t, http.MethodPut, "second", f.uploader, f.image, "")
	g.Expect(resp.StatusCode).To(Equal(http.StatusRequestEntityTooLarge))
	g.Expect(msg).To(Equal(fmt.Sprintf("namespace %s may keep %d bytes of uploads (the requests.storage of ResourceQuota storage): %d are kept and 0 being written, and this upload has %d; delete images whose uploads are done with, or raise the bound",
		f.ns, 40<<20, size, size)))
	g.Expect(f.stored(t, "second")).To(BeEmpty(), "nothing of a refused upload is stored")

	// Another namespace, on the same store, is bounded by its own quota only.
	other := setupOn(t, f.store)
	other.newImage(t, "elsewhere", "")
	resp, msg = other.do(t, http.MethodPut, "elsewhere", other.uploader, f.image, "")
	g.Expect(resp.StatusCode).To(Equal(http.StatusCreated), msg)

	g.Expect(uploads.Remove(ctx, f.store.Client(), objectKey(t, f, "first"))).To(Succeed())
	resp, msg = f.do(t, http.MethodPut, "second", f.uploader, f.image, "")
	g.Expect(resp.StatusCode).To(Equal(http.StatusCreated), msg)
}

// TestUploadsBoundedByProxy: the proxy's own bound per namespace applies without a quota, and
// counts an unfinished upload at its said size; a form, whose size is not said, is stopped
// where it passes the bound and what it stored is discarded.
func TestUploadsBoundedByProxy(t *testing.T) {
	f := setup(t, func(s *uploadproxy.Server) { s.MaxBytesPerNamespace = 30 << 20 })
	g := NewWithT(t)
	size := int64(len(f.image))
	for _, name := range []string{"half", "whole", "form"} {
		f.newImage(t, name, "")
	}
	// Half an upload, said to be whole: its total is what it keeps.
	f.cut(t, "half", partSize)
	resp, msg := f.do(t, http.MethodPut, "whole", f.uploader, f.image[:8<<20], "")
	g.Expect(resp.StatusCode).To(Equal(http.StatusRequestEntityTooLarge))
	g.Expect(msg).To(Equal(fmt.Sprintf("namespace %s may keep %d bytes of uploads (the upload proxy's limit per namespace (uploadProxy.maxBytesPerNamespace)): %d are kept and 0 being written, and this upload has %d; delete images whose uploads are done with, or raise the bound",
		f.ns, 30<<20, size, 8<<20)))

	// The unfinished upload resumes: its own bytes are not counted twice.
	resp, msg = f.do(t, http.MethodPut, "half", f.uploader, f.image[partSize:], fmt.Sprintf("bytes %d-%d/%d", partSize, size-1, size))
	g.Expect(resp.StatusCode).To(Equal(http.StatusCreated), msg)

	key := f.withTokens(t)
	ct, body := form(t, f.image, false)
	g.Eventually(f.cdiPost(t, cdiupload.PathCDIUploadFormAsync, f.token(t, key, "form", time.Now().Add(10*time.Minute)), ct, body), slow).
		Should(Receive(HavePrefix(fmt.Sprintf("413 namespace %s may keep %d bytes of uploads", f.ns, 30<<20))))
	g.Expect(f.stored(t, "form")).To(BeEmpty(), "a form stopped at the bound leaves nothing")
}

// TestUploadsRefusedEarly: a storage quota of 0 is a bound (no uploads), whatever the proxy's
// own; a request that says a smaller size than the bytes stored is refused, not counted at
// its word; an image being deleted takes no upload, so that nothing is written after its
// cleanup.
func TestUploadsRefusedEarly(t *testing.T) {
	f := setup(t, func(s *uploadproxy.Server) { s.MaxBytesPerNamespace = 1 << 30 })
	g := NewWithT(t)
	ctx := t.Context()
	for _, name := range []string{"cut", "going"} {
		f.newImage(t, name, "")
	}
	// A form, whose size is not said, cut after two parts; then a PUT that says one part.
	key := f.withTokens(t)
	ct, cut := form(t, f.image[:len(f.image)-1000], true)
	g.Eventually(f.cdiPost(t, cdiupload.PathCDIUploadForm, f.token(t, key, "cut", time.Now().Add(10*time.Minute)), ct, cut), slow).
		Should(Receive(HavePrefix("400 the body ended at byte")))
	resp, msg := f.do(t, http.MethodHead, "cut", f.uploader, nil, "")
	stored := resp.Header.Get(uploadproxy.HeaderOffset)
	g.Expect(stored).NotTo(Equal("0"), msg)
	resp, msg = f.do(t, http.MethodPut, "cut", f.uploader, f.image[:partSize], "")
	g.Expect(resp.StatusCode).To(Equal(http.StatusConflict), msg)
	g.Expect(msg).To(Equal(fmt.Sprintf("%s bytes of the upload are stored, more than this request's %d: upload the same file, or delete and make the image again", stored, partSize)))

	going := &hypercloud.VirtualMachineImage{}
	g.Expect(env.Client.Get(ctx, clientKey(f.ns, "going"), going)).To(Succeed())
	going.Finalizers = append(going.Finalizers, "test.diskpipe.io/hold")
	g.Expect(env.Client.Update(ctx, going)).To(Succeed())
	g.Expect(env.Client.Delete(ctx, going)).To(Succeed())
	resp, msg = f.do(t, http.MethodPut, "going", f.uploader, f.image, "")
	g.Expect(resp.StatusCode).To(Equal(http.StatusConflict), msg)
	g.Expect(msg).To(Equal(fmt.Sprintf("virtualmachineimages %s/going is being deleted: it takes no upload", f.ns)))
	g.Expect(env.Client.Get(ctx, clientKey(f.ns, "going"), going)).To(Succeed())
	going.Finalizers = nil
	g.Expect(env.Client.Update(ctx, going)).To(Succeed())

	g.Expect(env.Client.Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "none", Namespace: f.ns},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourceRequestsStorage: resource.MustParse("0")}}})).To(Succeed())
	f.newImage(t, "none", "")
	resp, msg = f.do(t, http.MethodPut, "none", f.uploader, f.image, "")
	g.Expect(resp.StatusCode).To(Equal(http.StatusRequestEntityTooLarge), msg)
	g.Expect(msg).To(HavePrefix(fmt.Sprintf("namespace %s may keep 0 bytes of uploads (the requests.storage of ResourceQuota none)", f.ns)))
}
