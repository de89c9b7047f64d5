package uploadproxy_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	cdiapi "kubevirt.io/containerized-data-importer-api/pkg/apis/upload/v1beta1"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/internal/cdiclaims"
	"github.com/diskpipe/diskpipe/internal/uploadtoken"
	"github.com/diskpipe/diskpipe/uploadproxy"
	"github.com/diskpipe/diskpipe/uploadproxy/cdiupload"
)

// slow bounds the waits on the store and the apiserver: generous, as CI runs this beside the
// real node's suite; each wait ends as soon as what it waits for is there.
const slow = 2 * time.Minute

// cdiUpload sends the image as virtctl image-upload does: POST /v1beta1/upload with the token
// as a bearer token and the whole file as the body; its answer comes on the channel.
func (f *fixture) cdiUpload(t *testing.T, token string, body []byte) <-chan string {
	return f.cdiPost(t, cdiupload.PathCDIUpload, token, "application/octet-stream", body)
}

// cdiPost posts body to path with the token; the answer comes on the channel.
func (f *fixture) cdiPost(t *testing.T, path, token, contentType string, body []byte) <-chan string {
	done := make(chan string, 1)
	go func() {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, f.url+path, bytes.NewReader(body))
		if err != nil {
			done <- err.Error()
			return
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", contentType)
		done <- answer(http.DefaultClient.Do(req))
	}()
	return done
}

// answer is a response's code and body, or the error.
func answer(resp *http.Response, err error) string {
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
}

// form is a multipart form as a browser sends it: a field before the file, then the file
// (when file is not nil); cut leaves the closing boundary off, as a connection cut mid-file
// does.
func form(t *testing.T, file []byte, cut bool) (contentType string, body []byte) {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	if err := mw.WriteField("note", "a field before the file"); err != nil {
		t.Fatal(err)
	}
	if file != nil {
		fw, err := mw.CreateFormFile("file", "disk.qcow2")
		if err != nil {
			t.Fatal(err)
		}
		_, _ = fw.Write(file)
	}
	if !cut {
		if err := mw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return mw.FormDataContentType(), b.Bytes()
}

// complete is the HEAD of diskpipe's protocol for image name: whether it is stored whole.
func (f *fixture) complete(t *testing.T, token, name string) func() string {
	return func() string {
		resp, _ := f.do(t, http.MethodHead, name, token, nil, "")
		return resp.Header.Get(uploadproxy.HeaderComplete)
	}
}

// TestCDIUpload: CDI's synchronous upload stores the image as a PUT does and answers 200 only
// once the claim's disk is made (its staging image gone), or the import's failure; the
// asynchronous one answers 200 once the image is stored (virtctl then waits on the claim),
// and virtctl's HEAD of its path answers a valid token; /healthz answers.
func TestCDIUpload(t *testing.T) {
	f := setup(t)
	g := NewWithT(t)
	key := f.withTokens(t)
	f.newImage(t, "dv-disk", f.digest)
	f.newImage(t, "dv-bad", "")
	f.newImage(t, "pvc-async", f.digest)
	soon := time.Now().Add(10 * time.Minute)

	for _, c := range []struct{ method, path, token, want string }{
		{http.MethodGet, uploadproxy.PathHealthz, "", "200 ok"},
		{http.MethodHead, cdiupload.PathCDIUploadAsync, f.token(t, key, "dv-disk", soon), "200 "},
		{http.MethodHead, "/v1alpha1/upload-async", f.token(t, key, "dv-disk", soon), "200 "},
		{http.MethodHead, cdiupload.PathCDIUploadAsync, "", "401 "},
		{http.MethodHead, cdiupload.PathCDIUploadAsync, f.token(t, key, "dv-disk", time.Now().Add(-time.Minute)), "401 "},
		{http.MethodHead, cdiupload.PathCDIUpload, f.token(t, key, "dv-disk", soon), "405 "},
		{http.MethodPost, cdiupload.PathCDIUpload, "", "401 an upload token is required (Authorization: Bearer <token>, from an UploadTokenRequest)"},
		{http.MethodPost, cdiupload.PathCDIUploadAsync, "forged", "401 "},
		{http.MethodPut, cdiupload.PathCDIUpload, f.token(t, key, "dv-disk", soon), "405 POST the image to /v1beta1/upload"},
	} {
		req, _ := http.NewRequestWithContext(t.Context(), c.method, f.url+c.path, nil)
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		g.Expect(answer(http.DefaultClient.Do(req))).To(HavePrefix(c.want), "%s %s", c.method, c.path)
	}

	done := f.cdiUpload(t, f.token(t, key, "dv-disk", soon), f.image)
	// Stored whole (HEAD of diskpipe's protocol says so), and no answer while the disk is made.
	g.Eventually(f.complete(t, f.token(t, key, "dv-disk", soon), "dv-disk"), slow, 200*time.Millisecond).Should(Equal("true"))
	g.Consistently(done, 2*time.Second).ShouldNot(Receive())
	g.Expect(env.Client.Delete(t.Context(), &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "dv-disk", Namespace: f.ns}})).To(Succeed())
	g.Eventually(done, slow).Should(Receive(Equal(fmt.Sprintf("200 uploaded %d bytes, %s: the disk is made", len(f.image), f.digest))))

	// The asynchronous upload is answered once stored, the image left to be imported: virtctl
	// then waits on the claim's annotation.
	done = f.cdiPost(t, cdiupload.PathCDIUploadAsync, f.token(t, key, "pvc-async", soon), "application/octet-stream", f.image)
	g.Eventually(done, slow).Should(Receive(Equal(fmt.Sprintf("200 uploaded %d bytes, %s: the disk is being made; the claim is annotated %s: Succeeded when it is",
		len(f.image), f.digest, cdiclaims.AnnPodPhase))))
	g.Expect(f.complete(t, f.token(t, key, "pvc-async", soon), "pvc-async")()).To(Equal("true"))
	g.Expect(env.Client.Get(t.Context(), clientKey(f.ns, "pvc-async"), &hypercloud.VirtualMachineImage{})).To(Succeed())

	// An import that fails after the upload is the upload's answer.
	done = f.cdiUpload(t, f.token(t, key, "dv-bad", soon), []byte("not a disk image, and short"))
	bad := &hypercloud.VirtualMachineImage{}
	g.Eventually(f.complete(t, f.token(t, key, "dv-bad", soon), "dv-bad"), slow, 200*time.Millisecond).Should(Equal("true"))
	g.Expect(env.Client.Get(t.Context(), clientKey(f.ns, "dv-bad"), bad)).To(Succeed())
	bad.Status.Phase = common.PhaseFailed
	bad.Status.Conditions = []metav1.Condition{{Type: common.ConditionReady, Status: metav1.ConditionFalse, Reason: "UnknownFormat",
		Message: "the source is no disk image", LastTransitionTime: metav1.Now()}}
	g.Expect(env.Client.Status().Update(t.Context(), bad)).To(Succeed())
	g.Eventually(done, slow).Should(Receive(Equal("422 the upload was stored, and its import failed: UnknownFormat: the source is no disk image")))
}

