package export_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	"github.com/minio/minio-go/v7"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/export"
	"github.com/diskpipe/diskpipe/controllers/internal/ctrltest"
	"github.com/diskpipe/diskpipe/controllers/manager"
	"github.com/diskpipe/diskpipe/exporter"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore/objectstoretest"
	"github.com/diskpipe/diskpipe/test/testenv"
)

var (
	env   *testenv.Env
	store *objectstoretest.Server
	once  sync.Once
)

func TestMain(m *testing.M) { testenv.RunTests(m, &env) }

const driver = "csi.diskpipe.test"

func setup(t *testing.T) string {
	t.Helper()
	once.Do(func() {
		ctx := t.Context()
		for _, sc := range []*storagev1.StorageClass{
			{ObjectMeta: metav1.ObjectMeta{Name: "csi"}, Provisioner: driver},
			{ObjectMeta: metav1.ObjectMeta{Name: "nosnap"}, Provisioner: "nosnap.diskpipe.test"},
		} {
			if err := env.Client.Create(ctx, sc); err != nil {
				t.Fatal(err)
			}
		}
		if err := env.Client.Create(ctx, &snapshotv1.VolumeSnapshotClass{ObjectMeta: metav1.ObjectMeta{Name: "csi-snapshots"},
			Driver: driver, DeletionPolicy: snapshotv1.VolumeSnapshotContentDelete}); err != nil {
			t.Fatal(err)
		}
		var stop func()
		store, stop = objectstoretest.StartShared(env.TempDir())
		env.OnStop(stop)
		cfg := store.ClientConfig()
		cfg.Region = "us-east-1"
		// Download URLs name the store's public endpoint, as behind an Ingress; get reaches it.
		if _, err := ctrltest.StartManager(env, manager.Options{ObjectStore: &cfg, ObjectStorePublicEndpoint: "http://" + publicHost}); err != nil {
			t.Fatal(err)
		}
	})
	ns, err := env.CreateNamespace(t.Context(), "export")
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

func newPVC(t *testing.T, ns, name, class string) {
	t.Helper()
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: &class,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")}}}}
	NewWithT(t).Expect(env.Client.Create(t.Context(), pvc)).To(Succeed())
}

// newExport is the seed's export: a PVC to the bundled store's bucket.
func newExport(ns, name, pvc, object string) *hypercloud.VirtualMachineVolumeExport {
	return &hypercloud.VirtualMachineVolumeExport{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: hypercloud.VirtualMachineVolumeExportSpec{PVCName: pvc,
			ObjectStore: &common.ObjectStoreSource{BucketName: common.BucketName(bucketOf(ns)), ObjectName: common.ObjectName(object)}}}
}

// bucketOf is namespace ns's bucket: a bucket belongs to the namespace that made it.
func bucketOf(ns string) string { return "vm-" + ns }

func exportStatus(t *testing.T, ex *hypercloud.VirtualMachineVolumeExport) func() string {
	return func() string {
		_ = env.Client.Get(t.Context(), client.ObjectKeyFromObject(ex), ex)
		c := meta.FindStatusCondition(ex.Status.Conditions, common.ConditionReady)
		if c == nil {
			return string(ex.Status.Phase)
		}
		return string(ex.Status.Phase) + " " + c.Reason + ": " + c.Message
	}
}

// upload plays the exporter's part in the store: the object it would have written in ns's
// bucket, with ns's keys.
func upload(t *testing.T, ns, object string, body []byte) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "export.qcow2")
	g := NewWithT(t)
	g.Expect(os.WriteFile(p, body, 0o600)).To(Succeed())
	tenant, err := store.ClientOf(env.Client).Tenant(t.Context(), ns)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(tenant.EnsureBucket(t.Context(), bucketOf(ns))).To(Succeed())
	access, secret := tenant.Keys()
	out, err := store.AWSAs(t.Context(), access, secret, "s3", "cp", p, "s3://"+bucketOf(ns)+"/"+object)
	g.Expect(err).NotTo(HaveOccurred(), out)
}

