package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// tenant is a user who may do in namespace ns what edit allows, and nothing elsewhere
// (envtest-like clusters aggregate no roles: Kubernetes' and diskpipe's parts of edit are
// bound too).
func tenant(name, ns string) string {
	GinkgoHelper()
	user := name + "-" + ns
	for _, role := range []string{"edit", "system:aggregate-to-edit", "system:aggregate-to-view", "diskpipe-user"} {
		kubectl("", "create", "rolebinding", strings.ReplaceAll(role, ":", "-")+"-"+user, "-n", ns, "--clusterrole", role, "--user", user)
	}
	return user
}

// asTenant runs kubectl as user until RBAC, which learns a new binding a moment after it is
// made, lets it.
func asTenant(user, stdin string, args ...string) {
	GinkgoHelper()
	Eventually(func() error {
		out, err := asUser(user, stdin, args...)
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}, 30*time.Second, time.Second).Should(Succeed())
}

// indent puts by before each line of s that is not empty.
func indent(s, by string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != "" {
			lines[i] = by + l
		}
	}
	return strings.Join(lines, "")
}

// timed is how long f takes.
func timed(f func()) time.Duration {
	GinkgoHelper()
	start := time.Now()
	f()
	return time.Since(start)
}

// notSlowedDown checks that what a second tenant did while an attack ran took at most twice
// as long as without it, and reports both. The work here takes 1 to 20 s, in which a busy
// machine's scheduling (CI runs other suites beside this one) moves a pod's start by
// seconds: jitter seconds more are allowed, and the ratio is reported.
func notSlowedDown(what string, quiet, attacked time.Duration) {
	GinkgoHelper()
	const jitter = 10 * time.Second
	AddReportEntry(what, fmt.Sprintf("%.1f s quiet, %.1f s under attack (%.2fx)", quiet.Seconds(), attacked.Seconds(), attacked.Seconds()/quiet.Seconds()))
	Expect(attacked).To(BeNumerically("<=", 2*quiet+jitter), "%s: %s under attack, %s without", what, attacked, quiet)
}

