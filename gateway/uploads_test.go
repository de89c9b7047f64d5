package gateway_test

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"

	"github.com/diskpipe/diskpipe/gateway"
	"github.com/diskpipe/diskpipe/gateway/web"
	"github.com/diskpipe/diskpipe/internal/uploadproto"
	"github.com/diskpipe/diskpipe/objectstore/objectstoretest"
	"github.com/diskpipe/diskpipe/uploadproxy"
)

const partSize = 5 << 20

// withUploads gives the gateway an upload proxy (the real one, on a real store), and lets the
// editor of the first namespace upload.
func withUploads(t *testing.T, configure ...func(*uploadproxy.Server)) func(*gateway.Server) {
	t.Helper()
	store := objectstoretest.Start(t)
	proxy := &uploadproxy.Server{Kube: env.Client, Store: store.Client(), PartSize: partSize}
	for _, c := range configure {
		c(proxy)
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	return func(s *gateway.Server) { s.Uploads = &gateway.UploadProxy{URL: srv.URL, Client: srv.Client()} }
}

// do with headers, and the token in X-Diskpipe-Token instead of Authorization.
func (f *fixture) doWith(t *testing.T, caller, method, path string, body []byte, header ...string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, f.url+path, bytes.NewReader(body))
	must(t, err)
	req.Header.Set(gateway.HeaderToken, f.tokens[caller])
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return send(t, req, caller)
}

func uploadImage(ns, name string) string {
	return fmt.Sprintf(`{"apiVersion":"hypercloud.tmaxanc.com/v1alpha1","kind":"VirtualMachineImage","metadata":{"name":%q,"namespace":%q},
		"spec":{"source":{"upload":{}}}}`, name, ns)
}

