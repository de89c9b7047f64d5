package uploadproxy_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/uploadproxy"
)

// cdiUpload sends the image as virtctl image-upload does: POST /v1beta1/upload with the token
// as a bearer token and the whole file as the body; its answer comes on the channel.
func (f *fixture) cdiUpload(t *testing.T, token string, body []byte) <-chan string {
	done := make(chan string, 1)
	go func() {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, f.url+uploadproxy.PathCDIUpload, bytes.NewReader(body))
		if err != nil {
			done <- err.Error()
			return
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}()
	return done
}

// TestCDIUpload: CDI's synchronous upload stores the image as a PUT does and answers 200 only
// once the DataVolume's disk is made (its staging image gone), or the import's failure; the
// asynchronous path is not served (virtctl then uses the synchronous one); /healthz answers.
func TestCDIUpload(t *testing.T) {
	f := setup(t)
	g := NewWithT(t)
	key := f.withTokens(t)
	f.newImage(t, "dv-disk", f.digest)
	f.newImage(t, "dv-bad", "")
	soon := time.Now().Add(time.Minute)

	for _, c := range []struct{ method, path, token, want string }{
		{http.MethodGet, uploadproxy.PathHealthz, "", "200 ok"},
		{http.MethodHead, uploadproxy.PathCDIUploadAsync, f.token(t, key, "dv-disk", soon), "404 "},
		{http.MethodPost, uploadproxy.PathCDIUpload, "", "401 an upload token is required (Authorization: Bearer <token>, from an UploadTokenRequest)"},
		{http.MethodPut, uploadproxy.PathCDIUpload, f.token(t, key, "dv-disk", soon), "405 POST the image to /v1beta1/upload"},
	} {
		req, _ := http.NewRequestWithContext(t.Context(), c.method, f.url+c.path, nil)
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		resp, err := http.DefaultClient.Do(req)
		g.Expect(err).NotTo(HaveOccurred())
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		g.Expect(fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))).To(Equal(c.want), "%s %s", c.method, c.path)
	}

	answer := f.cdiUpload(t, f.token(t, key, "dv-disk", soon), f.image)
	// Stored whole (HEAD of diskpipe's protocol says so), and no answer while the disk is made.
	g.Eventually(func() string {
		resp, _ := f.do(t, http.MethodHead, "dv-disk", f.token(t, key, "dv-disk", soon), nil, "")
		return resp.Header.Get(uploadproxy.HeaderComplete)
	}, 20*time.Second, 200*time.Millisecond).Should(Equal("true"))
	g.Consistently(answer, 2*time.Second).ShouldNot(Receive())
	g.Expect(env.Client.Delete(t.Context(), &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "dv-disk", Namespace: f.ns}})).To(Succeed())
	g.Eventually(answer, 20*time.Second).Should(Receive(Equal(fmt.Sprintf("200 uploaded %d bytes, %s: the disk is made", len(f.image), f.digest))))

	// An import that fails after the upload is the upload's answer.
	answer = f.cdiUpload(t, f.token(t, key, "dv-bad", soon), []byte("not a disk image, and short"))
	bad := &hypercloud.VirtualMachineImage{}
	g.Eventually(func() string {
		resp, _ := f.do(t, http.MethodHead, "dv-bad", f.token(t, key, "dv-bad", soon), nil, "")
		return resp.Header.Get(uploadproxy.HeaderComplete)
	}, 20*time.Second, 200*time.Millisecond).Should(Equal("true"))
	g.Expect(env.Client.Get(t.Context(), clientKey(f.ns, "dv-bad"), bad)).To(Succeed())
	bad.Status.Phase = common.PhaseFailed
	bad.Status.Conditions = []metav1.Condition{{Type: common.ConditionReady, Status: metav1.ConditionFalse, Reason: "UnknownFormat",
		Message: "the source is no disk image", LastTransitionTime: metav1.Now()}}
	g.Expect(env.Client.Status().Update(t.Context(), bad)).To(Succeed())
	g.Eventually(answer, 20*time.Second).Should(Receive(Equal("422 the upload was stored, and its import failed: UnknownFormat: the source is no disk image")))
}

// TestCDIUploadToken: CDI's UploadTokenRequest names a DataVolume; the token is for the image
// that stages it, and takes the upload; a DataVolume that is no upload, one not staged yet, one
// done, or a name that is none, is refused with the reason.
func TestCDIUploadToken(t *testing.T) {
	f := setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	g.Expect(env.InstallCDICRDs()).To(Succeed())
	f.withTokens(t)
	api := &uploadproxy.TokenAPI{Reader: env.Client, Client: env.Client,
		Key: &uploadproxy.TokenKey{Client: env.Client, Namespace: f.ns, Name: "token-key"}}
	request := func(pvc string) []byte {
		return fmt.Appendf(nil, `{"apiVersion":"upload.cdi.kubevirt.io/v1beta1","kind":"UploadTokenRequest","metadata":{"name":"token-for-virtctl"},"spec":{"pvcName":%q}}`, pvc)
	}
	alice := authenticationv1.UserInfo{Username: "alice"}
	size := corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}
	for name, src := range map[string]*cdiv1.DataVolumeSource{"disk": {Upload: &cdiv1.DataVolumeSourceUpload{}},
		"early": {Upload: &cdiv1.DataVolumeSourceUpload{}}, "web": {HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://example.com/a.img"}}} {
		g.Expect(env.Client.Create(ctx, &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns},
			Spec: cdiv1.DataVolumeSpec{Source: src, Storage: &cdiv1.StorageSpec{Resources: size}}})).To(Succeed())
	}
	f.newImage(t, uploadproxy.DataVolumeImage("disk"), f.digest)

	got, err := uploadproxy.CDIToken(api, ctx, f.ns, request("disk"), alice)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got.Name).To(Equal("token-for-virtctl"))
	answer := f.cdiUpload(t, got.Status.Token, f.image)
	g.Eventually(func() string {
		resp, _ := f.do(t, http.MethodHead, "dv-disk", got.Status.Token, nil, "")
		return resp.Header.Get(uploadproxy.HeaderComplete)
	}, 20*time.Second, 200*time.Millisecond).Should(Equal("true"), "the token takes the upload to the DataVolume's image")
	g.Expect(env.Client.Delete(ctx, &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "dv-disk", Namespace: f.ns}})).To(Succeed())
	g.Eventually(answer, 20*time.Second).Should(Receive(HavePrefix("200 ")))

	for pvc, want := range map[string]string{
		"web":   "DataVolume " + f.ns + "/web does not take uploads: its source is not upload",
		"early": "DataVolume " + f.ns + "/early is not ready for its upload yet: wait for its phase UploadReady",
		"none":  "no DataVolume " + f.ns + "/none: diskpipe takes CDI uploads to a DataVolume of source upload (virtctl image-upload dv)",
		"Bad!":  `invalid UploadTokenRequest: spec.pvcName "Bad!"`,
	} {
		_, err := uploadproxy.CDIToken(api, ctx, f.ns, request(pvc), alice)
		g.Expect(err).To(MatchError(ContainSubstring(want)), pvc)
	}
}