// publicHost is the bundled store's public name in these tests.
const publicHost = "downloads.diskpipe.test"

// get downloads url with a plain HTTP GET. publicHost leads to the store, as an Ingress
// that keeps the Host header would: the signature covers it.
func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	dialer := &net.Dialer{}
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr == publicHost+":80" {
			addr = strings.TrimPrefix(store.Endpoint, "http://")
		}
		return dialer.DialContext(ctx, network, addr)
	}}}
	resp, err := c.Get(url) //nolint:noctx // the URL under test
	NewWithT(t).Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestExport is the seed's story: an exporter pod reads the PVC read-only and writes to the
// bundled store; the status gets a presigned URL that a plain HTTP GET downloads; it can be
// renewed; deleting the export keeps the object (retainPolicy Retain).
func TestExport(t *testing.T) {
	ns := setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	newPVC(t, ns, "vm-disk", "csi")
	ex := newExport(ns, "backup", "vm-disk", "vm-disk.qcow2")
	g.Expect(env.Client.Create(ctx, ex)).To(Succeed())

	pod := ctrltest.Pod(t, env, ns, "backup-export-0")
	c := pod.Spec.Containers[0]
	g.Expect(c.Command).To(Equal([]string{"/exporter"}))
	args := strings.Join(c.Args, " ")
	g.Expect(args).To(HavePrefix("--source /source/disk.img --format qcow2 --compression none --endpoint " + store.Endpoint +
		" --region us-east-1 --bucket-lookup Path --bucket " + bucketOf(ns) + " --object vm-disk.qcow2 --s3-credentials-dir /var/run/diskpipe/auth --keep-stale-uploads"))
	g.Expect(pod.Spec.Volumes).To(ContainElement(HaveField("PersistentVolumeClaim", Equal(&corev1.PersistentVolumeClaimVolumeSource{ClaimName: "vm-disk", ReadOnly: true}))))
	creds := &corev1.Secret{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "backup-export-store"}, creds)).To(Succeed())
	g.Expect(metav1.IsControlledBy(creds, ex)).To(BeTrue())

	// The pod's keys are the export's own account: they write its object (the exporter's part,
	// played with awscli) and nothing else.
	access, secret := string(creds.Data["accessKeyId"]), string(creds.Data["secretAccessKey"])
	g.Expect(access).NotTo(Equal(store.AccessKey), "the exporter must not get the store's root keys")
	body := []byte("QFI\xfb stands in for the exported qcow2")
	p := filepath.Join(t.TempDir(), "export.qcow2")
	g.Expect(os.WriteFile(p, body, 0o600)).To(Succeed())
	out, err := store.AWSAs(ctx, access, secret, "s3", "cp", p, "s3://"+bucketOf(ns)+"/vm-disk.qcow2")
	g.Expect(err).NotTo(HaveOccurred(), out)
	out, err = store.AWSAs(ctx, access, secret, "s3", "ls", "s3://"+bucketOf(ns)+"/")
	g.Expect(err).To(HaveOccurred(), "the export's keys list the bucket:\n"+out)
	g.Expect(out).To(ContainSubstring("AccessDenied"))
	out, err = store.AWSAs(ctx, access, secret, "s3", "cp", p, "s3://"+bucketOf(ns)+"/elsewhere.qcow2")
	g.Expect(err).To(HaveOccurred(), "the export's keys write another object:\n"+out)
	ctrltest.Complete(t, env, ns, "backup-export-0", transfer.Result{Format: "qcow2", VirtualSize: 10 << 30, BytesWritten: int64(len(body)),
		Digest: "sha256:0123", URL: "s3://" + bucketOf(ns) + "/vm-disk.qcow2", DurationSeconds: 4})
	g.Eventually(exportStatus(t, ex), 20*time.Second).Should(HavePrefix("Ready Exported: exported vm-disk as qcow2 to s3://" + bucketOf(ns) + "/vm-disk.qcow2"))
	g.Expect(ex.Status.ObjectURL).To(Equal("s3://" + bucketOf(ns) + "/vm-disk.qcow2"))
	g.Expect(ex.Status.Digest).To(Equal("sha256:0123"))
	g.Expect(time.Until(ex.Status.DownloadURLExpiresAt.Time)).To(BeNumerically("~", 4*time.Hour, time.Minute))
	g.Expect(downloadURL(t, ex)).To(HavePrefix("http://"+publicHost+"/"), "the download URL names the public endpoint")
	code, got := get(t, downloadURL(t, ex))
	g.Expect(code).To(Equal(http.StatusOK))
	g.Expect(got).To(Equal(body))
	g.Eventually(func() bool {
		return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(creds), creds))
	}, 10*time.Second).Should(BeTrue(), "the store's keys leave the namespace with the exporter")
	out, err = store.AWSAs(ctx, access, secret, "s3", "cp", p, "s3://"+bucketOf(ns)+"/vm-disk.qcow2")
	g.Expect(err).To(HaveOccurred(), "the export's keys still work after it ended:\n"+out)
	g.Expect(out).To(ContainSubstring("InvalidAccessKeyId"))

	// Renewed on request.
	renew(t, ex, body, nil)

	// The URL is signed by the export's own read account, not the store's root keys.
	g.Expect(downloadURL(t, ex)).To(ContainSubstring("X-Amz-Credential=" + export.DownloadAccess(ex) + "%2F"))
	g.Expect(downloadURL(t, ex)).NotTo(ContainSubstring(store.AccessKey))

	// An export from a diskpipe that wrote the URL into its status (an expiry, no Secret) gets
	// a Secret without being asked.
	old := downloadURL(t, ex)
	time.Sleep(1100 * time.Millisecond) // a presigned URL carries its signing second
	g.Expect(env.Client.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ex.Status.DownloadSecretName}})).To(Succeed())
	g.Expect(env.Client.Status().Patch(ctx, ex, client.RawPatch(types.MergePatchType, []byte(`{"status":{"downloadSecretName":null}}`)))).To(Succeed())
	g.Eventually(func() string { exportStatus(t, ex)(); return ex.Status.DownloadSecretName }, 10*time.Second).ShouldNot(BeEmpty())
	g.Expect(downloadURL(t, ex)).NotTo(Equal(old))

	// Retain: the object outlives the export, its download URLs do not.
	url := downloadURL(t, ex)
	g.Expect(env.Client.Delete(ctx, ex)).To(Succeed())
	g.Eventually(func() bool { return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(ex), ex)) }, 10*time.Second).Should(BeTrue())
	out, err = store.AWS(ctx, store.SecretKey, "s3", "ls", "s3://"+bucketOf(ns)+"/vm-disk.qcow2")
	g.Expect(err).NotTo(HaveOccurred(), out)
	code, got = get(t, url)
	g.Expect(code).To(Equal(http.StatusForbidden), "a deleted export's download URL still works: %s", got)
	g.Expect(apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: export.DownloadSecretName(ex)}, &corev1.Secret{}))).
		To(BeTrue(), "the download Secret outlives its export")
}

