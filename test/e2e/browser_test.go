package e2e

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"

	chromebrowser "github.com/diskpipe/diskpipe/test/browser"
	"github.com/diskpipe/diskpipe/test/testenv"
	"github.com/diskpipe/diskpipe/uploadproxy"
)

// browser is a headless Chromium (Debian's, hack/setup.sh) driven as a person would drive it:
// what its console says is kept, every dialog is accepted (the page asks before a reload
// leaves an upload), and each PUT's Content-Range is noted.
type browser struct {
	ctx     context.Context
	mu      sync.Mutex
	console []chromedp.ConsoleMessage
	ranges  []string
	shots   string
}

// newBrowser starts a browser with a profile of its own: a second one is another person.
func newBrowser(shots string) *browser {
	GinkgoHelper()
	ctx, cancel, err := chromebrowser.New(GinkgoT().TempDir())
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(cancel)
	b := &browser{ctx: ctx, shots: shots}
	// A failed spec keeps what its page showed.
	DeferCleanup(func() {
		if r := CurrentSpecReport(); r.Failed() {
			if png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot()); err == nil {
				p := filepath.Join(shots, "failed-"+strings.ReplaceAll(r.LeafNodeText, " ", "-")[:min(40, len(r.LeafNodeText))]+".png")
				_ = os.WriteFile(p, png, 0o644)
				GinkgoWriter.Printf("screenshot of the failure %s\n", p)
			}
		}
	})
	console := chromedp.Console(ctx)
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	requests := chromedp.Events(ctx, network.RequestWillBeSent)
	_, err = chromedp.Call(ctx, network.Enable, network.EnableParams{})
	Expect(err).NotTo(HaveOccurred())
	go func() {
		for m, err := range console {
			if err != nil {
				return
			}
			b.mu.Lock()
			b.console = append(b.console, m)
			b.mu.Unlock()
		}
	}()
	go func() {
		for _, err := range dialogs {
			if err != nil {
				return
			}
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}()
	go func() {
		for ev, err := range requests {
			if err != nil {
				return
			}
			if cr, ok := ev.Request.Headers["Content-Range"].(string); ok && ev.Request.Method == "PUT" {
				b.mu.Lock()
				b.ranges = append(b.ranges, cr)
				b.mu.Unlock()
			}
		}
	}()
	return b
}

// run runs the steps, for three minutes at most.
func (b *browser) run(steps ...chromedp.Action[chromedp.Void]) {
	GinkgoHelper()
	ctx, cancel := context.WithTimeout(b.ctx, 3*time.Minute)
	defer cancel()
	Expect(chromedp.Do(ctx, steps...)).To(Succeed())
}

func css(sel string) chromedp.CSS { return chromedp.CSS(sel) }

// shot keeps a screenshot of what the page shows as name.png among the test's artifacts.
func (b *browser) shot(name string) {
	GinkgoHelper()
	b.run(chromedp.Sleep(300 * time.Millisecond))
	png, err := chromedp.Run(b.ctx, chromedp.CaptureScreenshot())
	Expect(err).NotTo(HaveOccurred())
	p := filepath.Join(b.shots, name+".png")
	Expect(os.WriteFile(p, png, 0o644)).To(Succeed())
	GinkgoWriter.Printf("screenshot %s\n", p)
}

// signIn opens the console and signs in with token, in namespace ns.
func (b *browser) signIn(url, token, ns string) {
	GinkgoHelper()
	b.run(chromebrowser.SignIn(url, token, ns))
}

// network takes the page's network away (DevTools' offline emulation) or gives it back.
func (b *browser) network(online bool) {
	GinkgoHelper()
	var rules []*network.Conditions
	if !online {
		rules = []*network.Conditions{{Offline: true}}
	}
	_, err := chromedp.Call(b.ctx, network.EmulateNetworkConditionsByRule, network.EmulateNetworkConditionsByRuleParams{MatchedNetworkConditions: rules})
	Expect(err).NotTo(HaveOccurred())
}