// TestCDIFormUpload: CDI's form uploads (a browser's multipart form, the image in the field
// "file", of a size the request does not say) store the file whole over several parts and
// its checksum holds; a form cut before its end stores nothing complete and says so, and the
// same form sent again finishes; a form without the file is refused.
func TestCDIFormUpload(t *testing.T) {
	f := setup(t)
	g := NewWithT(t)
	key := f.withTokens(t)
	f.newImage(t, "pvc-form", f.digest)
	f.newImage(t, "dv-cut", f.digest)
	soon := time.Now().Add(10 * time.Minute)

	ct, body := form(t, nil, false)
	g.Eventually(f.cdiPost(t, cdiupload.PathCDIUploadFormAsync, f.token(t, key, "pvc-form", soon), ct, body), slow).
		Should(Receive(Equal(`400 the form has no field "file"`)))
	g.Eventually(f.cdiPost(t, cdiupload.PathCDIUploadFormAsync, f.token(t, key, "pvc-form", soon), "application/octet-stream", f.image), slow).
		Should(Receive(HavePrefix(`400 a form upload is multipart/form-data with the image in the field "file"`)))

	// Fields before the file are held in memory as the form is read: not more than 1 MiB.
	var big bytes.Buffer
	mw := multipart.NewWriter(&big)
	g.Expect(mw.WriteField("note", strings.Repeat("x", 2<<20))).To(Succeed())
	fw, err := mw.CreateFormFile("file", "disk.qcow2")
	g.Expect(err).NotTo(HaveOccurred())
	_, _ = fw.Write(f.image[:1<<20])
	g.Expect(mw.Close()).To(Succeed())
	g.Eventually(f.cdiPost(t, cdiupload.PathCDIUploadFormAsync, f.token(t, key, "pvc-form", soon), mw.FormDataContentType(), big.Bytes()), slow).
		Should(Receive(Equal(`413 the form sends more than 1048576 bytes before its field "file": send the image first`)))

	ct, body = form(t, f.image, false)
	g.Eventually(f.cdiPost(t, cdiupload.PathCDIUploadFormAsync, f.token(t, key, "pvc-form", soon), ct, body), slow).
		Should(Receive(HavePrefix(fmt.Sprintf("200 uploaded %d bytes, %s", len(f.image), f.digest))))

	ct, cut := form(t, f.image[:len(f.image)-1000], true)
	g.Eventually(f.cdiPost(t, cdiupload.PathCDIUploadForm, f.token(t, key, "dv-cut", soon), ct, cut), slow).
		Should(Receive(MatchRegexp(`^400 the body ended at byte \d+ before the form's end; send it again \(\d+ bytes are stored\)$`)))
	g.Expect(f.complete(t, f.token(t, key, "dv-cut", soon), "dv-cut")()).To(Equal("false"))
	ct, body = form(t, f.image, false)
	done := f.cdiPost(t, cdiupload.PathCDIUploadForm, f.token(t, key, "dv-cut", soon), ct, body)
	g.Eventually(f.complete(t, f.token(t, key, "dv-cut", soon), "dv-cut"), slow, 200*time.Millisecond).Should(Equal("true"))
	g.Expect(env.Client.Delete(t.Context(), &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "dv-cut", Namespace: f.ns}})).To(Succeed())
	g.Eventually(done, slow).Should(Receive(Equal(fmt.Sprintf("200 uploaded %d bytes, %s: the disk is made", len(f.image), f.digest))))
}

