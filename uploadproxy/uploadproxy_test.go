package uploadproxy_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/objectstore/objectstoretest"
	"github.com/diskpipe/diskpipe/objectstore/uploads"
	"github.com/diskpipe/diskpipe/test/testenv"
	"github.com/diskpipe/diskpipe/uploadproxy"
	"github.com/diskpipe/diskpipe/uploadproxy/cdiupload"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.RunTests(m, &env) }

const partSize = 5 << 20 // S3's smallest part

// fixture is a namespace with an uploader that may upload and a viewer that may not, their
// tokens, and the proxy in front of a real store.
type fixture struct {
	ns, url          string
	uploader, viewer string
	store            *objectstoretest.Server
	image            []byte
	digest           string
	configure        []func(*uploadproxy.Server)
}

func setup(t *testing.T, configure ...func(*uploadproxy.Server)) *fixture {
	t.Helper()
	return setupOn(t, objectstoretest.Start(t), configure...)
}

// setupOn is a fixture of a new namespace and proxy on store.
func setupOn(t *testing.T, store *objectstoretest.Server, configure ...func(*uploadproxy.Server)) *fixture {
	t.Helper()
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "upload")
	g.Expect(err).NotTo(HaveOccurred())
	f := &fixture{ns: ns, store: store, image: make([]byte, 24<<20), configure: configure}
	_, _ = rand.Read(f.image)
	sum := sha256.Sum256(f.image)
	f.digest = "sha256:" + hex.EncodeToString(sum[:])
	g.Expect(env.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "upload", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"hypercloud.tmaxanc.com"}, Resources: []string{"virtualmachineimages/upload"}, Verbs: []string{"create"}}}})).To(Succeed())
	g.Expect(env.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "uploader", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "upload"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "uploader", Namespace: ns}}})).To(Succeed())
	f.uploader, f.viewer = token(t, ns, "uploader"), token(t, ns, "viewer")
	proxy := &uploadproxy.Server{Kube: env.Client, Store: f.store.Client(), PartSize: partSize}
	proxy.Doors = cdiupload.Doors(proxy)
	for _, c := range configure {
		c(proxy)
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	// The apiserver's authorizer learns the new binding a moment later: until then the
	// uploader is refused (403), after it told that an image is missing (404).
	g.Eventually(func() int {
		resp, _ := f.do(t, http.MethodHead, "none", f.uploader, nil, "")
		return resp.StatusCode
	}, 10*time.Second, 50*time.Millisecond).Should(Equal(http.StatusNotFound), "the uploader's binding takes effect")
	return f
}

// token is a real service-account token from the apiserver's TokenRequest API.
func token(t *testing.T, ns, sa string) string {
	t.Helper()
	g := NewWithT(t)
	acct := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: ns}}
	g.Expect(env.Client.Create(t.Context(), acct)).To(Succeed())
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600))}}
	g.Expect(env.Client.SubResource("token").Create(t.Context(), acct, tr)).To(Succeed())
	return tr.Status.Token
}

func ptrTo[T any](v T) *T { return &v }

func (f *fixture) newImage(t *testing.T, name, checksum string) {
	t.Helper()
	vmi := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.ns},
		Spec: hypercloud.VirtualMachineImageSpec{Source: hypercloud.VirtualMachineImageSource{Upload: &common.UploadSource{},
			Checksum: common.Checksum(checksum)}}}
	NewWithT(t).Expect(env.Client.Create(t.Context(), vmi)).To(Succeed())
}

func (f *fixture) path(name string) string {
	return fmt.Sprintf("%s/v1/namespaces/%s/virtualmachineimages/%s", f.url, f.ns, name)
}

// reply is what the proxy answered.
type reply struct {
	StatusCode int
	Header     http.Header
}

func (f *fixture) do(t *testing.T, method, name, token string, body []byte, contentRange string, header ...string) (reply, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, f.path(name), bytes.NewReader(body))
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if contentRange != "" {
		req.Header.Set("Content-Range", contentRange)
	}
	resp, err := http.DefaultClient.Do(req)
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header}, strings.TrimSpace(string(b))
}