// TestUploadsAsCaller: an upload started, sent in pieces and finished through the gateway by
// the editor, with the token only in X-Diskpipe-Token (as through the apiserver's service
// proxy) and the browser's digest on the last piece; each other caller refused by the proxy,
// which the gateway asks with the caller's own token, with the right they lack.
func TestUploadsAsCaller(t *testing.T) {
	f := newFixture(t, withUploads(t))
	ns := f.ns
	ctx := t.Context()
	must(t, env.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "upload", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"hypercloud.tmaxanc.com"}, Resources: []string{"virtualmachineimages/upload"}, Verbs: []string{"create"}}}}))
	must(t, env.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "upload", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "upload"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "editor", Namespace: ns}}}))

	data := make([]byte, 3*partSize+12345)
	_, _ = rand.Read(data)
	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	total := len(data)
	piece := func(caller string, from, to int, header ...string) answer {
		return f.doWith(t, caller, "PUT", "/projects/"+ns+"/uploads/up?kind=VirtualMachineImage", data[from:to],
			append([]string{"Content-Range", fmt.Sprintf("bytes %d-%d/%d", from, to-1, total)}, header...)...)
	}

	// Start: only an image whose source is an upload; the viewer may not make one.
	if a := f.doWith(t, "editor", "POST", "/projects/"+ns+"/uploads", []byte(image(ns, "not-upload"))); a.status != 400 || !strings.Contains(a.Message, "spec.source is upload") {
		t.Errorf("an http image as an upload: %d %s", a.status, a.Message)
	}
	if a := f.doWith(t, "viewer", "POST", "/projects/"+ns+"/uploads", []byte(uploadImage(ns, "up"))); a.status != 403 {
		t.Errorf("the viewer starts an upload: %d %s", a.status, a.Message)
	}
	if a := f.doWith(t, "editor", "POST", "/projects/"+ns+"/uploads", []byte(uploadImage(ns, "up"))); a.status != 201 {
		t.Fatalf("the editor starts an upload: %d %s", a.status, a.Message)
	}
	// The binding reaches the authorizer a moment later.
	deadline := time.Now().Add(10 * time.Second)
	var st struct {
		Offset, PartSize int64
		Complete         bool
	}
	for {
		a := f.doWith(t, "editor", "GET", "/projects/"+ns+"/uploads/up", nil)
		if a.status == 200 {
			must(t, json.Unmarshal(a.Data, &st))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the editor's upload state: %d %s", a.status, a.Message)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if st.Offset != 0 || st.PartSize != partSize || st.Complete {
		t.Errorf("a new upload's state: %+v", st)
	}

	// Everyone else is refused by the proxy, naming the right.
	for _, caller := range []string{"viewer", "other", "nobody"} {
		a := piece(caller, 0, 2*partSize)
		if a.status != 403 || !strings.Contains(a.header.Get(gateway.HeaderDenyReason), "may not create virtualmachineimages.hypercloud.tmaxanc.com/upload in namespace "+ns) {
			t.Errorf("%s sends a piece: %d %q %s", caller, a.status, a.header.Get(gateway.HeaderDenyReason), a.Message)
		}
	}
	// The editor's pieces; a piece off a part's boundary is refused with the part size.
	if a := piece("editor", 0, partSize+1); a.status != 400 || !strings.Contains(a.Message, "multiple of the part size") {
		t.Errorf("a piece off a part's boundary: %d %s", a.status, a.Message)
	}
	a := piece("editor", 0, 2*partSize)
	if a.status != 200 || a.header.Get(uploadproto.HeaderOffset) != fmt.Sprint(2*partSize) {
		t.Errorf("the first piece: %d %s %v", a.status, a.Message, a.header)
	}
	if a := piece("editor", 2*partSize, total, uploadproto.HeaderDigest, "sha256:"+strings.Repeat("ab", 32)); a.status != 422 || !strings.Contains(a.Message, "the client's of its file") {
		t.Errorf("a last piece with another digest: %d %s", a.status, a.Message)
	}
	// The wrong digest discarded the upload: it begins again.
	if a := piece("editor", 0, 2*partSize); a.status != 200 {
		t.Errorf("the first piece again: %d %s", a.status, a.Message)
	}
	a = piece("editor", 2*partSize, total, uploadproto.HeaderDigest, digest)
	must(t, json.Unmarshal(a.Data, &st))
	if a.status != 201 || !st.Complete || st.Offset != int64(total) || !strings.Contains(a.Message, digest) || a.AuditID == "" {
		t.Errorf("the last piece: %d %+v %s (audit %q)", a.status, st, a.Message, a.AuditID)
	}
	f.auditMu.Lock()
	lines := f.audit.String()
	f.auditMu.Unlock()
	if !strings.Contains(lines, `"operation":"upload","resource":"uploads","name":"up","status":201,"outcome":"Success"`) {
		t.Errorf("no audit line of the upload's end in:\n%s", lines)
	}
	// The uploads' list holds the upload's image, not the http one.
	l := f.doWith(t, "editor", "GET", "/projects/"+ns+"/uploads", nil)
	if !strings.Contains(string(l.Data), `"name":"up"`) || strings.Contains(string(l.Data), `"name":"img"`) || *l.Total != 1 {
		t.Errorf("the uploads: %s", l.Data)
	}
	// Cancel: the image goes.
	if a := f.doWith(t, "viewer", "DELETE", "/projects/"+ns+"/uploads/up", nil); a.status != 403 {
		t.Errorf("the viewer cancels: %d %s", a.status, a.Message)
	}
	if a := f.doWith(t, "editor", "DELETE", "/projects/"+ns+"/uploads/up", nil); a.status != 200 {
		t.Errorf("the editor cancels: %d %s", a.status, a.Message)
	}
}

// TestNoUploadProxy: a gateway with no upload proxy says so.
func TestNoUploadProxy(t *testing.T) {
	f := newFixture(t)
	if a := f.doWith(t, "editor", "GET", "/projects/"+f.ns+"/uploads/img", nil); a.status != 501 || !strings.Contains(a.Message, "--upload-proxy-url") {
		t.Errorf("%d %s", a.status, a.Message)
	}
}