// TestAnotherNamespacesBucket: an export into a bucket of another namespace fails for good,
// saying so, before an exporter runs and without touching the bucket; deleting it is not held
// up by the bucket it could not use.
func TestAnotherNamespacesBucket(t *testing.T) {
	owner, ns := setup(t), setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	upload(t, owner, "theirs.qcow2", []byte("the owner's export"))
	newPVC(t, ns, "disk", "csi")
	ex := newExport(ns, "intruder", "disk", "theirs.qcow2")
	ex.Spec.ObjectStore.BucketName = common.BucketName(bucketOf(owner))
	g.Expect(env.Client.Create(ctx, ex)).To(Succeed())
	g.Eventually(exportStatus(t, ex), 20*time.Second).Should(HavePrefix("Failed TargetForbidden: namespace " + ns +
		" may not use bucket " + bucketOf(owner) + " in the bundled object store: the bucket belongs to another namespace"))
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "intruder-export-0"}, &corev1.Pod{})).NotTo(Succeed(), "no exporter runs")
	out, err := store.AWS(ctx, store.SecretKey, "s3api", "get-bucket-policy", "--bucket", bucketOf(owner))
	g.Expect(err).To(HaveOccurred(), "the owner's bucket got a policy: %s", out)
	g.Expect(env.Client.Delete(ctx, ex)).To(Succeed())
	g.Eventually(func() bool { return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(ex), ex)) }, 10*time.Second).Should(BeTrue())
}