// TestAuth: no token is 401, a token without the upload right 403, naming what is missing.
func TestAuth(t *testing.T) {
	f := setup(t)
	g := NewWithT(t)
	f.newImage(t, "img", "")
	resp, msg := f.do(t, http.MethodPut, "img", "", f.image, "")
	g.Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized), msg)
	resp, msg = f.do(t, http.MethodPut, "img", "not-a-token", f.image, "")
	g.Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized), msg)
	resp, msg = f.do(t, http.MethodPut, "img", f.viewer, f.image, "")
	g.Expect(resp.StatusCode).To(Equal(http.StatusForbidden))
	g.Expect(msg).To(Equal(fmt.Sprintf("system:serviceaccount:%s:viewer may not upload to virtualmachineimages %s/img: it needs create on virtualmachineimages/upload", f.ns, f.ns)))
	resp, msg = f.do(t, http.MethodPut, "missing", f.uploader, f.image, "")
	g.Expect(resp.StatusCode).To(Equal(http.StatusNotFound))
	g.Expect(msg).To(Equal("virtualmachineimages " + f.ns + "/missing does not exist"))
}

// cut sends the first n bytes of the image to name's upload, said to be whole, and cuts the
// connection once the parts among them are stored.
func (f *fixture) cut(t *testing.T, name string, n int) {
	t.Helper()
	g := NewWithT(t)
	host := strings.TrimPrefix(f.url, "http://")
	conn, err := net.Dial("tcp", host)
	g.Expect(err).NotTo(HaveOccurred())
	defer conn.Close()
	u := strings.TrimPrefix(f.path(name), f.url)
	fmt.Fprintf(conn, "PUT %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n", u, host, f.uploader, len(f.image))
	_, err = conn.Write(f.image[:n])
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(func() string {
		resp, _ := f.do(t, http.MethodHead, name, f.uploader, nil, "")
		return resp.Header.Get(uploadproxy.HeaderOffset)
	}, 10*time.Second).Should(Equal(strconv.Itoa(n/partSize*partSize)), "the parts stored before the cut")
}

// TestResume cuts the connection halfway through, resumes from the offset HEAD reports, and
// checks the stored object is the image, byte for byte (read back with awscli).
func TestResume(t *testing.T) {
	f := setup(t)
	g := NewWithT(t)
	f.newImage(t, "big", f.digest)

	// Half the body, then the connection is cut.
	f.cut(t, "big", len(f.image)/2)

	resp, _ := f.do(t, http.MethodHead, "big", f.uploader, nil, "")
	offset, _ := strconv.Atoi(resp.Header.Get(uploadproxy.HeaderOffset))
	g.Expect(resp.Header.Get(uploadproxy.HeaderComplete)).To(Equal("false"))
	resp, msg := f.do(t, http.MethodPut, "big", f.uploader, f.image[offset:], fmt.Sprintf("bytes %d-%d/%d", offset, len(f.image)-1, len(f.image)))
	g.Expect(resp.StatusCode).To(Equal(http.StatusCreated), msg)
	g.Expect(msg).To(Equal(fmt.Sprintf("uploaded %d bytes, %s", len(f.image), f.digest)))

	// The stored object, read back with awscli, is the image.
	key := objectKey(t, f, "big")
	out := filepath.Join(t.TempDir(), "back")
	o, err := f.store.AWS(t.Context(), f.store.SecretKey, "s3", "cp", "s3://"+uploads.Bucket+"/"+key, out)
	g.Expect(err).NotTo(HaveOccurred(), o)
	back, err := os.ReadFile(out)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(bytes.Equal(back, f.image)).To(BeTrue(), "the object differs from the upload")
	_, err = f.store.Client().StatObject(t.Context(), uploads.Bucket, uploads.MarkerKey(key), minio.StatObjectOptions{})
	g.Expect(err).NotTo(HaveOccurred(), "the upload is marked whole")

	resp, _ = f.do(t, http.MethodHead, "big", f.uploader, nil, "")
	g.Expect(resp.Header.Get(uploadproxy.HeaderComplete)).To(Equal("true"))
	resp, msg = f.do(t, http.MethodPut, "big", f.uploader, f.image, "")
	g.Expect(resp.StatusCode).To(Equal(http.StatusConflict), msg)
}