// cdiTokenAPI installs CDI's CRDs and returns the manager's token API and the request virtctl
// sends for a token to upload to pvcName.
func (f *fixture) cdiTokenAPI(t *testing.T) (*uploadproxy.TokenAPI, func(pvcName string) []byte) {
	t.Helper()
	NewWithT(t).Expect(env.InstallCDICRDs()).To(Succeed())
	f.withTokens(t)
	api := &uploadproxy.TokenAPI{Reader: env.Client, Client: env.Client,
		Key: &uploadtoken.Key{Client: env.Client, Namespace: f.ns, Name: "token-key"}}
	return api, func(pvcName string) []byte {
		return fmt.Appendf(nil, `{"apiVersion":"upload.cdi.kubevirt.io/v1beta1","kind":"UploadTokenRequest","metadata":{"name":"token-for-virtctl"},"spec":{"pvcName":%q}}`, pvcName)
	}
}

// cdiToken answers a CDI UploadTokenRequest as the manager's token API does.
func cdiToken(ctx context.Context, api *uploadproxy.TokenAPI, ns string, body []byte, user authenticationv1.UserInfo) (*cdiapi.UploadTokenRequest, error) {
	out, err := cdiupload.Tokens(api).Requests["UploadTokenRequest"](ctx, ns, body, user)
	got, _ := out.(*cdiapi.UploadTokenRequest)
	return got, err
}