// TestWatch: a watch streams a change event for each change the caller may see, as
// server-sent events; a caller who may watch nothing there is refused.
func TestWatch(t *testing.T) {
	f := newFixture(t)
	ns := f.ns
	req, err := http.NewRequestWithContext(t.Context(), "GET", f.url+"/projects/"+ns+"/images?watch=true", nil)
	must(t, err)
	req.Header.Set(gateway.HeaderToken, f.tokens["viewer"])
	resp, err := http.DefaultClient.Do(req) //nolint:bodyclose // closed below, once the stream is read
	must(t, err)
	body := resp.Body
	defer body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("the viewer's watch: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(body)
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "data: ") || strings.HasPrefix(line, "event: ") {
				events <- line
			}
		}
		close(events)
	}()
	u := &unstructured.Unstructured{}
	must(t, json.Unmarshal([]byte(image(ns, "watched")), &u.Object))
	must(t, env.Client.Create(t.Context(), u))
	timeout := time.After(10 * time.Second)
	for found := false; !found; {
		select {
		case line, ok := <-events:
			if !ok {
				t.Fatal("the stream ended")
			}
			found = strings.Contains(line, `"name":"watched"`) && strings.Contains(line, `"kind":"VirtualMachineImage"`)
		case <-timeout:
			t.Fatal("no change event for the new image")
		}
	}
	// A user's streams are bounded: the viewer has one open, and may open 15 more.
	for i := 1; i < 16; i++ {
		req, _ := http.NewRequestWithContext(t.Context(), "GET", f.url+"/projects/"+ns+"/images?watch=true", nil)
		req.Header.Set(gateway.HeaderToken, f.tokens["viewer"])
		r, err := http.DefaultClient.Do(req)
		must(t, err)
		t.Cleanup(func() { r.Body.Close() })
		if r.StatusCode != 200 {
			t.Fatalf("the viewer's watch %d: %d", i+1, r.StatusCode)
		}
	}
	if a := f.doWith(t, "viewer", "GET", "/projects/"+ns+"/images?watch=true", nil); a.status != 429 || !strings.Contains(a.Message, "has 16 watches open") {
		t.Errorf("the viewer's 17th watch: %d %s", a.status, a.Message)
	}
	for _, caller := range []string{"other", "nobody"} {
		if a := f.doWith(t, caller, "GET", "/projects/"+ns+"/images?watch=true", nil); a.status != 403 || !strings.Contains(a.header.Get(gateway.HeaderDenyReason), "may not watch") {
			t.Errorf("%s's watch: %d %s", caller, a.status, a.Message)
		}
	}
}

// TestCORS: a page of a configured origin may call the gateway; another site's gets no CORS
// answer, so its browser keeps the gateway's answers from it.
func TestCORS(t *testing.T) {
	f := newFixture(t, func(s *gateway.Server) { s.Origins = []string{"https://console.example.com"} })
	preflight := func(origin string) (int, http.Header) {
		req, _ := http.NewRequestWithContext(t.Context(), "OPTIONS", f.url+"/projects/"+f.ns+"/uploads/x", nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "PUT")
		req.Header.Set("Access-Control-Request-Headers", "x-diskpipe-token, content-range, upload-digest")
		resp, err := http.DefaultClient.Do(req)
		must(t, err)
		resp.Body.Close()
		return resp.StatusCode, resp.Header
	}
	code, h := preflight("https://console.example.com")
	if code != 204 || h.Get("Access-Control-Allow-Origin") != "https://console.example.com" ||
		!strings.Contains(h.Get("Access-Control-Allow-Headers"), gateway.HeaderToken) {
		t.Errorf("the configured origin's preflight: %d %v", code, h)
	}
	code, h = preflight("https://evil.example.net")
	if code != 403 || h.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("another origin's preflight: %d %v", code, h)
	}
	a := f.doWith(t, "editor", "GET", "/projects/"+f.ns+"/images", nil, "Origin", "https://evil.example.net")
	if a.header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("an answer to another origin carries CORS headers: %v", a.header)
	}
}

func ptrTo[T any](v T) *T { return &v }