// TestPieces sends an upload piece by piece, as the console's browser does: a piece that stops
// off a part's boundary is refused, a piece sent twice is skipped, and the last piece's
// Upload-Digest is checked against the proxy's own digest: a wrong one, or one of another
// algorithm, stores nothing.
func TestPieces(t *testing.T) {
	f := setup(t)
	g := NewWithT(t)
	total := len(f.image)
	piece := func(name string, from, to int, header ...string) (reply, string) {
		return f.do(t, http.MethodPut, name, f.uploader, f.image[from:to], fmt.Sprintf("bytes %d-%d/%d", from, to-1, total), header...)
	}
	f.newImage(t, "pieces", "")
	resp, _ := f.do(t, http.MethodHead, "pieces", f.uploader, nil, "")
	g.Expect(resp.Header.Get(uploadproxy.HeaderPartSize)).To(Equal(strconv.Itoa(partSize)))

	resp, msg := piece("pieces", 0, partSize+1)
	g.Expect(resp.StatusCode).To(Equal(http.StatusBadRequest), msg)
	g.Expect(msg).To(ContainSubstring(fmt.Sprintf("or stop at a multiple of the part size, %d bytes", partSize)))

	resp, msg = piece("pieces", 0, 2*partSize, uploadproxy.HeaderDigest, f.digest)
	g.Expect(resp.StatusCode).To(Equal(http.StatusBadRequest), msg)
	g.Expect(msg).To(ContainSubstring("goes with the piece that ends the upload"))
	for _, to := range []int{2 * partSize, 2 * partSize, 4 * partSize} { // the second is sent again
		from := to - 2*partSize
		resp, msg = piece("pieces", from, to)
		g.Expect(resp.StatusCode).To(Equal(http.StatusNoContent), msg)
		g.Expect(resp.Header.Get(uploadproxy.HeaderOffset)).To(Equal(strconv.Itoa(to)))
	}
	resp, _ = f.do(t, http.MethodHead, "pieces", f.uploader, nil, "")
	g.Expect(resp.Header.Get(uploadproxy.HeaderLength)).To(Equal(strconv.Itoa(total)), "the size a piece said")
	resp, msg = piece("pieces", 4*partSize, total, uploadproxy.HeaderDigest, "sha512:"+strings.Repeat("0", 128))
	g.Expect(resp.StatusCode).To(Equal(http.StatusBadRequest), msg)
	g.Expect(msg).To(ContainSubstring("this upload is hashed with sha256"))
	resp, msg = piece("pieces", 4*partSize, total, uploadproxy.HeaderDigest, f.digest)
	g.Expect(resp.StatusCode).To(Equal(http.StatusCreated), msg)
	g.Expect(msg).To(Equal(fmt.Sprintf("uploaded %d bytes, %s", total, f.digest)))

	// The same file, one byte of it changed on the way: the client's digest is of its file.
	f.newImage(t, "changed", "")
	resp, msg = piece("changed", 0, 4*partSize)
	g.Expect(resp.StatusCode).To(Equal(http.StatusNoContent), msg)
	damaged := bytes.Clone(f.image[4*partSize:])
	damaged[0] ^= 1
	resp, msg = f.do(t, http.MethodPut, "changed", f.uploader, damaged, fmt.Sprintf("bytes %d-%d/%d", 4*partSize, total-1, total), uploadproxy.HeaderDigest, f.digest)
	g.Expect(resp.StatusCode).To(Equal(http.StatusUnprocessableEntity), msg)
	g.Expect(msg).To(ContainSubstring("the client's of its file " + strings.TrimPrefix(f.digest, "sha256:")))
	key := objectKey(t, f, "changed")
	for _, k := range []string{key, uploads.MarkerKey(key)} {
		_, err := f.store.Client().StatObject(t.Context(), uploads.Bucket, k, minio.StatObjectOptions{})
		g.Expect(minio.ToErrorResponse(err).StatusCode).To(Equal(http.StatusNotFound), k)
	}
}

// TestWrongChecksum rejects an upload whose bytes do not match the image's checksum and
// keeps nothing, so nothing is imported.
// TestHeadBesideUpload: HEADs, as fast as they are answered, from before an upload begins
// until it ends (while its multipart upload is made and before its state is first saved, then
// while its parts are stored) leave the upload alone, which finishes whole. Three times: the
// first moments are a race.
func TestHeadBesideUpload(t *testing.T) {
	f := setup(t)
	g := NewWithT(t)
	for i := range 3 {
		name := fmt.Sprintf("busy%d", i)
		f.newImage(t, name, f.digest)
		stop, heads := make(chan struct{}), make(chan int)
		go func() {
			n := 0
			defer func() { heads <- n }()
			for {
				select {
				case <-stop:
					return
				default:
					_, _ = f.do(t, http.MethodHead, name, f.uploader, nil, "")
					n++
				}
			}
		}()
		resp, msg := f.do(t, http.MethodPut, name, f.uploader, f.image, "")
		close(stop)
		t.Logf("%d HEADs beside the upload", <-heads)
		g.Expect(resp.StatusCode).To(Equal(http.StatusCreated), msg)
		head, _ := f.do(t, http.MethodHead, name, f.uploader, nil, "")
		g.Expect(head.Header.Get(uploadproxy.HeaderComplete)).To(Equal("true"))
	}
}

