package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	"github.com/minio/minio-go/v7"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/export"
	"github.com/diskpipe/diskpipe/objectstore"
	"github.com/diskpipe/diskpipe/test/framework"
)

// check verifies the end state: everything Ready and identical to its source, nothing left
// over, no secret in any log.
func check(ctx context.Context, c config, cl framework.Cluster, raw string, images, locals []*hypercloud.VirtualMachineImage,
	disks []*diskvolume.DiskVolume, exports []*hypercloud.VirtualMachineVolumeExport) []row {
	k := cl.APIClient()
	_, _, rootSecret, err := cl.StoreAccess(ctx)
	if err != nil {
		return []row{{"the store's root keys", err.Error(), "", false}}
	}
	var rows []row
	count := func(what string, got, want int) {
		rows = append(rows, row{what, fmt.Sprint(got), fmt.Sprint(want), got == want})
	}
	// Every object Ready, every disk identical to the image.
	var all tally
	imgs, dvs, exs := &tally{}, &tally{}, &tally{}
	for _, img := range images {
		_ = k.Get(ctx, client.ObjectKeyFromObject(img), img)
		imgs.add("image", img, img.Status.Phase, img.Status.Retries, func() bool { return same(raw, cl.VolumePath(img.Namespace, img.Status.PVCName)) })
	}
	// A node-local image and each of its replicas, on every other node, hold the source.
	lcl, reps := &tally{}, &tally{}
	replicas, homes := 0, 0
	for _, img := range locals {
		_ = k.Get(ctx, client.ObjectKeyFromObject(img), img)
		lcl.add("node-local image", img, img.Status.Phase, img.Status.Retries, func() bool { return same(raw, cl.VolumePath(img.Namespace, img.Status.PVCName)) })
		nodes := map[string]bool{}
		for _, r := range img.Status.Replicas {
			replicas++
			nodes[r.Node] = true
			obj := &diskvolume.DiskVolume{ObjectMeta: metav1.ObjectMeta{Namespace: img.Namespace, Name: r.Name}}
			reps.add("replica", obj, r.Phase, 0, func() bool { return same(raw, cl.VolumePath(img.Namespace, r.Name)) })
		}
		if len(nodes) == len(img.Status.Replicas) && len(nodes) == len(cl.Nodes())-1 {
			homes++
		}
	}
	for _, d := range disks {
		_ = k.Get(ctx, client.ObjectKeyFromObject(d), d)
		dvs.add("disk", d, d.Status.Phase, d.Status.Retries, func() bool { return same(raw, cl.VolumePath(d.Namespace, d.Status.PVCName)) })
	}
	var secrets []string
	for _, ex := range exports {
		_ = k.Get(ctx, client.ObjectKeyFromObject(ex), ex)
		secrets = append(secrets, objectstore.ScopedSecret(rootSecret, string(ex.UID)))
		exs.add("export", ex, ex.Status.Phase, ex.Status.Retries, func() bool { return sameExport(ctx, cl, ex, raw) })
	}
	count("images Ready", imgs.ready, c.images)
	count("golden disks identical to the source (qemu-img)", imgs.same, c.images)
	count("DiskVolumes Ready", dvs.ready, c.disks)
	count("DiskVolumes identical to the image (qemu-img)", dvs.same, c.disks)
	count("exports Ready", exs.ready, c.exports)
	count("exports identical to the disk (download, qemu-img)", exs.same, c.exports)
	if c.localImages > 0 {
		count("node-local images Ready", lcl.ready, c.localImages)
		count("node-local images identical to the source (qemu-img)", lcl.same, c.localImages)
		count("node-local images with one replica on each other node", homes, c.localImages)
		count("replicas Ready", reps.ready, replicas)
		count("replicas identical to the source (qemu-img)", reps.same, replicas)
	}
	for _, t := range []*tally{imgs, lcl, reps, dvs, exs} {
		all.stuck, all.retries = all.stuck+t.stuck, all.retries+t.retries
		if all.firstBad == "" {
			all.firstBad = t.firstBad
		}
	}
	count("objects stuck in a non-final phase", all.stuck, 0)
	if all.firstBad != "" {
		rows = append(rows, row{"first that differs", all.firstBad, "", false})
	}

	// Nothing left over.
	count("pods left", inChaos(ctx, k, &corev1.PodList{}), 0)
	count("PVCs beyond the golden ones, the replicas and the disks", inChaos(ctx, k, &corev1.PersistentVolumeClaimList{})-c.images-c.localImages-replicas-c.disks, 0)
	secretList := &corev1.SecretList{}
	_ = k.List(ctx, secretList, client.HasLabels{"diskpipe.io/export"})
	count("exporter Secrets left", len(secretList.Items), 0)
	snaps := &snapshotv1.VolumeSnapshotList{}
	_ = k.List(ctx, snaps)
	exportSnaps := 0
	for _, s := range snaps.Items {
		if strings.HasSuffix(s.Name, "-export") {
			exportSnaps++
		}
	}
	count("export VolumeSnapshots left", exportSnaps, 0)
	store, err := cl.StoreClient(ctx)
	if err != nil {
		rows = append(rows, row{"the store as root", err.Error(), "", false})
		return rows
	}
	uploads := 0
	for _, bucket := range []string{"chaos-src", exportBucket("chaos-a"), exportBucket("chaos-b"), exportBucket("chaos-c")} {
		if res, err := (minio.Core{Client: store.Client}).ListMultipartUploads(ctx, bucket, "", "", "", "", 1000); err == nil {
			uploads += len(res.Uploads)
		}
	}
	count("unfinished multipart uploads", uploads, 0)
	accounts, err := store.ScopedAccounts(ctx)
	if err != nil {
		rows = append(rows, row{"export accounts left in the store", err.Error(), "0", false})
	} else {
		// A Ready export keeps the account that signs its download URL until it is deleted;
		// the accounts its exporters wrote with are gone.
		live := map[string]bool{}
		for _, ex := range exports {
			live[export.DownloadAccess(ex)] = true
		}
		left := 0
		for _, a := range accounts {
			if !live[a] {
				left++
			}
		}
		count("export accounts left in the store (besides the Ready exports' download accounts)", left, 0)
	}

	// No credential or presigned URL in any log line.
	leaks := grepLogs(cl.LogDirs(), append(secrets, rootSecret, "X-Amz-Signature=", "X-Amz-Credential="))
	count("log lines with a key or presigned URL", len(leaks), 0)
	if len(leaks) > 0 {
		rows = append(rows, row{"first leak", leaks[0], "", false})
	}
	rows = append(rows, row{"retries recorded in the objects' status", fmt.Sprint(all.retries), ">= 0", true})
	// Each retry is counted in the manager's metrics before the status records it (a run
	// killed in between counts it again in the next): summed over every run of the manager.
	if counted, err := cl.ManagerCounter("diskpipe_operations_retried_total"); err != nil {
		rows = append(rows, row{"retries counted in the manager's metrics", err.Error(), "", false})
	} else {
		rows = append(rows, row{"retries counted in the manager's metrics", fmt.Sprint(counted), fmt.Sprintf(">= %d", all.retries), counted >= float64(all.retries)})
	}
	return rows
}