// hostAddress is an address of this machine the apiserver may proxy to (it refuses loopback).
func hostAddress(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	must(t, err)
	for _, a := range addrs {
		if ip, ok := a.(*net.IPNet); ok && ip.IP.To4() != nil && !ip.IP.IsLoopback() && !ip.IP.IsLinkLocalUnicast() {
			return ip.IP.String()
		}
	}
	t.Skip("this machine has no address but loopback, where the apiserver's service proxy does not go")
	return ""
}

// TestThroughServiceProxy: the pages and the API reached through the apiserver's service
// proxy, as `kubectl proxy` users reach a Service: the apiserver takes Authorization for
// itself, and the caller's token passes in X-Diskpipe-Token; the page's files are named
// relative to it, so they load under the proxy's path.
func TestThroughServiceProxy(t *testing.T) {
	f := newFixture(t, withPages(t))
	host := hostAddress(t)
	l, err := net.Listen("tcp", host+":0")
	must(t, err)
	srv := &httptest.Server{Listener: l, Config: &http.Server{Handler: f.server.Handler(), ReadHeaderTimeout: 10 * time.Second}}
	srv.Start()
	t.Cleanup(srv.Close)
	port := l.Addr().(*net.TCPAddr).Port
	ctx := t.Context()
	must(t, env.Client.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "gateway", Namespace: f.ns},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt(port)}}}}))
	// The service proxy goes only to a pod's address: the gateway is said to be a pod's.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gateway", Namespace: f.ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "gateway", Image: "diskpipe"}}}}
	must(t, env.Client.Create(ctx, pod))
	pod.Status.PodIP, pod.Status.PodIPs = host, []corev1.PodIP{{IP: host}}
	must(t, env.Client.Status().Update(ctx, pod))
	must(t, env.Client.Create(ctx, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "gateway", Namespace: f.ns,
		Labels: map[string]string{discoveryv1.LabelServiceName: "gateway"}}, AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{host}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: f.ns, Name: "gateway"}}},
		Ports:     []discoveryv1.EndpointPort{{Name: ptrTo("http"), Port: ptrTo(int32(port))}}}))
	hc, err := rest.HTTPClientFor(env.Config)
	must(t, err)
	base := strings.TrimSuffix(env.Config.Host, "/") + "/api/v1/namespaces/" + f.ns + "/services/http:gateway:80/proxy/"
	get := func(path string, header ...string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+path, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := hc.Do(req)
		must(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// The apiserver learns the endpoints from its informer, a moment later.
	code, body := 0, ""
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if code, body = get(strings.TrimPrefix(gateway.Prefix, "/")+"/whoami", gateway.HeaderToken, f.tokens["viewer"]); code != 503 {
			break
		}
	}
	if code != 200 || !strings.Contains(body, `"username":"system:serviceaccount:`+f.ns+`:viewer"`) {
		t.Errorf("whoami through the service proxy: %d %s", code, body)
	}
	code, body = get("")
	if code != 200 || !strings.Contains(body, `<div id="app">`) {
		t.Fatalf("the page through the service proxy: %d %s", code, body)
	}
	for _, ref := range []string{`src="assets/`, `href="assets/`} {
		i := strings.Index(body, ref)
		if i < 0 {
			t.Fatalf("the page names no %s...: %s", ref, body)
		}
		asset := body[i+len(ref)-len("assets/"):]
		asset = asset[:strings.IndexByte(asset, '"')]
		if code, _ := get(asset); code != 200 {
			t.Errorf("%s through the service proxy: %d", asset, code)
		}
	}
}