// TestRetainPolicyDelete deletes the object with the export.
func TestRetainPolicyDelete(t *testing.T) {
	ns := setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	newPVC(t, ns, "scratch", "csi")
	ex := newExport(ns, "temp", "scratch", ns+"-scratch.qcow2")
	ex.Spec.RetainPolicy = hypercloud.RetainPolicyDelete
	g.Expect(env.Client.Create(ctx, ex)).To(Succeed())
	upload(t, ns, ns+"-scratch.qcow2", []byte("exported"))
	ctrltest.Complete(t, env, ns, "temp-export-0", transfer.Result{Format: "qcow2", URL: "s3://" + bucketOf(ns) + "/" + ns + "-scratch.qcow2"})
	g.Eventually(exportStatus(t, ex), 20*time.Second).Should(HavePrefix("Ready Exported"))
	g.Expect(env.Client.Delete(ctx, ex)).To(Succeed())
	g.Eventually(func() bool { return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(ex), ex)) }, 10*time.Second).Should(BeTrue())
	out, err := store.AWS(ctx, store.SecretKey, "s3", "ls", "s3://"+bucketOf(ns)+"/"+ns+"-scratch.qcow2")
	g.Expect(err).To(HaveOccurred(), "the object is gone: %s", out)
}

func runningPodOf(t *testing.T, ns, name, claim string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "compute", Image: "virt-launcher"}},
		Volumes: []corev1.Volume{{Name: "disk", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}}}
	g := NewWithT(t)
	g.Expect(env.Client.Create(t.Context(), pod)).To(Succeed())
	pod.Status.Phase = corev1.PodRunning
	g.Expect(env.Client.Status().Update(t.Context(), pod)).To(Succeed())
	return pod
}

// TestInUseDiskIsSnapshotted: the PVC of a running VM is never read live: its snapshot is
// restored to a temporary PVC, exported, and both are removed.
func TestInUseDiskIsSnapshotted(t *testing.T) {
	ns := setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	newPVC(t, ns, "busy", "csi")
	runningPodOf(t, ns, "virt-launcher-vm1", "busy")
	ex := newExport(ns, "live", "busy", ns+"-busy.qcow2")
	g.Expect(env.Client.Create(ctx, ex)).To(Succeed())

	snap := &snapshotv1.VolumeSnapshot{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "live-export"}, snap) }, 20*time.Second).Should(Succeed())
	g.Expect(*snap.Spec.Source.PersistentVolumeClaimName).To(Equal("busy"))
	g.Expect(*snap.Spec.VolumeSnapshotClassName).To(Equal("csi-snapshots"))
	g.Eventually(exportStatus(t, ex), 20*time.Second).Should(Equal("Pending WaitingForSnapshot: waiting for the snapshot live-export to be ready"))
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "live-export-0"}, &corev1.Pod{})).NotTo(Succeed())

	snap.Status = &snapshotv1.VolumeSnapshotStatus{ReadyToUse: ptr.To(true), RestoreSize: ptr.To(resource.MustParse("10Gi"))}
	g.Expect(env.Client.Status().Update(ctx, snap)).To(Succeed())
	pod := ctrltest.Pod(t, env, ns, "live-export-0")
	g.Expect(pod.Spec.Volumes).To(ContainElement(HaveField("PersistentVolumeClaim", Equal(&corev1.PersistentVolumeClaimVolumeSource{ClaimName: "live-export", ReadOnly: true}))))
	temp := &corev1.PersistentVolumeClaim{}
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "live-export"}, temp)).To(Succeed())
	g.Expect(temp.Spec.DataSource.Kind).To(Equal("VolumeSnapshot"))
	g.Expect(ex.Status.SnapshotName).To(Equal("live-export"))

	ctrltest.Complete(t, env, ns, "live-export-0", transfer.Result{Format: "qcow2", URL: "s3://" + bucketOf(ns) + "/" + ns + "-busy.qcow2"})
	g.Eventually(exportStatus(t, ex), 20*time.Second).Should(HavePrefix("Ready Exported"))
	g.Eventually(func() bool {
		pvcGone := apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "live-export"}, temp)) || !temp.DeletionTimestamp.IsZero()
		return pvcGone && apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "live-export"}, snap))
	}, 10*time.Second).Should(BeTrue(), "the temporary PVC and snapshot are removed")
}