// download clicks the link of sel, lets the browser save what it fetches, and answers where
// the file is once the browser says it is complete.
func (b *browser) download(sel chromedp.CSS) string {
	GinkgoHelper()
	dir := GinkgoT().TempDir()
	events := chromedp.BrowserEvents(b.ctx, cdpbrowser.DownloadProgress)
	_, err := chromedp.CallBrowser(b.ctx, cdpbrowser.SetDownloadBehavior, cdpbrowser.SetDownloadBehaviorParams{
		Behavior: cdpbrowser.SetDownloadBehaviorBehaviorAllowAndName, DownloadPath: dir, EventsEnabled: ptr.To(true)})
	Expect(err).NotTo(HaveOccurred())
	b.run(chromedp.Click(sel))
	ctx, cancel := context.WithTimeout(b.ctx, 3*time.Minute)
	defer cancel()
	for ev, err := range events {
		Expect(err).NotTo(HaveOccurred())
		if ev.State == cdpbrowser.DownloadProgressStateCanceled {
			Fail("the browser cancelled the download")
		}
		if ev.State == cdpbrowser.DownloadProgressStateCompleted {
			GinkgoWriter.Printf("the browser downloaded %.0f bytes\n", ev.ReceivedBytes)
			return filepath.Join(dir, ev.GUID)
		}
		if ctx.Err() != nil {
			Fail("no download completed in 3 minutes")
		}
	}
	Fail("the browser's events ended before the download did")
	return ""
}

// text is what the element of sel shows.
func (b *browser) text(sel string) string {
	GinkgoHelper()
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Text(css(sel), chromedp.NodeVisible))
	Expect(err).NotTo(HaveOccurred())
	return s
}

// eval is the value of a JavaScript expression on the page.
func eval[T any](b *browser, expr string) T {
	GinkgoHelper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](expr))
	Expect(err).NotTo(HaveOccurred())
	return v
}

// consoleErrors are the page's errors: exceptions, console.error calls, and the browser's
// error entries but for the answers allowed (a refusal the page was meant to get).
func (b *browser) consoleErrors(allowed ...string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
next:
	for _, m := range b.console {
		if m.Type != chromedp.ConsoleError && !m.IsException() {
			continue
		}
		for _, a := range allowed {
			if strings.Contains(m.Text, a) {
				continue next
			}
		}
		out = append(out, m.String())
	}
	return out
}

func (b *browser) putRanges() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.ranges...)
}

// consoleRBAC lets ns's uploader make and delete disks and images too, and makes a user of
// another namespace who may do everything there.
func consoleRBAC(ns, other string) {
	GinkgoHelper()
	kubectl(`apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: console}
rules:
- apiGroups: [hypercloud.tmaxanc.com, diskvolume.kubesphere.io, virtualmachine.kubesphere.io, snapshot.storage.k8s.io]
  resources: [virtualmachineimages, imagetemplates, diskvolumes, virtualmachinepvcs, virtualmachinevolumeexports, volumesnapshots]
  verbs: [get, list, watch, create, delete]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: disk-viewer}
rules:
- apiGroups: [diskvolume.kubesphere.io, hypercloud.tmaxanc.com, virtualmachine.kubesphere.io]
  resources: [diskvolumes, virtualmachinepvcs, imagetemplates]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: console}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: console}
subjects: [{kind: ServiceAccount, name: uploader}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: disk-viewer}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: disk-viewer}
subjects: [{kind: ServiceAccount, name: viewer}]
`, "apply", "-n", ns, "-f", "-")
	kubectl(`apiVersion: v1
kind: ServiceAccount
metadata: {name: owner}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: owner}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: admin}
subjects: [{kind: ServiceAccount, name: owner}]
`, "apply", "-n", other, "-f", "-")
}

// uploadFile is a raw disk of size bytes: the bootable test disk, then random bytes, so that
// nothing of it is a hole the import could skip.
func uploadFile(size int64) string {
	GinkgoHelper()
	p := filepath.Join(work, fmt.Sprintf("browser-%d.raw", size))
	run("cp", "--sparse=never", raw, p)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	Expect(err).NotTo(HaveOccurred())
	defer f.Close()
	_, err = io.CopyN(f, rand.Reader, size-fileSize(p))
	Expect(err).NotTo(HaveOccurred())
	return p
}