// TestWritersBounded: each upload being written holds a part in memory, so the proxy writes
// at most MaxWriters at once, and MaxWritersPerNamespace of one namespace; a request over
// either is answered 503 with Retry-After, and is taken once a slot is free.
func TestWritersBounded(t *testing.T) {
	for _, c := range []struct {
		total, perNamespace int
		want                string
	}{
		{4, 2, "namespace %s has 2 uploads being written, as many as the proxy takes at once from a namespace: try again in 10 s"},
		{2, 4, "the proxy is writing 2 uploads, as many as it takes at once: try again in 10 s"},
	} {
		f := setup(t, func(s *uploadproxy.Server) { s.MaxWriters, s.MaxWritersPerNamespace = c.total, c.perNamespace })
		g := NewWithT(t)
		var slow []*io.PipeWriter
		for i := range 2 {
			name := fmt.Sprintf("slow%d", i)
			f.newImage(t, name, "")
			r, w := io.Pipe()
			slow = append(slow, w)
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, f.path(name), r)
			g.Expect(err).NotTo(HaveOccurred())
			req.Header.Set("Authorization", "Bearer "+f.uploader)
			req.ContentLength = int64(len(f.image))
			go func() {
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			}()
			// A whole part: once it is stored, the upload is in its writing loop, holding its slot.
			_, _ = w.Write(f.image[:partSize])
			// One at a time: a second slow upload sent before the first holds its slot could
			// be the one refused.
			g.Eventually(func() string {
				head, _ := f.do(t, http.MethodHead, name, f.uploader, nil, "")
				return head.Header.Get(uploadproxy.HeaderOffset)
			}, 20*time.Second, 50*time.Millisecond).Should(Equal(strconv.Itoa(partSize)), "%s holds its slot", name)
		}
		f.newImage(t, "next", "")
		last, msg := f.do(t, http.MethodPut, "next", f.uploader, f.image, "")
		g.Expect(msg).To(Equal(strings.ReplaceAll(c.want, "%s", f.ns)), "total %d, per namespace %d", c.total, c.perNamespace)
		g.Expect(last.StatusCode).To(Equal(http.StatusServiceUnavailable))
		g.Expect(last.Header.Get("Retry-After")).To(Equal("10"))
		for _, w := range slow {
			_ = w.CloseWithError(io.ErrUnexpectedEOF)
		}
		f.newImage(t, "after", "")
		g.Eventually(func() int {
			resp, _ := f.do(t, http.MethodPut, "after", f.uploader, f.image, "")
			return resp.StatusCode
		}, 20*time.Second, 200*time.Millisecond).Should(Equal(http.StatusCreated), "taken once the slow uploads ended")
	}
}

// TestSlowBodyEnded: a body slower than the least rate, or one that stops, holds its writer's
// slot until it is ended with 408, saying what is stored; then the slot is another's.
func TestSlowBodyEnded(t *testing.T) {
	logged := &lockedBuffer{}
	f := setup(t, func(s *uploadproxy.Server) {
		s.MaxWriters, s.MinBytesPerSecond, s.BodyWindow = 1, 1<<20, time.Second
		s.Log = slog.New(slog.NewTextHandler(logged, nil))
	})
	g := NewWithT(t)
	f.newImage(t, "slow", "")
	f.newImage(t, "next", "")
	for _, c := range []struct {
		path, contentType string
		want              string
	}{
		{f.path("slow"), "", "408 the body came at "},
		{f.path("slow"), "", "408 the body stopped after byte 1024"},
	} {
		r, w := io.Pipe()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, c.path, r)
		g.Expect(err).NotTo(HaveOccurred())
		req.Header.Set("Authorization", "Bearer "+f.uploader)
		req.ContentLength = int64(len(f.image))
		answer := make(chan string, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				answer <- err.Error()
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			answer <- fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
		}()
		stop := make(chan struct{})
		go func() { // a trickle, or nothing after the first KiB
			for i := 0; ; i++ {
				if _, err := w.Write(f.image[i<<10 : (i+1)<<10]); err != nil || strings.Contains(c.want, "stopped") {
					<-stop
					return
				}
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
		}()
		// Its slot taken, the proxy logs the upload.
		g.Eventually(logged.String, 5*time.Second, 20*time.Millisecond).Should(ContainSubstring("msg=Upload key=" + f.ns + "/virtualmachineimages/slow-"))
		logged.Reset()
		_, msg := f.do(t, http.MethodPut, "next", f.uploader, f.image, "")
		g.Expect(msg).To(HavePrefix("the proxy is writing 1 uploads"), "the slow upload holds the slot")
		var got string
		g.Eventually(answer, 10*time.Second).Should(Receive(&got))
		g.Expect(got).To(And(HavePrefix(c.want), HaveSuffix("0 bytes are stored; resume from there")))
		close(stop)
		_ = w.Close()
	}
	resp, msg := f.do(t, http.MethodPut, "next", f.uploader, f.image, "")
	g.Expect(resp.StatusCode).To(Equal(http.StatusCreated), msg)
}

