package uploadproxy_test

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/internal/uploadtoken"
	"github.com/diskpipe/diskpipe/objectstore"
	"github.com/diskpipe/diskpipe/objectstore/uploads"
	"github.com/diskpipe/diskpipe/uploadproxy"
	"github.com/diskpipe/diskpipe/uploadproxy/cdiupload"
)

// withTokens is a proxy that takes upload tokens signed with the key in a Secret of f.ns.
func (f *fixture) withTokens(t *testing.T) []byte {
	t.Helper()
	key := bytes.Repeat([]byte{7}, 32)
	NewWithT(t).Expect(env.Client.Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "token-key", Namespace: f.ns},
		Data: map[string][]byte{"key": key}})).To(Succeed())
	proxy := &uploadproxy.Server{Kube: env.Client, Store: f.store.Client(), PartSize: partSize,
		TokenKey: &uploadtoken.Key{Client: env.Client, Namespace: f.ns, Name: "token-key"}}
	proxy.Doors = cdiupload.Doors(proxy)
	for _, c := range f.configure {
		c(proxy)
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return key
}

func (f *fixture) token(t *testing.T, key []byte, name string, expires time.Time) string {
	t.Helper()
	vmi := &hypercloud.VirtualMachineImage{}
	NewWithT(t).Expect(env.Client.Get(t.Context(), clientKey(f.ns, name), vmi)).To(Succeed())
	tok, err := uploadtoken.Issue(key, uploadtoken.Claims{Namespace: f.ns, Resource: "virtualmachineimages", Name: name,
		UID: string(vmi.UID), User: "alice", Expires: expires.Unix()})
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	return tok
}

// TestUploadToken: a token uploads to its own image only, until it expires; a forged one, or
// one for an image since deleted and made again, is refused with the reason.
func TestUploadToken(t *testing.T) {
	f := setup(t)
	g := NewWithT(t)
	key := f.withTokens(t)
	f.newImage(t, "mine", f.digest)
	f.newImage(t, "other", "")
	soon := time.Now().Add(time.Minute)
	mine := f.token(t, key, "mine", soon)

	resp, msg := f.do(t, http.MethodPut, "other", mine, f.image, "")
	g.Expect(resp.StatusCode).To(Equal(http.StatusForbidden))
	g.Expect(msg).To(Equal(fmt.Sprintf("the upload token is for virtualmachineimages %s/mine, not virtualmachineimages %s/other", f.ns, f.ns)))

	resp, msg = f.do(t, http.MethodPut, "mine", f.token(t, key, "mine", time.Now().Add(-time.Second)), f.image, "")
	g.Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized))
	g.Expect(msg).To(HavePrefix("the upload token is not valid: it expired at "))

	forged, _ := uploadtoken.Issue(bytes.Repeat([]byte{8}, 32), uploadtoken.Claims{Namespace: f.ns, Resource: "virtualmachineimages", Name: "mine", Expires: soon.Unix()})
	resp, msg = f.do(t, http.MethodPut, "mine", forged, f.image, "")
	g.Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized))
	g.Expect(msg).To(ContainSubstring("its signature does not match"))

	// In the header the apiserver's service proxy passes on, and as a bearer token.
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, f.path("mine"), bytes.NewReader(f.image))
	req.Header.Set(uploadtoken.Header, mine)
	r, err := http.DefaultClient.Do(req)
	g.Expect(err).NotTo(HaveOccurred())
	r.Body.Close()
	g.Expect(r.StatusCode).To(Equal(http.StatusCreated))

	// The same name, a new image: the old token does not reach it.
	old := f.token(t, key, "other", soon)
	g.Expect(env.Client.Delete(t.Context(), &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: f.ns}})).To(Succeed())
	g.Eventually(func() error {
		return env.Client.Get(t.Context(), clientKey(f.ns, "other"), &hypercloud.VirtualMachineImage{})
	}).ShouldNot(Succeed())
	f.newImage(t, "other", "")
	resp, msg = f.do(t, http.MethodHead, "other", old, nil, "")
	g.Expect(resp.StatusCode).To(Equal(http.StatusForbidden), msg)
}

// countingStore is a reverse proxy in front of the store that counts reads of objects.
func countingStore(t *testing.T, f *fixture) (client *objectstore.Client, reads, all *atomic.Int64) {
	t.Helper()
	target, _ := url.Parse(f.store.Endpoint)
	reads, all = &atomic.Int64{}, &atomic.Int64{}
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		all.Add(1)
		path := r.URL.Path
		if r.Method == http.MethodGet && strings.HasPrefix(path, "/"+uploads.Bucket+"/") && !strings.HasSuffix(path, ".state") && r.URL.RawQuery == "" {
			reads.Add(1)
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	cfg := f.store.ClientConfig()
	cfg.Endpoint = srv.URL
	c, err := objectstore.NewClient(cfg)
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	return c, reads, all
}

// TestHashedOnce: an upload cut halfway, resumed through a new proxy (a restart), is verified
// against its checksum from the hash state saved with it: the object is never read back. A
// wrong checksum is still caught after the restart.
func TestHashedOnce(t *testing.T) {
	f := setup(t)
	g := NewWithT(t)
	store, reads, all := countingStore(t, f)
	for _, tc := range []struct {
		name, checksum string
		want           int
	}{{"right", f.digest, http.StatusCreated}, {"wrong", "sha256:" + strings.Repeat("0", 64), http.StatusUnprocessableEntity}} {
		f.newImage(t, tc.name, tc.checksum)
		first := httptest.NewServer(&uploadproxy.Server{Kube: env.Client, Store: store, PartSize: partSize})
		host := strings.TrimPrefix(first.URL, "http://")
		conn, err := net.Dial("tcp", host)
		g.Expect(err).NotTo(HaveOccurred())
		u := strings.TrimPrefix(f.path(tc.name), f.url)
		fmt.Fprintf(conn, "PUT %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n", u, host, f.uploader, len(f.image))
		_, err = conn.Write(f.image[:len(f.image)/2])
		g.Expect(err).NotTo(HaveOccurred())
		f.url = first.URL
		g.Eventually(func() string {
			resp, _ := f.do(t, http.MethodHead, tc.name, f.uploader, nil, "")
			return resp.Header.Get(uploadproxy.HeaderOffset)
		}, 10*time.Second).Should(Equal(strconv.Itoa(2 * partSize)))
		conn.Close()
		first.CloseClientConnections()
		first.Close()

		second := httptest.NewServer(&uploadproxy.Server{Kube: env.Client, Store: store, PartSize: partSize})
		f.url = second.URL
		resp, _ := f.do(t, http.MethodHead, tc.name, f.uploader, nil, "")
		g.Expect(resp.Header.Get(uploadproxy.HeaderOffset)).To(Equal(strconv.Itoa(2*partSize)), "the new proxy knows the offset")
		off := 2 * partSize
		resp, msg := f.do(t, http.MethodPut, tc.name, f.uploader, f.image[off:], fmt.Sprintf("bytes %d-%d/%d", off, len(f.image)-1, len(f.image)))
		g.Expect(resp.StatusCode).To(Equal(tc.want), msg)
		if tc.want == http.StatusCreated {
			g.Expect(msg).To(Equal(fmt.Sprintf("uploaded %d bytes, %s", len(f.image), f.digest)))
		}
		second.Close()
	}
	g.Expect(all.Load()).To(BeNumerically(">", 10), "requests to the store through the counter")
	g.Expect(reads.Load()).To(BeZero(), "objects read back from the store")
}