var _ = Describe("the console in a browser", Ordered, func() {
	var (
		ns, other, url, file, shots string
		tokens                      map[string]string
	)
	BeforeAll(func() {
		ns, other = namespace(), namespace()
		uploaders(ns)
		consoleRBAC(ns, other)
		tokens = map[string]string{"uploader": saToken(ns, "uploader"), "viewer": saToken(ns, "viewer"), "owner": saToken(other, "owner")}
		var stop func()
		var err error
		url, stop, err = cluster.ConsoleURL(context.Background())
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(stop)
		shots = testenv.Path("bin", "artifacts", "console")
		Expect(os.MkdirAll(shots, 0o755)).To(Succeed())
		file = uploadFile(1 << 30)
	})

	It("uploads 1 GiB from the page, resumes it after a reload half-way, and the image is the file", func() {
		b := newBrowser(shots)
		b.signIn(url, tokens["uploader"], ns)
		Expect(b.text("header .who")).To(ContainSubstring("system:serviceaccount:" + ns + ":uploader"))
		b.shot("1-images-empty")

		b.run(chromebrowser.Upload("from-browser", file))
		// Half-way, as the proxy counts it: the page is reloaded.
		var stored int64
		Eventually(func() int64 {
			stored = uploadOffset(ns, "from-browser", tokens["uploader"])
			return stored
		}, 3*time.Minute, 100*time.Millisecond).Should(BeNumerically(">=", int64(300<<20)), "the upload gets under way")
		Expect(stored).To(BeNumerically("<", int64(1<<30)), "the upload is not done before the reload")
		b.shot("2-uploading")
		b.run(chromedp.Reload())
		b.run(chromedp.WaitVisible(css("header .who"))) // the tab's session survives its reload
		before := len(b.putRanges())
		b.run(chromedp.Navigate(url+"#/uploads"), chromedp.WaitVisible(css(`#uploads-unfinished li[data-name="from-browser"]`)))
		Expect(b.text(`#uploads-unfinished li[data-name="from-browser"]`)).To(ContainSubstring("Choose " + filepath.Base(file) + " again to resume"))
		b.shot("3-resume-after-reload")
		afterReload := uploadOffset(ns, "from-browser", tokens["uploader"])
		b.run(chromedp.SetUploadFiles(css(`input[name="resume-from-browser"]`), []string{file}))
		// Then the network goes for a while: the page waits, asks again and goes on.
		Eventually(func() int64 { return uploadOffset(ns, "from-browser", tokens["uploader"]) }, 3*time.Minute, 100*time.Millisecond).
			Should(BeNumerically(">=", afterReload+(128<<20)), "the resumed upload goes on")
		b.network(false)
		b.run(chromedp.WaitVisible(css(`#uploads-running li[data-name="from-browser"][data-phase="retrying"]`)))
		b.shot("4-network-cut")
		b.network(true)
		b.run(chromebrowser.Done("from-browser"))
		done := b.text(`#uploads-running li[data-name="from-browser"]`)
		b.shot("5-upload-done")

		// It went on from where the server was, not from the start.
		resumed := b.putRanges()[before:]
		Expect(resumed).NotTo(BeEmpty())
		first, _ := strconv.ParseInt(strings.TrimPrefix(strings.SplitN(resumed[0], "-", 2)[0], "bytes "), 10, 64)
		// The proxy stores the parts it holds even once their sender has gone, so its offset may
		// have grown by those (PartsInFlight parts of 16 MiB, the proxy's default) between this
		// test's read and the page's.
		Expect(first).To(BeNumerically(">=", afterReload), "the first piece after the reload starts at the proxy's offset (%v)", resumed)
		Expect(first).To(BeNumerically("<=", afterReload+uploadproxy.PartsInFlight*(16<<20)), "the first piece after the reload starts at the proxy's offset (%v)", resumed)
		Expect(first%(16<<20)).To(BeZero(), "the page resumes at a part's end (%v)", resumed)
		Expect(first).To(BeNumerically(">=", stored))

		// The browser's digest is the file's and the image's.
		want := "sha256:" + sha256Of(file)
		Expect(done).To(ContainSubstring(want))
		Eventually(phase(ns, "vmimage", "from-browser"), 5*time.Minute, time.Second).Should(Equal("Ready Imported"))
		Expect(kubectl("", "get", "vmimage", "from-browser", "-n", ns, "-o", "jsonpath={.status.digest}")).To(Equal(want))
		run("cmp", "-n", strconv.FormatInt(fileSize(file), 10), file, golden(ns, "from-browser"))
		b.run(chromedp.Navigate(url+"#/images"), chromedp.WaitVisible(css(`#images tr[data-name="from-browser"][data-phase="Ready"]`)))
		b.shot("6-image-ready")
		Expect(b.consoleErrors("net::ERR_INTERNET_DISCONNECTED")).To(BeEmpty(), "only the requests sent while the network was away failed")
	})

	It("resumes an upload in a tab opened after the tab that began it was closed", func() {
		small := uploadFile(512 << 20)
		b := newBrowser(shots)
		// The first tab: signed in, the upload begun, and closed part-way.
		tab, closeTab := chromedp.NewContext(b.ctx)
		Expect(chromedp.Do(tab, chromebrowser.SignIn(url, tokens["uploader"], ns), chromebrowser.Upload("reopened", small))).To(Succeed())
		var stored int64
		Eventually(func() int64 {
			stored = uploadOffset(ns, "reopened", tokens["uploader"])
			return stored
		}, 3*time.Minute, 50*time.Millisecond).Should(BeNumerically(">=", int64(64<<20)), "the upload gets under way")
		closeTab()
		// The parts read before the cut are still being stored: the offset settles.
		Eventually(func() int64 {
			was := stored
			time.Sleep(500 * time.Millisecond)
			stored = uploadOffset(ns, "reopened", tokens["uploader"])
			return stored - was
		}, time.Minute, 10*time.Millisecond).Should(BeZero())
		Expect(stored).To(BeNumerically("<", int64(512<<20)), "the upload is not done when its tab is closed")
		// Another tab of the same browser: a session of its own (signed in again), the same
		// site's storage, where the closed tab kept its upload's record.
		again, closeAgain := chromedp.NewContext(b.ctx)
		defer closeAgain()
		_, err := chromedp.Call(again, network.Enable, network.EnableParams{})
		Expect(err).NotTo(HaveOccurred())
		var mu sync.Mutex
		var ranges []string
		go func() {
			for ev, err := range chromedp.Events(again, network.RequestWillBeSent) {
				if err != nil {
					return
				}
				if cr, ok := ev.Request.Headers["Content-Range"].(string); ok && ev.Request.Method == "PUT" {
					mu.Lock()
					ranges = append(ranges, cr)
					mu.Unlock()
				}
			}
		}()
		Expect(chromedp.Do(again, chromebrowser.SignIn(url, tokens["uploader"], ns),
			chromedp.Navigate(url+"#/uploads"), chromedp.WaitVisible(css(`#uploads-unfinished li[data-name="reopened"]`)))).To(Succeed())
		prompt, err := chromedp.Run(again, chromedp.Text(css(`#uploads-unfinished li[data-name="reopened"]`)))
		Expect(err).NotTo(HaveOccurred())
		Expect(prompt).To(ContainSubstring("Choose " + filepath.Base(small) + " again to resume"))
		Expect(chromedp.Do(again, chromedp.SetUploadFiles(css(`input[name="resume-reopened"]`), []string{small}), chromebrowser.Done("reopened"))).To(Succeed())
		done, err := chromedp.Run(again, chromedp.Text(css(`#uploads-running li[data-name="reopened"]`)))
		Expect(err).NotTo(HaveOccurred())
		mu.Lock()
		Expect(ranges).NotTo(BeEmpty())
		first, _ := strconv.ParseInt(strings.TrimPrefix(strings.SplitN(ranges[0], "-", 2)[0], "bytes "), 10, 64)
		mu.Unlock()
		Expect(first).To(Equal(stored), "the reopened tab goes on from the proxy's offset")
		want := "sha256:" + sha256Of(small)
		Expect(done).To(ContainSubstring(want))
		Eventually(phase(ns, "vmimage", "reopened"), 5*time.Minute, time.Second).Should(Equal("Ready Imported"))
		Expect(kubectl("", "get", "vmimage", "reopened", "-n", ns, "-o", "jsonpath={.status.digest}")).To(Equal(want))
		kubectl("", "delete", "vmimage", "reopened", "-n", ns, "--wait=false")
	})

	It("imports from a URL, makes a disk of an image, snapshots and restores it, and downloads its export", func() {
		b := newBrowser(shots)
		b.signIn(url, tokens["uploader"], ns)
		// An import from a URL, from the images page.
		b.run(chromedp.SendKeys(css(`#import-form input[name=name]`), "from-url"),
			chromedp.SendKeys(css(`#import-form input[name=url]`), server+"/disk.qcow2"),
			chromedp.Click(css(`#import-form button[type=submit]`)))
		b.run(chromedp.WaitVisible(css(`#images tr[data-name="from-url"][data-phase="Ready"]`)))
		sameDisk(golden(ns, "from-url"))

		b.run(chromedp.Navigate(url+"#/disks"), chromedp.WaitReady(css(`#disk-form option[value="image:from-browser"]`)),
			chromedp.SendKeys(css(`#disk-form input[name=name]`), "browser-disk"),
			chromedp.Focus(css(`#disk-form select[name=source]`)), chromedp.SendKeys(css(`#disk-form select[name=source]`), "image from-browser"),
			chromedp.SendKeys(css(`#disk-form input[name=size]`), "2Gi"),
			chromedp.Click(css(`#disk-form button[type=submit]`)))
		b.run(chromedp.WaitVisible(css(`#disks tr[data-name="browser-disk"][data-phase="Ready"]`)))
		b.shot("7-disk-ready")
		pvc := kubectl("", "get", "diskvolume", "browser-disk", "-n", ns, "-o", "jsonpath={.status.pvcName}")
		run("qemu-img", "compare", "-f", "raw", "-F", "raw", file, filepath.Join(cluster.VolumePath(ns, pvc), "disk.img"))

		// A snapshot of it, and a disk restored from the snapshot.
		b.run(chromedp.Navigate(url+"#/snapshots"), chromedp.WaitReady(css(`#snapshot-form option[value="`+pvc+`"]`)),
			chromedp.SendKeys(css(`#snapshot-form input[name=name]`), "browser-snap"),
			chromedp.Focus(css(`#snapshot-form select[name=pvc]`)), chromedp.SendKeys(css(`#snapshot-form select[name=pvc]`), "browser-disk"),
			chromedp.SendKeys(css(`#snapshot-form input[name=cls]`), "local"),
			chromedp.Click(css(`#snapshot-form button[type=submit]`)))
		b.run(chromedp.WaitVisible(css(`#snapshots tr[data-name="browser-snap"]`)))
		Eventually(func() string { return b.text(`#snapshots tr[data-name="browser-snap"] td:nth-child(3)`) }, 2*time.Minute, time.Second).Should(Equal("yes"))
		b.shot("8-snapshot")
		b.run(chromedp.Navigate(url+"#/disks"), chromedp.WaitReady(css(`#disk-form option[value="snap:browser-snap"]`)),
			chromedp.SendKeys(css(`#disk-form input[name=name]`), "restored"),
			chromedp.Focus(css(`#disk-form select[name=source]`)), chromedp.SendKeys(css(`#disk-form select[name=source]`), "snapshot browser-snap"),
			chromedp.SendKeys(css(`#disk-form input[name=size]`), "2Gi"),
			chromedp.Click(css(`#disk-form button[type=submit]`)))
		b.run(chromedp.WaitVisible(css(`#disks tr[data-name="restored"][data-phase="Ready"]`)))
		restored := kubectl("", "get", "diskvolume", "restored", "-n", ns, "-o", "jsonpath={.status.pvcName}")
		run("qemu-img", "compare", "-f", "raw", "-F", "raw", file, filepath.Join(cluster.VolumePath(ns, restored), "disk.img"))

		// An export of the restored disk, downloaded by the browser from its link.
		b.run(chromedp.Navigate(url+"#/exports"), chromedp.WaitReady(css(`#export-form option[value="`+restored+`"]`)),
			chromedp.SendKeys(css(`#export-form input[name=name]`), "browser-export"),
			chromedp.Focus(css(`#export-form select[name=pvc]`)), chromedp.SendKeys(css(`#export-form select[name=pvc]`), "restored"),
			chromedp.Click(css(`#export-form button[type=submit]`)))
		b.run(chromedp.WaitVisible(css(`#exports tr[data-name="browser-export"][data-phase="Ready"]`)), chromedp.Click(css(`#link-browser-export`)),
			chromedp.WaitVisible(css(`#download-browser-export`)))
		b.shot("9-export-ready")
		got := b.download(css(`#download-browser-export`))
		run("qemu-img", "check", got)
		run("qemu-img", "compare", "-F", "qcow2", file, got)
		Expect(b.consoleErrors()).To(BeEmpty())
	})

	It("shows a viewer the actions they may not take, disabled, with the reason", func() {
		b := newBrowser(shots)
		b.signIn(url, tokens["viewer"], ns)
		b.run(chromedp.WaitVisible(css(`#images tr[data-name="from-browser"]`)))
		Expect(eval[bool](b, `document.querySelector('#delete-from-browser').disabled`)).To(BeTrue())
		why := "system:serviceaccount:" + ns + ":viewer may not delete virtualmachineimages.hypercloud.tmaxanc.com in namespace " + ns
		Expect(b.text(`#delete-from-browser-why`)).To(ContainSubstring(why))
		Expect(b.text(`#upload-form .why`)).To(ContainSubstring("may not create virtualmachineimages.hypercloud.tmaxanc.com in namespace " + ns))
		b.shot("10-viewer")
		Expect(b.consoleErrors()).To(BeEmpty())
	})

	It("works framed in a console that signs its users in itself, as KubeSphere's does", func() {
		con := standInConsole(url)
		DeferCleanup(con.Close)
		b := newBrowser(shots)
		// The console's sign-in sets its session cookie; its page frames /proxy/diskpipe/.
		b.run(chromedp.Navigate(con.URL + "/login?token=" + tokens["uploader"] + "&namespace=" + ns))
		inFrame := func(expr string) string {
			return `(() => { const d = document.querySelector('iframe').contentDocument; return ` + expr + `; })()`
		}
		Eventually(func() string {
			v, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](inFrame(`d && d.querySelector('header .who') ? d.querySelector('header .who').textContent : ''`)))
			return v
		}, time.Minute, 200*time.Millisecond).Should(ContainSubstring("system:serviceaccount:"+ns+":uploader"), "signed in by the console, with no sign-in of the page's")
		// The header comes before the images' list, which the page fetches next.
		Eventually(func() bool {
			v, _ := chromedp.Run(b.ctx, chromedp.Evaluate[bool](inFrame(`!!d.querySelector('#images tr[data-name="from-browser"]')`)))
			return v
		}, time.Minute, 200*time.Millisecond).Should(BeTrue(), "the framed page lists the images")
		Expect(eval[bool](b, inFrame(`!d.querySelector('#sign-in') && ![...d.querySelectorAll('header button')].some((x) => x.textContent === 'Sign out')`))).To(BeTrue(),
			"no sign-in and no sign-out of the page's, framed")
		// A change from the frame: a blank disk, sent with the console's cookie alone.
		eval[bool](b, inFrame(`(d.defaultView.location.hash = '#/disks', true)`))
		Eventually(func() bool {
			v, _ := chromedp.Run(b.ctx, chromedp.Evaluate[bool](inFrame(`!!d.querySelector('#disk-form input[name=name]')`)))
			return v
		}, time.Minute, 200*time.Millisecond).Should(BeTrue())
		eval[bool](b, inFrame(`(() => {
  const set = (sel, v) => { const e = d.querySelector(sel); e.value = v; e.dispatchEvent(new Event('input', { bubbles: true })); };
  set('#disk-form input[name=name]', 'framed-disk');
  set('#disk-form input[name=size]', '1Gi');
  return true;
})()`))
		eval[bool](b, inFrame(`(d.querySelector('#disk-form button[type=submit]').click(), true)`))
		Eventually(func() string {
			return kubectl("", "get", "diskvolume", "framed-disk", "-n", ns, "--ignore-not-found", "-o", "name")
		}, time.Minute, time.Second).ShouldNot(BeEmpty(), "the disk made from the framed page")
		b.shot("12-in-a-console")
		Expect(b.consoleErrors()).To(BeEmpty())
		kubectl("", "delete", "diskvolume", "framed-disk", "-n", ns, "--wait=false")
	})

	It("shows another namespace's user nothing of it", func() {
		b := newBrowser(shots)
		b.signIn(url, tokens["owner"], ns)
		b.run(chromedp.WaitVisible(css(`section .error`)))
		Expect(b.text(`section .error`)).To(ContainSubstring("Forbidden"))
		Expect(eval[int](b, `document.querySelectorAll('#images tr[data-name]').length`)).To(BeZero())
		b.shot("11-other-namespace")
		Expect(b.consoleErrors("the server responded with a status of 403")).To(BeEmpty())
	})
})