// TestPages: the pages are served with a policy that runs nothing but the gateway's own files.
func TestPages(t *testing.T) {
	f := newFixture(t, withPages(t))
	resp, err := http.Get(f.root + "/")
	must(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	csp := resp.Header.Get("Content-Security-Policy")
	if resp.StatusCode != 200 || !strings.Contains(csp, "script-src 'self' 'wasm-unsafe-eval'") || !strings.Contains(csp, "default-src 'none'") ||
		!strings.Contains(string(body), `<div id="app">`) {
		t.Errorf("the page: %d %q %s", resp.StatusCode, csp, body)
	}
	missing, err := http.Get(f.root + "/assets/none.js")
	must(t, err)
	missing.Body.Close()
	if missing.StatusCode != 404 {
		t.Errorf("a missing asset: %d", missing.StatusCode)
	}
}

// withPages serves the built pages; a test of them fails, saying how to build them, if
// they were not (make web, which make test runs first).
func withPages(t *testing.T) func(*gateway.Server) {
	t.Helper()
	if !web.Built() {
		t.Fatal("the console's pages are not built into this test: make web")
	}
	return func(s *gateway.Server) { s.Pages = web.Handler() }
}

// TestExportDownload: an export's download link is read as the caller, from the Secret its
// status names: a caller who may read the namespace's Secrets gets it; one who may read the
// export but not Secrets is told which right they lack; another namespace's user gets nothing.
func TestExportDownload(t *testing.T) {
	f := newFixture(t)
	ns := f.ns
	ctx := t.Context()
	must(t, env.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "exports", Namespace: ns}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"hypercloud.tmaxanc.com"}, Resources: []string{"virtualmachinevolumeexports"}, Verbs: []string{"get", "list"}}}}))
	must(t, env.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "secrets", Namespace: ns}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}}}}))
	for caller, roles := range map[string][]string{"editor": {"exports", "secrets"}, "viewer": {"exports"}} {
		for _, role := range roles {
			must(t, env.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: caller + "-" + role, Namespace: ns},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role},
				Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: caller, Namespace: ns}}}))
		}
	}
	u := &unstructured.Unstructured{}
	must(t, json.Unmarshal([]byte(`{"apiVersion":"hypercloud.tmaxanc.com/v1alpha1","kind":"VirtualMachineVolumeExport","metadata":{"name":"ex","namespace":"`+ns+`"},
		"spec":{"pvcName":"disk","objectStore":{"bucketName":"exports","objectName":"disk.qcow2"}}}`), &u.Object))
	must(t, env.Client.Create(ctx, u))
	if a := f.doWith(t, "editor", "GET", "/projects/"+ns+"/exports/ex/download", nil); a.status != 409 || !strings.Contains(a.Message, "has no download link yet") {
		t.Errorf("an export not Ready: %d %s", a.status, a.Message)
	}
	must(t, env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ex-download", Namespace: ns},
		Data: map[string][]byte{"url": []byte("https://store.example.com/exports/disk.qcow2?X-Amz-Signature=abc")}}))
	must(t, unstructured.SetNestedField(u.Object, "ex-download", "status", "downloadSecretName"))
	must(t, env.Client.Status().Update(ctx, u))
	deadline := time.Now().Add(10 * time.Second) // the bindings reach the authorizer a moment later
	var a answer
	for a = f.doWith(t, "editor", "GET", "/projects/"+ns+"/exports/ex/download", nil); a.status != 200 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		a = f.doWith(t, "editor", "GET", "/projects/"+ns+"/exports/ex/download", nil)
	}
	if a.status != 200 || !strings.Contains(string(a.Data), "X-Amz-Signature=abc") {
		t.Errorf("the editor's link: %d %s %s", a.status, a.Message, a.Data)
	}
	if a := f.doWith(t, "viewer", "GET", "/projects/"+ns+"/exports/ex/download", nil); a.status != 403 ||
		a.header.Get(gateway.HeaderDenyReason) != "system:serviceaccount:"+ns+":viewer may not get secrets in namespace "+ns || strings.Contains(string(a.Data), "Signature") {
		t.Errorf("the viewer's link: %d %q %s", a.status, a.header.Get(gateway.HeaderDenyReason), a.Message)
	}
	if a := f.doWith(t, "other", "GET", "/projects/"+ns+"/exports/ex/download", nil); a.status != 403 {
		t.Errorf("another namespace's user: %d %s", a.status, a.Message)
	}
}
