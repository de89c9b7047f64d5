package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	"github.com/minio/minio-go/v7"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/objectstore"
	"github.com/diskpipe/diskpipe/test/localcluster"
)

// check verifies the end state: everything Ready and identical to its source, nothing left
// over, no secret in any log.
func check(ctx context.Context, c config, cl *localcluster.Cluster, clusterDir, raw string, images []*hypercloud.VirtualMachineImage,
	disks []*diskvolume.DiskVolume, exports []*hypercloud.VirtualMachineVolumeExport) []row {
	k := cl.Client
	var rows []row
	count := func(what string, got, want int) {
		rows = append(rows, row{what, fmt.Sprint(got), fmt.Sprint(want), got == want})
	}
	retries := int32(0)

	// Every object Ready, every disk identical to the image.
	ready, sameImages, stuck := 0, 0, 0
	var firstBad string
	for _, img := range images {
		_ = k.Get(ctx, client.ObjectKeyFromObject(img), img)
		retries += img.Status.Retries
		switch {
		case img.Status.Phase == common.PhaseReady:
			ready++
			if same(raw, cl.VolumePath(img.Namespace, img.Status.PVCName)) {
				sameImages++
			} else if firstBad == "" {
				firstBad = "image " + img.Namespace + "/" + img.Name
			}
		case !final(img.Status.Phase):
			stuck++
		}
	}
	count("images Ready", ready, c.images)
	count("golden disks identical to the source (qemu-img)", sameImages, c.images)
	readyDisks, sameDisks := 0, 0
	for _, d := range disks {
		_ = k.Get(ctx, client.ObjectKeyFromObject(d), d)
		retries += d.Status.Retries
		switch {
		case d.Status.Phase == common.PhaseReady:
			readyDisks++
			if same(raw, cl.VolumePath(d.Namespace, d.Status.PVCName)) {
				sameDisks++
			} else if firstBad == "" {
				firstBad = "disk " + d.Namespace + "/" + d.Name
			}
		case !final(d.Status.Phase):
			stuck++
		}
	}
	count("DiskVolumes Ready", readyDisks, c.disks)
	count("DiskVolumes identical to the image (qemu-img)", sameDisks, c.disks)
	readyExports, sameExports := 0, 0
	var secrets []string
	for _, ex := range exports {
		_ = k.Get(ctx, client.ObjectKeyFromObject(ex), ex)
		retries += ex.Status.Retries
		secrets = append(secrets, objectstore.ScopedSecret(cl.Store.SecretKey, string(ex.UID)))
		switch {
		case ex.Status.Phase == common.PhaseReady:
			readyExports++
			if sameExport(ctx, cl, ex, raw) {
				sameExports++
			} else if firstBad == "" {
				firstBad = "export " + ex.Namespace + "/" + ex.Name
			}
		case !final(ex.Status.Phase):
			stuck++
		}
	}
	count("exports Ready", readyExports, c.exports)
	count("exports identical to the disk (download, qemu-img)", sameExports, c.exports)
	count("objects stuck in a non-final phase", stuck, 0)
	if firstBad != "" {
		rows = append(rows, row{"first that differs", firstBad, "", false})
	}

	// Nothing left over.
	pods := &corev1.PodList{}
	_ = k.List(ctx, pods)
	left := 0
	for _, p := range pods.Items {
		if strings.HasPrefix(p.Namespace, "chaos-") {
			left++
		}
	}
	count("pods left", left, 0)
	pvcs := &corev1.PersistentVolumeClaimList{}
	_ = k.List(ctx, pvcs)
	extra := 0
	for _, p := range pvcs.Items {
		if strings.HasPrefix(p.Namespace, "chaos-") {
			extra++
		}
	}
	count("PVCs beyond the golden ones and the disks", extra-c.images-c.disks, 0)
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
	store := cl.Store.Client()
	uploads := 0
	for _, bucket := range []string{"chaos-src", "chaos-exports"} {
		if res, err := (minio.Core{Client: store.Client}).ListMultipartUploads(ctx, bucket, "", "", "", "", 1000); err == nil {
			uploads += len(res.Uploads)
		}
	}
	count("unfinished multipart uploads", uploads, 0)
	accounts, err := store.ScopedAccounts(ctx)
	if err != nil {
		rows = append(rows, row{"export accounts left in the store", err.Error(), "0", false})
	} else {
		count("export accounts left in the store", len(accounts), 0)
	}

	// No credential or presigned URL in any log line.
	leaks := grepLogs(clusterDir, append(secrets, cl.Store.SecretKey, "X-Amz-Signature=", "X-Amz-Credential="))
	count("log lines with a key or presigned URL", len(leaks), 0)
	if len(leaks) > 0 {
		rows = append(rows, row{"first leak", leaks[0], "", false})
	}
	rows = append(rows, row{"retries recorded in the objects' status", fmt.Sprint(retries), ">= 0", true})
	return rows
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
func sameExport(ctx context.Context, cl *localcluster.Cluster, ex *hypercloud.VirtualMachineVolumeExport, raw string) bool {
	tmp, err := os.CreateTemp("", "chaos-export-*.qcow2")
	if err != nil {
		return false
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	if _, err := cl.Store.AWS(ctx, cl.Store.SecretKey, "s3", "cp", "--only-show-errors", ex.Status.ObjectURL, tmp.Name()); err != nil {
		return false
	}
	return exec.Command("qemu-img", "compare", "-q", "-F", "raw", tmp.Name(), raw).Run() == nil
}

// grepLogs returns the log lines under dir that contain any of needles.
func grepLogs(dir string, needles []string) []string {
	var hits []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || (!strings.HasSuffix(p, ".log") && filepath.Base(p) != "log") {
			return nil
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
	return hits
}