// standInConsole stands in for a console that signs its users in itself and frames the pages,
// as KubeSphere's does: /login keeps the token in an HttpOnly session cookie, / frames
// /proxy/diskpipe/, and /proxy/diskpipe/ is the gateway (at url), each request given the
// cookie's token on its way, as ks-console's server gives it (Authorization; and the page's
// own header, which passes the apiserver's service proxy that stands before the gateway on
// the real node). The page itself holds no token.
func standInConsole(url string) *httptest.Server {
	target, err := neturl.Parse(url)
	Expect(err).NotTo(HaveOccurred())
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(target)
		r.Out.URL.Path = strings.TrimSuffix(target.Path, "/") + "/" + strings.TrimPrefix(r.In.URL.Path, "/proxy/diskpipe/")
		r.Out.URL.RawPath = ""
		r.Out.Header.Del("Cookie")
		if c, err := r.In.Cookie("token"); err == nil {
			r.Out.Header.Set("Authorization", "Bearer "+c.Value)
			r.Out.Header.Set("X-Diskpipe-Token", c.Value)
		}
	}}
	mux := http.NewServeMux()
	mux.HandleFunc("/login", func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "token", Value: r.URL.Query().Get("token"), Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
		http.Redirect(w, r, "/?namespace="+neturl.QueryEscape(r.URL.Query().Get("namespace")), http.StatusFound)
	})
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!doctype html><title>console</title><link rel="icon" href="data:,"><iframe src="/proxy/diskpipe/?namespace=%s" style="width:100%%;height:95vh;border:0"></iframe>`,
			neturl.QueryEscape(r.URL.Query().Get("namespace")))
	})
	mux.Handle("/proxy/diskpipe/", proxy)
	return httptest.NewServer(mux)
}

// uploadOffset is the bytes the upload proxy holds of image ns/name's upload, asked as the
// uploader would (HEAD).
func uploadOffset(ns, name, token string) int64 {
	GinkgoHelper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodHead, cluster.UploadURL()+"/v1/namespaces/"+ns+"/virtualmachineimages/"+name, nil)
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := cluster.UploadClient().Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	n, _ := strconv.ParseInt(resp.Header.Get("Upload-Offset"), 10, 64)
	return n
}