// inChaos counts the objects of list's kind in the run's namespaces.
func inChaos(ctx context.Context, k client.Client, list client.ObjectList) int {
	if err := k.List(ctx, list); err != nil {
		return -1
	}
	items, _ := meta.ExtractList(list)
	n := 0
	for _, o := range items {
		if m, ok := o.(metav1.Object); ok && strings.HasPrefix(m.GetNamespace(), "chaos-") {
			n++
		}
	}
	return n
}

// tally counts one kind's objects by outcome.
type tally struct {
	ready, same, stuck int
	retries            int32
	firstBad           string
}

func (t *tally) add(kind string, obj client.Object, phase common.Phase, retries int32, identical func() bool) {
	t.retries += retries
	switch {
	case phase == common.PhaseReady:
		t.ready++
		if identical() {
			t.same++
		} else if t.firstBad == "" {
			t.firstBad = kind + " " + obj.GetNamespace() + "/" + obj.GetName()
		}
	case !final(phase):
		t.stuck++
	}
}

// same reports whether the disk in a volume's directory holds the raw image (a larger disk's
// extra bytes must be zeros).
func same(raw, dir string) bool {
	disk := filepath.Join(dir, "disk.img")
	if _, err := os.Stat(disk); err != nil {
		disk = filepath.Join(dir, "block.img")
	}
	return exec.Command("qemu-img", "compare", "-q", "-f", "raw", "-F", "raw", raw, disk).Run() == nil
}

// sameExport downloads an export with the store's root keys and compares it with the image.
func sameExport(ctx context.Context, cl framework.Cluster, ex *hypercloud.VirtualMachineVolumeExport, raw string) bool {
	tmp, err := os.CreateTemp("", "chaos-export-*.qcow2")
	if err != nil {
		return false
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	if _, err := cl.AWS(ctx, "s3", "cp", "--only-show-errors", ex.Status.ObjectURL, tmp.Name()); err != nil {
		return false
	}
	return exec.Command("qemu-img", "compare", "-q", "-F", "raw", tmp.Name(), raw).Run() == nil
}

// grepLogs returns the log lines under dirs that contain any of needles; a file linked into
// two of them is read once.
func grepLogs(dirs []string, needles []string) []string {
	var hits []string
	seen := map[uint64]bool{}
	for _, dir := range dirs {
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || (!strings.HasSuffix(p, ".log") && filepath.Base(p) != "log") {
				return nil
			}
			if info, err := d.Info(); err == nil {
				if st, ok := info.Sys().(*syscall.Stat_t); ok {
					if seen[st.Ino] {
						return nil
					}
					seen[st.Ino] = true
				}
			}
			b, err := os.ReadFile(p) //nolint:gosec // the run's own logs
			if err != nil {
				return nil
			}
			for _, line := range bytes.Split(b, []byte("\n")) {
				for _, n := range needles {
					if n != "" && bytes.Contains(line, []byte(n)) {
						hits = append(hits, fmt.Sprintf("%s: %.120s", filepath.Base(filepath.Dir(p))+"/"+filepath.Base(p), line))
						break
					}
				}
			}
			return nil
		})
	}
	return hits
}