// TestInUseWithoutSnapshotClass refuses to read an in-use disk it cannot snapshot, says why,
// and exports once the disk is no longer in use.
func TestInUseWithoutSnapshotClass(t *testing.T) {
	ns := setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	newPVC(t, ns, "busy", "nosnap")
	vm := runningPodOf(t, ns, "virt-launcher-vm2", "busy")
	ex := newExport(ns, "refused", "busy", ns+"-refused.qcow2")
	g.Expect(env.Client.Create(ctx, ex)).To(Succeed())
	g.Eventually(exportStatus(t, ex), 20*time.Second).Should(Equal("Pending InUseWithoutSnapshot: the PVC busy is in use by the pod virt-launcher-vm2 " +
		"and it cannot be snapshotted (no VolumeSnapshotClass for the driver \"nosnap.diskpipe.test\"), so it cannot be exported without reading a disk that is being written: " +
		"stop the VM, or install a VolumeSnapshotClass for its driver"))
	g.Consistently(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "refused-export-0"}, &corev1.Pod{})
	}, 2*time.Second).ShouldNot(Succeed())

	vm.Status.Phase = corev1.PodSucceeded // the VM stopped
	g.Expect(env.Client.Status().Update(ctx, vm)).To(Succeed())
	pod := &corev1.Pod{}
	g.Eventually(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "refused-export-0"}, pod)
	}, 30*time.Second).Should(Succeed())
	g.Expect(pod.Spec.Volumes).To(ContainElement(HaveField("PersistentVolumeClaim.ClaimName", "busy")))

	// A permanent failure ends the export with the exporter's reason.
	ctrltest.Kubelet(t, env, ns, "refused-export-0", corev1.PodFailed,
		&transfer.Result{Reason: transfer.ReasonTargetForbidden, Message: "the store refused the credentials"}, 1)
	g.Eventually(exportStatus(t, ex), 20*time.Second).Should(Equal("Failed TargetForbidden: the store refused the credentials"))
}