// lockedBuffer is a log written from the proxy's requests and read by the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *lockedBuffer) Reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.Reset()
}

func TestWrongChecksum(t *testing.T) {
	f := setup(t)
	g := NewWithT(t)
	other := sha256.Sum256([]byte("another image"))
	f.newImage(t, "bad", "sha256:"+hex.EncodeToString(other[:]))
	resp, msg := f.do(t, http.MethodPut, "bad", f.uploader, f.image, "")
	g.Expect(resp.StatusCode).To(Equal(http.StatusUnprocessableEntity))
	g.Expect(msg).To(HavePrefix("checksum mismatch: the source's sha256 is " + strings.TrimPrefix(f.digest, "sha256:")))
	key := objectKey(t, f, "bad")
	for _, k := range []string{key, uploads.MarkerKey(key)} {
		_, err := f.store.Client().StatObject(t.Context(), uploads.Bucket, k, minio.StatObjectOptions{})
		g.Expect(minio.ToErrorResponse(err).StatusCode).To(Equal(http.StatusNotFound), k)
	}
}

func objectKey(t *testing.T, f *fixture, name string) string {
	t.Helper()
	vmi := &hypercloud.VirtualMachineImage{}
	NewWithT(t).Expect(env.Client.Get(t.Context(), clientKey(f.ns, name), vmi)).To(Succeed())
	return uploads.ObjectKey(f.ns, "virtualmachineimages", name, string(vmi.UID))
}

func clientKey(ns, name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }

// TestPartSizeKept: an upload keeps the part size it began with, though the proxy that goes on
// with it has another: its pieces stay aligned, and its parts complete.
func TestPartSizeKept(t *testing.T) {
	f := setup(t)
	g := NewWithT(t)
	total := len(f.image)
	f.newImage(t, "kept", "")
	resp, msg := f.do(t, http.MethodPut, "kept", f.uploader, f.image[:2*partSize], fmt.Sprintf("bytes 0-%d/%d", 2*partSize-1, total))
	g.Expect(resp.StatusCode).To(Equal(http.StatusNoContent), msg)

	// Another proxy, of another part size, on the same store.
	other := &uploadproxy.Server{Kube: env.Client, Store: f.store.Client(), PartSize: 8 << 20}
	srv := httptest.NewServer(other)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	resp, _ = f.do(t, http.MethodHead, "kept", f.uploader, nil, "")
	g.Expect(resp.Header.Get(uploadproxy.HeaderPartSize)).To(Equal(strconv.Itoa(partSize)), "the upload's own part size")
	resp, msg = f.do(t, http.MethodPut, "kept", f.uploader, f.image[2*partSize:3*partSize], fmt.Sprintf("bytes %d-%d/%d", 2*partSize, 3*partSize-1, total))
	g.Expect(resp.StatusCode).To(Equal(http.StatusNoContent), msg)
	resp, msg = f.do(t, http.MethodPut, "kept", f.uploader, f.image[3*partSize:], fmt.Sprintf("bytes %d-%d/%d", 3*partSize, total-1, total), uploadproxy.HeaderDigest, f.digest)
	g.Expect(resp.StatusCode).To(Equal(http.StatusCreated), msg)
	g.Expect(msg).To(Equal(fmt.Sprintf("uploaded %d bytes, %s", total, f.digest)))
}