// TestCDIUploadToken: CDI's UploadTokenRequest names a DataVolume; the token is for the image
// that stages it, and takes the upload; a DataVolume that is no upload, one not staged yet, one
// done, or a name that is none, is refused with the reason.
func TestCDIUploadToken(t *testing.T) {
	f := setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	api, request := f.cdiTokenAPI(t)
	alice := authenticationv1.UserInfo{Username: "alice"}
	size := corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}
	for name, src := range map[string]*cdiv1.DataVolumeSource{"disk": {Upload: &cdiv1.DataVolumeSourceUpload{}},
		"early": {Upload: &cdiv1.DataVolumeSourceUpload{}}, "web": {HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://example.com/a.img"}}} {
		g.Expect(env.Client.Create(ctx, &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns},
			Spec: cdiv1.DataVolumeSpec{Source: src, Storage: &cdiv1.StorageSpec{Resources: size}}})).To(Succeed())
	}
	f.newImage(t, cdiclaims.UploadPVCImage("disk"), f.digest)

	got, err := cdiToken(ctx, api, f.ns, request("disk"), alice)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got.Name).To(Equal("token-for-virtctl"))
	answer := f.cdiUpload(t, got.Status.Token, f.image)
	g.Eventually(func() string {
		resp, _ := f.do(t, http.MethodHead, "pvc-disk", got.Status.Token, nil, "")
		return resp.Header.Get(uploadproxy.HeaderComplete)
	}, slow, 200*time.Millisecond).Should(Equal("true"), "the token takes the upload to the DataVolume's image")
	g.Expect(env.Client.Delete(ctx, &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "pvc-disk", Namespace: f.ns}})).To(Succeed())
	g.Eventually(answer, slow).Should(Receive(HavePrefix("200 ")))

	for pvc, want := range map[string]string{
		"web":   "DataVolume " + f.ns + "/web does not take uploads: its source is not upload",
		"early": "DataVolume " + f.ns + "/early is not ready for its upload yet: wait for its phase UploadReady",
		"none":  "no DataVolume or PVC " + f.ns + "/none: diskpipe takes CDI uploads to a DataVolume of source upload (virtctl image-upload dv)",
		"Bad!":  `invalid UploadTokenRequest: spec.pvcName "Bad!"`,
	} {
		_, err := cdiToken(ctx, api, f.ns, request(pvc), alice)
		g.Expect(err).To(MatchError(ContainSubstring(want)), pvc)
	}
}

// TestCDIUploadTokenPVC: CDI's UploadTokenRequest may name a PVC made for an upload (virtctl
// image-upload pvc); the token is for the image that stages it, and the asynchronous upload is
// answered once stored (the claim is there already). A PVC not made for an upload, one whose
// image is not made yet, and one already uploaded are refused with the reason.
func TestCDIUploadTokenPVC(t *testing.T) {
	f := setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	api, request := f.cdiTokenAPI(t)
	alice := authenticationv1.UserInfo{Username: "alice"}
	claim := func(name string, ann map[string]string, source bool) *corev1.PersistentVolumeClaim {
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns, Annotations: ann},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
		if source {
			pvc.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: ptr.To(hypercloud.GroupVersion.Group), Kind: "VirtualMachineImage",
				Name: cdiclaims.UploadPVCImage(name)}
		}
		g.Expect(env.Client.Create(ctx, pvc)).To(Succeed())
		return pvc
	}
	target := map[string]string{cdiclaims.AnnUploadTarget: ""}
	disk := claim("disk", target, true)
	claim("early", target, true)
	claim("plain", nil, false)
	claim("marked", target, false) // marked, but no staging image as its source
	claim("done", map[string]string{cdiclaims.AnnUploadTarget: "", cdiclaims.AnnPodPhase: "Succeeded"}, true)
	img := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: cdiclaims.UploadPVCImage("disk"), Namespace: f.ns},
		Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{Upload: &common.UploadSource{},
			Checksum: common.Checksum(f.digest)}}}
	g.Expect(controllerutil.SetControllerReference(disk, img, env.Client.Scheme())).To(Succeed())
	g.Expect(env.Client.Create(ctx, img)).To(Succeed())

	got, err := cdiToken(ctx, api, f.ns, request("disk"), alice)
	g.Expect(err).NotTo(HaveOccurred())
	answer := f.cdiPost(t, cdiupload.PathCDIUploadAsync, got.Status.Token, "application/octet-stream", f.image)
	g.Eventually(answer, slow).Should(Receive(HavePrefix("200 ")), "answered once stored: the claim is there")
	g.Expect(f.complete(t, got.Status.Token, img.Name)()).To(Equal("true"), "the token took the upload to the PVC's image")

	for pvc, want := range map[string]string{
		"early":  "PVC " + f.ns + "/early is not ready for its upload yet: wait for its annotation cdi.kubevirt.io/storage.pod.ready: \"true\"",
		"plain":  "PVC " + f.ns + "/plain does not take uploads: it was not made for one (virtctl image-upload pvc NAME --size ... makes one)",
		"marked": "PVC " + f.ns + "/marked does not take uploads",
		"done":   "PVC " + f.ns + "/done is already uploaded",
		"none": "no DataVolume or PVC " + f.ns + "/none: diskpipe takes CDI uploads to a DataVolume of source upload (virtctl image-upload dv) " +
			"or to a PVC made for one (virtctl image-upload pvc)",
	} {
		_, err := cdiToken(ctx, api, f.ns, request(pvc), alice)
		g.Expect(err).To(MatchError(ContainSubstring(want)), pvc)
	}
}