// TestExternalStore exports to an S3 store named in the spec, with the user's credentials
// Secret, which only the pods read: the real exporter runs each pod's command line. It
// exports and signs the download URL with those keys, signs a new one on request, and deletes
// the object with retainPolicy Delete; a Secret that does not exist is named as the reason.
func TestExternalStore(t *testing.T) {
	ns := setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	newPVC(t, ns, "data", "csi")
	g.Expect(env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s3-creds", Namespace: ns},
		StringData: map[string]string{"accessKeyId": store.AccessKey, "secretAccessKey": store.SecretKey}})).To(Succeed())
	g.Expect(store.Client().EnsureBucket(ctx, "vmexport")).To(Succeed())
	offsite := func(name, secret string) *hypercloud.VirtualMachineVolumeExport {
		return &hypercloud.VirtualMachineVolumeExport{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: hypercloud.VirtualMachineVolumeExportSpec{PVCName: "data", Format: hypercloud.ExportFormatRaw,
				Compression: hypercloud.ExportCompressionNone, RetainPolicy: hypercloud.RetainPolicyDelete,
				S3: &common.S3Source{Endpoint: common.HTTPURL(store.Endpoint), Region: "us-east-1", BucketLookup: common.BucketLookupPath,
					BucketName: "vmexport", ObjectName: common.ObjectName(ns + "-" + name + ".raw"), SecretRef: common.LocalName(secret)}}}
	}
	ex := offsite("offsite", "s3-creds")
	g.Expect(env.Client.Create(ctx, ex)).To(Succeed())
	pod := ctrltest.Pod(t, env, ns, "offsite-export-0")
	args := strings.Join(pod.Spec.Containers[0].Args, " ")
	g.Expect(args).To(ContainSubstring("--format raw"))
	g.Expect(args).To(ContainSubstring("--bucket vmexport --object " + ns + "-offsite.raw --s3-credentials-dir /var/run/diskpipe/auth"))
	g.Expect(args).To(ContainSubstring("--download-url-expiry 4h0m0s"), "the pod signs the download URL")
	g.Expect(args).NotTo(ContainSubstring("--create-bucket"))
	g.Expect(pod.Spec.Volumes).To(ContainElement(HaveField("Secret.SecretName", "s3-creds")))
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "offsite-export-store"}, &corev1.Secret{})).NotTo(Succeed(),
		"the bundled store's keys are not copied for an external store")

	disk := []byte(strings.Repeat("raw disk ", 1<<16))
	res := runPod(t, ns, "offsite-export-0", disk)
	g.Expect(res.Succeeded).To(BeTrue(), res.Message)
	g.Eventually(exportStatus(t, ex), 20*time.Second).Should(HavePrefix("Ready Exported"))
	g.Expect(time.Until(ex.Status.DownloadURLExpiresAt.Time)).To(BeNumerically("~", 4*time.Hour, time.Minute))
	g.Expect(args).To(ContainSubstring("--seal-key "), "the pod seals the URL it signs")
	noBearerInView(t, ex, "offsite-export-0")
	code, got := get(t, downloadURL(t, ex))
	g.Expect(code).To(Equal(http.StatusOK))
	g.Expect(got).To(Equal(disk))

	// A new URL on request, signed by a pod of its own.
	renew(t, ex, disk, func() {
		g.Expect(runPod(t, ns, "offsite-presign", nil).Succeeded).To(BeTrue())
		noBearerInView(t, ex, "offsite-presign")
	})
	g.Eventually(func() bool {
		return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "offsite-presign"}, &corev1.Pod{}))
	}, 10*time.Second).Should(BeTrue(), "the signing pod is deleted")

	// A sealed URL copied into another export's pod result (a viewer reads pods' results, and
	// a namespace's owner can make a pod under the name diskpipe uses): not opened there.
	other := setup(t)
	newPVC(t, other, "data", "csi")
	loot := offsite("loot", "s3-creds")
	loot.Namespace = other
	g.Expect(env.Client.Create(ctx, loot)).To(Succeed())
	ctrltest.Pod(t, env, other, "loot-export-0")
	ctrltest.Complete(t, env, other, "loot-export-0", transfer.Result{Format: "raw", URL: res.URL, DurationSeconds: 1,
		SealedDownloadURL: res.SealedDownloadURL, DownloadURLExpiresAt: res.DownloadURLExpiresAt})
	g.Eventually(exportStatus(t, loot), 20*time.Second).Should(ContainSubstring(
		"no download URL: the pod's download URL: seal: not sealed to this key for this context"))
	g.Expect(loot.Status.DownloadSecretName).To(BeEmpty())
	g.Expect(apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKey{Namespace: other, Name: export.DownloadSecretName(loot)}, &corev1.Secret{}))).
		To(BeTrue(), "a Secret was written of another export's URL")

	// Keys that do not exist: the pod says so, and it is tried again.
	nokeys := offsite("nokeys", "absent")
	g.Expect(env.Client.Create(ctx, nokeys)).To(Succeed())
	res = runPod(t, ns, "nokeys-export-0", disk)
	g.Expect(res.Reason).To(Equal(transfer.ReasonCredentialsNotFound))
	g.Eventually(exportStatus(t, nokeys), 20*time.Second).Should(ContainSubstring(
		"Retrying: attempt 1 failed (CredentialsNotFound: no S3 keys in "))
	g.Expect(exportStatus(t, nokeys)()).To(ContainSubstring("the Secret that secretRef names does not exist in this namespace"))

	// retainPolicy Delete: a pod deletes the object, then the export goes.
	g.Expect(env.Client.Delete(ctx, ex)).To(Succeed())
	g.Expect(runPod(t, ns, "offsite-delete", nil).Succeeded).To(BeTrue())
	g.Eventually(func() bool { return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(ex), ex)) }, 20*time.Second).Should(BeTrue())
	_, err := store.Client().StatObject(ctx, "vmexport", ns+"-offsite.raw", minio.StatObjectOptions{})
	g.Expect(minio.ToErrorResponse(err).Code).To(Equal("NoSuchKey"), "the exported object is deleted")
}