// The attacks of a tenant with edit in its own namespace on what diskpipe shares between
// namespaces, on the chart's defaults: each is refused, saying why, and another namespace's
// work done meanwhile takes at most twice its time without the attack.
var _ = Describe("a hostile tenant on the shared parts", realProves, func() {
	It("holds no clone source of a public image with disks that cannot be made: another namespace's copy goes on", func() {
		owner, own, other := namespace(), namespace(), namespace()
		importHTTP(owner, "golden", "disk.qcow2")
		kubectl("", "label", "vmimage", "golden", "-n", owner, "virtualmachine.kubesphere.io/image-public=yes")
		copied := func(name string) {
			GinkgoHelper()
			kubectl(diskOf(name, owner, "Filesystem", "128Mi"), "apply", "-n", other, "-f", "-")
			Eventually(phase(other, "dvol", name), 3*time.Minute, time.Second).Should(Equal("Ready Made"))
		}
		quiet := timed(func() { copied("quiet") })

		// Four disks of the public image, one more than the two a namespace's copies may be
		// served at once, each of a class that does not exist.
		mallory := tenant("mallory", own)
		for i := range 4 {
			asTenant(mallory, fmt.Sprintf(`apiVersion: diskvolume.kubesphere.io/v1alpha1
kind: DiskVolume
metadata: {name: hold-%d}
spec:
  source:
    image: {name: golden, namespace: %s, kind: VirtualMachineImage}
  storageClassName: no-such-class
  resources: {requests: {storage: 128Mi}}
`, i, owner), "apply", "-n", own, "-f", "-")
		}
		for i := range 4 {
			name := fmt.Sprintf("hold-%d", i)
			Eventually(phase(own, "dvol", name), time.Minute, time.Second).Should(Equal("Cloning WaitingForCloneSource"))
			Expect(kubectl("", "get", "dvol", name, "-n", own, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].message}`)).To(
				ContainSubstring("is of storage class no-such-class, which does not exist: its clone source starts when the volume can be made"))
		}
		attacked := timed(func() { copied("attacked") })
		Expect(kubectl("", "get", "pods", "-n", owner, "-l", "diskpipe.io/clone-for-namespace="+own, "-o", "name")).To(BeEmpty(),
			"no clone source serves the disks that cannot be made")
		notSlowedDown("a copy of a public image beside 4 disks of it of a class that does not exist", quiet, attacked)
		sameDisk(golden(owner, "golden"))
	})

	It("holds 300 connections to the store from a pod: they are ended, and another namespace's upload goes on", func() {
		ctx := context.Background()
		own, other := namespace(), namespace()
		bucket := "carol-" + other
		_, err := awsIn(ctx, other, "s3", "mb", "s3://"+bucket)
		Expect(err).NotTo(HaveOccurred())
		file := randomDisk("store-"+other, 64<<20)
		uploaded := func(key string) {
			GinkgoHelper()
			out, err := awsIn(ctx, other, "s3", "cp", file, "s3://"+bucket+"/"+key)
			Expect(err).NotTo(HaveOccurred(), out)
		}
		quiet := timed(func() { uploaded("quiet") })

		store, err := url.Parse(cluster.StoreInCluster())
		Expect(err).NotTo(HaveOccurred())
		kubectl(probePod("holder", cluster.Nodes()[0], "hold", store.Host, "300"), "apply", "-n", own, "-f", "-")
		DeferCleanup(func() { kubectl("", "delete", "pod", "holder", "-n", own, "--grace-period=0", "--force") })
		held := func() string { return observe("logs", "holder", "-n", own, "--tail", "1") }
		Eventually(held, 2*time.Minute, time.Second).Should(MatchRegexp(`^held \d+ of 300 open`))
		attacked := timed(func() { uploaded("attacked") })
		// The store ends the connections that send no request (after 10 s), again and again.
		closed := func() int {
			m := regexp.MustCompile(`ended: map\[closed:(\d+)`).FindStringSubmatch(held())
			if m == nil {
				return 0
			}
			n, _ := strconv.Atoi(m[1])
			return n
		}
		Eventually(closed, 2*time.Minute, time.Second).Should(BeNumerically(">=", 600))
		GinkgoWriter.Println("the holder:", held())
		notSlowedDown("a 64 MiB awscli upload beside 300 idle connections from one pod", quiet, attacked)

		got := filepath.Join(work, "store-back-"+other)
		out, err := awsIn(ctx, other, "s3", "cp", "s3://"+bucket+"/attacked", got)
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(sha256Of(got)).To(Equal(sha256Of(file)))
	})

	It("stalls 40 uploads at the upload proxy: they are ended, and another namespace's upload goes on", func() {
		ctx := context.Background()
		own, other := namespace(), namespace()
		// 40 images of hers to upload to, and a token that may.
		uploaders(own)
		var stalled strings.Builder
		for i := range 40 {
			fmt.Fprintf(&stalled, "%s---\n", vmi(fmt.Sprintf("stalled-%d", i), "    upload: {}"))
		}
		kubectl(stalled.String(), "apply", "-n", own, "-f", "-")
		token := saToken(own, "uploader")

		uploaders(other)
		file := randomDisk("proxy-"+other, 64<<20)
		sa := saToken(other, "uploader")
		uploaded := func(name string) {
			GinkgoHelper()
			kubectl(vmi(name, "    upload: {}"), "apply", "-n", other, "-f", "-")
			f, err := os.Open(file)
			Expect(err).NotTo(HaveOccurred())
			defer f.Close()
			req, err := http.NewRequestWithContext(ctx, http.MethodPut, cluster.UploadURL()+"/v1/namespaces/"+other+"/virtualmachineimages/"+name, f)
			Expect(err).NotTo(HaveOccurred())
			req.ContentLength = 64 << 20
			req.Header.Set("Authorization", "Bearer "+sa)
			resp, err := cluster.UploadClient().Do(req)
			Expect(err).NotTo(HaveOccurred())
			answer, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			Expect(resp.StatusCode).To(Equal(http.StatusCreated), "the proxy answered: %s", answer)
			Eventually(phase(other, "vmimage", name), 3*time.Minute, time.Second).Should(Equal("Ready Imported"))
		}
		quiet := timed(func() { uploaded("quiet") })

		// 40 uploads that send a little of their body, then nothing.
		var (
			mu      sync.Mutex
			answers = map[string]int{}
			wg      sync.WaitGroup
		)
		stop := make(chan struct{})
		proxy := cluster.UploadClient()
		for i := range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pr, pw := io.Pipe()
				go func() {
					_, _ = pw.Write(make([]byte, 4096))
					<-stop
					_ = pw.CloseWithError(io.ErrUnexpectedEOF)
				}()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPut, fmt.Sprintf("%s/v1/namespaces/%s/virtualmachineimages/stalled-%d", cluster.UploadURL(), own, i), pr)
				req.ContentLength = 1 << 30
				req.Header.Set("Authorization", "Bearer "+token)
				resp, err := proxy.Do(req)
				how := ""
				if err != nil {
					how = "error: " + err.Error()
				} else {
					body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
					resp.Body.Close()
					how = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))
				}
				mu.Lock()
				answers[how]++
				mu.Unlock()
			}()
		}
		refused := func() int {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for how, count := range answers {
				if strings.HasPrefix(how, "503 namespace "+own+" has 4 uploads being written") {
					n += count
				}
			}
			return n
		}
		// Four of them hold the namespace's writers; the rest are refused at once, saying why.
		Eventually(refused, time.Minute, time.Second).Should(Equal(36))
		attacked := timed(func() { uploaded("attacked") })
		// The four end once their body stalls for 30 s, saying so.
		Eventually(func() int {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, c := range answers {
				n += c
			}
			return n
		}, 2*time.Minute, time.Second).Should(Equal(40))
		close(stop)
		wg.Wait()
		GinkgoWriter.Printf("the stalled uploads were answered: %v\n", answers)
		timedOut := 0
		for how, count := range answers {
			if strings.HasPrefix(how, "408 the body stopped after byte 4096: nothing came for 30s") {
				timedOut += count
			}
		}
		Expect(timedOut).To(Equal(4), "answers: %v", answers)
		notSlowedDown("a 64 MiB upload and import beside 40 stalled uploads of another namespace", quiet, attacked)
	})

	It("wears no label of diskpipe's pods, which the NetworkPolicies admit, and runs nothing in them", func() {
		ns := namespace()
		user := tenant("mallory", ns)
		forged := "app.kubernetes.io/managed-by: diskpipe, app.kubernetes.io/component: importer"
		pod := strings.Replace(probePod("forged", cluster.Nodes()[0], "serve"), "labels: {probe: forged}", "labels: {"+forged+"}", 1)
		// Her own pod, wearing the label the store's policy admits: refused, saying why.
		var out string
		Eventually(func() string {
			out, _ = asUser(user, pod, "apply", "-n", ns, "-f", "-")
			return out
		}, 30*time.Second, time.Second).Should(ContainSubstring("only diskpipe's manager may create a pod that carries it"))
		GinkgoWriter.Println("a tenant's pod with diskpipe's label:", out)
		// Nor through a Deployment: the ReplicaSet's pods are refused alike (the local cluster
		// runs no ReplicaSet controller).
		if real() {
			spec := pod[strings.Index(pod, "spec:\n")+len("spec:\n"):]
			asTenant(user, "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: forged\nspec:\n  selector:\n    matchLabels: {"+forged+"}\n"+
				"  template:\n    metadata:\n      labels: {"+forged+"}\n    spec:\n"+indent(strings.Replace(spec, "restartPolicy: Never", "restartPolicy: Always", 1), "    "),
				"apply", "-n", ns, "-f", "-")
			Eventually(func() string {
				return observe("get", "events", "-n", ns, "--field-selector", "reason=FailedCreate", "-o", "jsonpath={.items[*].message}")
			}, time.Minute, time.Second).Should(ContainSubstring("only diskpipe's manager may create a pod that carries it"))
		}
		Expect(observe("get", "pods", "-n", ns, "-l", "app.kubernetes.io/managed-by=diskpipe", "-o", "name")).To(BeEmpty())

		// diskpipe's importer in her namespace: she may read its logs, not run a command in it
		// or change what it is.
		kubectl(vmi("slow", fmt.Sprintf("    http: %s/disk.qcow2?rate=100000", server))+"  resources:\n    requests:\n      storage: 128Mi\n", "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "vmimage", "slow"), time.Minute, time.Second).Should(Equal("Importing Running"))
		out, err := asUser(user, "", "exec", "vmim-slow-import-0", "-n", ns, "--", "/importer", "--help")
		GinkgoWriter.Println("a tenant's exec into diskpipe's importer:", out)
		Expect(err).To(HaveOccurred())
		Expect(out).To(ContainSubstring("is diskpipe's importer, which runs diskpipe's code only: nobody may exec it"))
		out, err = asUser(user, "", "label", "pod", "vmim-slow-import-0", "-n", ns, "--overwrite", "app.kubernetes.io/component=clone-source")
		Expect(err).To(HaveOccurred())
		Expect(out).To(ContainSubstring("only diskpipe's manager may change its label app.kubernetes.io/component"))
		if real() { // the local cluster's pods have no logs to read
			_, err = asUser(user, "", "logs", "vmim-slow-import-0", "-n", ns)
			Expect(err).NotTo(HaveOccurred(), "she reads its logs")
		}
		kubectl("", "delete", "vmimage", "slow", "-n", ns, "--wait=false")
	})
})