// renew asks for a new download URL of ex, runs signer (the pod's part, if any), and checks
// that the new URL downloads want and that the request was cleared.
func renew(t *testing.T, ex *hypercloud.VirtualMachineVolumeExport, want []byte, signer func()) {
	t.Helper()
	g := NewWithT(t)
	first, firstAt := downloadURL(t, ex), ex.Status.DownloadURLExpiresAt.Time
	time.Sleep(1100 * time.Millisecond) // a presigned URL carries its signing second
	patch := client.MergeFrom(ex.DeepCopy())
	ex.Annotations = map[string]string{hypercloud.AnnotationRenewDownloadURL: "true"}
	g.Expect(env.Client.Patch(t.Context(), ex, patch)).To(Succeed())
	if signer != nil {
		signer()
	}
	g.Eventually(func() bool {
		exportStatus(t, ex)()
		_, asked := ex.Annotations[hypercloud.AnnotationRenewDownloadURL]
		// The status names the new expiry once the Secret holds the new URL.
		return ex.Status.DownloadURLExpiresAt.After(firstAt) && !asked
	}, 10*time.Second).Should(BeTrue(), "a new URL, and the request cleared")
	g.Expect(downloadURL(t, ex)).NotTo(Equal(first))
	code, got := get(t, downloadURL(t, ex))
	g.Expect(code).To(Equal(http.StatusOK))
	g.Expect(got).To(Equal(want))
}

// downloadURL reads ex's download URL from the Secret its status names, which ex controls.
func downloadURL(t *testing.T, ex *hypercloud.VirtualMachineVolumeExport) string {
	t.Helper()
	g := NewWithT(t)
	g.Expect(ex.Status.DownloadSecretName).To(Equal(export.DownloadSecretName(ex)))
	sec := &corev1.Secret{}
	g.Expect(env.Client.Get(t.Context(), client.ObjectKey{Namespace: ex.Namespace, Name: ex.Status.DownloadSecretName}, sec)).To(Succeed())
	g.Expect(metav1.IsControlledBy(sec, ex)).To(BeTrue(), "the download Secret goes with the export")
	at, err := time.Parse(time.RFC3339, string(sec.Data[hypercloud.DownloadSecretKeyExpiresAt]))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(at).To(BeTemporally("~", ex.Status.DownloadURLExpiresAt.Time, time.Second))
	return string(sec.Data[hypercloud.DownloadSecretKeyURL])
}

// noBearerInView checks that what a viewer of ex's namespace reads, the export and its pod
// with the pod's result, holds no signed URL.
func noBearerInView(t *testing.T, ex *hypercloud.VirtualMachineVolumeExport, pod string) {
	t.Helper()
	g := NewWithT(t)
	for _, obj := range []client.Object{&hypercloud.VirtualMachineVolumeExport{}, &corev1.Pod{}} {
		name := ex.Name
		if _, ok := obj.(*corev1.Pod); ok {
			name = pod
		}
		err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ex.Namespace, Name: name}, obj)
		if apierrors.IsNotFound(err) {
			continue
		}
		g.Expect(err).NotTo(HaveOccurred())
		b, err := json.Marshal(obj)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(string(b)).NotTo(ContainSubstring("X-Amz-Signature"), "%T %s shows a signed URL", obj, name)
	}
}

// runPod plays the kubelet for an exporter pod with the real exporter: each Secret and
// ConfigMap volume becomes a directory of its keys, read as the kubelet reads them (an
// optional Secret that does not exist: an empty directory), the source PVC a directory with
// disk as its disk.img; exporter.Main runs the pod's arguments, and its result and exit code
// become the pod's status.
func runPod(t *testing.T, ns, name string, disk []byte) *transfer.Result {
	t.Helper()
	ctx := t.Context()
	pod := ctrltest.Pod(t, env, ns, name)
	ctr := pod.Spec.Containers[0]
	var paths []string // mount path, local directory, ...
	for _, m := range ctr.VolumeMounts {
		dir := t.TempDir()
		files := map[string][]byte{}
		for _, v := range pod.Spec.Volumes {
			switch {
			case v.Name != m.Name:
			case v.Secret != nil:
				sec := &corev1.Secret{}
				err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: v.Secret.SecretName}, sec)
				if !apierrors.IsNotFound(err) || !ptr.Deref(v.Secret.Optional, false) {
					if err != nil {
						t.Fatalf("the pod's Secret %s: %v", v.Secret.SecretName, err)
					}
					files = sec.Data
				}
			case v.ConfigMap != nil:
				cm := &corev1.ConfigMap{}
				if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: v.ConfigMap.Name}, cm); err != nil {
					t.Fatalf("the pod's ConfigMap %s: %v", v.ConfigMap.Name, err)
				}
				for k, d := range cm.Data {
					files[k] = []byte(d)
				}
			case v.PersistentVolumeClaim != nil:
				files["disk.img"] = disk
			}
		}
		for k, b := range files {
			if err := os.WriteFile(filepath.Join(dir, k), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		paths = append(paths, m.MountPath, dir)
	}
	args := make([]string, len(ctr.Args))
	for i, a := range ctr.Args {
		args[i] = strings.NewReplacer(paths...).Replace(a)
	}
	term := filepath.Join(t.TempDir(), "termination-log")
	var log strings.Builder
	exit := exporter.Main(ctx, append(args, "--metrics-addr", "", "--termination-message-path", term,
		"--allow-destination", "127.0.0.0/8"), &log)
	msg, err := os.ReadFile(term)
	if err != nil {
		t.Fatalf("%s left no result (exit %d): %v\n%s", name, exit, err, log.String())
	}
	res, err := transfer.ReadResult(string(msg))
	if err != nil {
		t.Fatal(err)
	}
	phase := corev1.PodSucceeded
	if exit != 0 {
		phase = corev1.PodFailed
	}
	ctrltest.Kubelet(t, env, ns, name, phase, res, int32(exit))
	return res
}

// TestInUseByLabelledPod: a running pod that carries the export's own label is still a pod
// writing the disk: a label its namespace can write proves nothing (importpod.Made does), so
// the disk is snapshotted, never read live.
func TestInUseByLabelledPod(t *testing.T) {
	ns := setup(t)
	g := NewWithT(t)
	ctx := t.Context()
	ex := newExport(ns, "forged", "later", ns+"-later.qcow2")
	g.Expect(env.Client.Create(ctx, ex)).To(Succeed())
	g.Eventually(exportStatus(t, ex), 20*time.Second).Should(HavePrefix("Pending SourceNotFound"))
	vm := runningPodOf(t, ns, "virt-launcher-vm3", "later")
	vm.Labels = map[string]string{export.LabelExport: string(ex.UID)}
	g.Expect(env.Client.Update(ctx, vm)).To(Succeed())
	newPVC(t, ns, "later", "csi")
	snap := &snapshotv1.VolumeSnapshot{}
	g.Eventually(func() error { return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "forged-export"}, snap) }, 30*time.Second).Should(Succeed())
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "forged-export-0"}, &corev1.Pod{})).NotTo(Succeed(), "no exporter reads the live disk")
}
