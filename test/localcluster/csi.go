package localcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// Driver is the CSI stand-in's provisioner name.
const Driver = "local.csi.diskpipe.io"

// csi stands in for a CSI driver and the external provisioner and snapshotter: a volume is a
// directory, a clone or restore a sparse (reflink where the filesystem can) copy of one.
type csi struct {
	c   client.Client
	dir string

	mu    sync.Mutex
	loops map[string]string // block volume file → loop device
}

// blockDevice is a block volume's device: its file, block.img, attached to a loop device
// where the machine allows it (root, /dev/loop-control), else the file itself.
func (s *csi) blockDevice(ns, name string, size int64) (string, error) {
	file := filepath.Join(s.volumeDir(ns, name), "block.img")
	if _, err := os.Stat(file); os.IsNotExist(err) {
		f, err := os.Create(file)
		if err != nil {
			return "", err
		}
		err = f.Truncate(size)
		f.Close()
		if err != nil {
			return "", err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if dev, ok := s.loops[file]; ok {
		return dev, nil
	}
	out, err := exec.Command("losetup", "--find", "--show", file).Output()
	if err != nil {
		return file, nil //nolint:nilerr // no loop devices here: the file stands in for the device
	}
	if s.loops == nil {
		s.loops = map[string]string{}
	}
	dev := strings.TrimSpace(string(out))
	s.loops[file] = dev
	return dev, nil
}

// detach releases the loop devices of files under dir.
func (s *csi) detach(dir string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for file, dev := range s.loops {
		if strings.HasPrefix(file, dir+"/") || dir == "" {
			_ = exec.Command("losetup", "-d", dev).Run()
			delete(s.loops, file)
		}
	}
}

func (s *csi) volumeDir(ns, name string) string   { return filepath.Join(s.dir, "volumes", ns, name) }
func (s *csi) snapshotDir(ns, name string) string { return filepath.Join(s.dir, "snapshots", ns, name) }

// sync provisions, clones, restores and snapshots what is waiting; deleted objects' data goes.
func (s *csi) sync(ctx context.Context, pods []corev1.Pod) error {
	pvcs := &corev1.PersistentVolumeClaimList{}
	if err := s.c.List(ctx, pvcs); err != nil {
		return err
	}
	used := map[string]bool{}
	for _, p := range pods {
		for _, v := range p.Spec.Volumes {
			if v.PersistentVolumeClaim != nil {
				used[p.Namespace+"/"+v.PersistentVolumeClaim.ClaimName] = true
			}
		}
	}
	for i := range pvcs.Items {
		pvc := &pvcs.Items[i]
		if !pvc.DeletionTimestamp.IsZero() {
			s.unprotect(ctx, pvc, used)
			continue
		}
		if pvc.Status.Phase == corev1.ClaimBound {
			continue
		}
		sc, err := s.class(ctx, pvc)
		if err != nil || sc == nil {
			continue // not ours
		}
		if sc.VolumeBindingMode != nil && *sc.VolumeBindingMode == storagev1.VolumeBindingWaitForFirstConsumer && !used[pvc.Namespace+"/"+pvc.Name] {
			continue
		}
		if err := s.provision(ctx, pvc); err != nil {
			return fmt.Errorf("provisioning %s/%s: %w", pvc.Namespace, pvc.Name, err)
		}
	}
	s.release(pvcs.Items)
	snaps := &snapshotv1.VolumeSnapshotList{}
	if err := s.c.List(ctx, snaps); err != nil {
		return err
	}
	for i := range snaps.Items {
		snap := &snaps.Items[i]
		if snap.Status != nil && ptr.Deref(snap.Status.ReadyToUse, false) {
			continue
		}
		if err := s.snapshot(ctx, snap); err != nil {
			return fmt.Errorf("snapshotting %s/%s: %w", snap.Namespace, snap.Name, err)
		}
	}
	return nil
}

// unprotect plays kube-controller-manager's pvc-protection controller: a deleted PVC that no
// pod uses loses the finalizer the apiserver gave it, and goes.
func (s *csi) unprotect(ctx context.Context, pvc *corev1.PersistentVolumeClaim, used map[string]bool) {
	if used[pvc.Namespace+"/"+pvc.Name] || !controllerutil.ContainsFinalizer(pvc, pvcProtection) {
		return
	}
	patch := client.MergeFrom(pvc.DeepCopy())
	controllerutil.RemoveFinalizer(pvc, pvcProtection)
	_ = s.c.Patch(ctx, pvc, patch)
}

const pvcProtection = "kubernetes.io/pvc-protection"

// release deletes the data of volumes whose PVC is gone.
func (s *csi) release(pvcs []corev1.PersistentVolumeClaim) {
	exists := map[string]bool{}
	for _, p := range pvcs {
		exists[s.volumeDir(p.Namespace, p.Name)] = true
	}
	dirs, _ := filepath.Glob(filepath.Join(s.dir, "volumes", "*", "*"))
	for _, d := range dirs {
		if !exists[d] {
			s.detach(d)
			_ = os.RemoveAll(d)
		}
	}
}

// class is the PVC's StorageClass when the stand-in provisions it.
func (s *csi) class(ctx context.Context, pvc *corev1.PersistentVolumeClaim) (*storagev1.StorageClass, error) {
	list := &storagev1.StorageClassList{}
	if err := s.c.List(ctx, list); err != nil {
		return nil, err
	}
	for i := range list.Items {
		sc := &list.Items[i]
		named := pvc.Spec.StorageClassName != nil && *pvc.Spec.StorageClassName == sc.Name
		isDefault := pvc.Spec.StorageClassName == nil && sc.Annotations["storageclass.kubernetes.io/is-default-class"] == "true"
		if (named || isDefault) && sc.Provisioner == Driver {
			return sc, nil
		}
	}
	return nil, nil
}

func (s *csi) provision(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	dst := s.volumeDir(pvc.Namespace, pvc.Name)
	if ds := pvc.Spec.DataSource; ds != nil {
		var src string
		switch ds.Kind {
		case "PersistentVolumeClaim":
			from := &corev1.PersistentVolumeClaim{}
			if err := s.c.Get(ctx, client.ObjectKey{Namespace: pvc.Namespace, Name: ds.Name}, from); err != nil || from.Status.Phase != corev1.ClaimBound {
				return nil // the source is not there yet
			}
			src = s.volumeDir(pvc.Namespace, ds.Name)
		case "VolumeSnapshot":
			snap := &snapshotv1.VolumeSnapshot{}
			if err := s.c.Get(ctx, client.ObjectKey{Namespace: pvc.Namespace, Name: ds.Name}, snap); err != nil ||
				snap.Status == nil || !ptr.Deref(snap.Status.ReadyToUse, false) {
				return nil
			}
			src = s.snapshotDir(pvc.Namespace, ds.Name)
		}
		if err := copyDir(src, dst); err != nil {
			return err
		}
	} else if err := os.MkdirAll(dst, 0o777); err != nil {
		return err
	}
	_ = os.Chmod(dst, 0o777) //nolint:gosec // the pods' processes share it, as a volume's fsGroup would
	pvc.Status.Phase = corev1.ClaimBound
	pvc.Status.AccessModes = pvc.Spec.AccessModes
	pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: pvc.Spec.Resources.Requests[corev1.ResourceStorage]}
	return s.c.Status().Update(ctx, pvc)
}

func (s *csi) snapshot(ctx context.Context, snap *snapshotv1.VolumeSnapshot) error {
	name := ptr.Deref(snap.Spec.Source.PersistentVolumeClaimName, "")
	pvc := &corev1.PersistentVolumeClaim{}
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: snap.Namespace, Name: name}, pvc); err != nil || pvc.Status.Phase != corev1.ClaimBound {
		return nil
	}
	if err := copyDir(s.volumeDir(snap.Namespace, name), s.snapshotDir(snap.Namespace, snap.Name)); err != nil {
		return err
	}
	size := pvc.Status.Capacity[corev1.ResourceStorage]
	now := metav1.Now()
	// The content, as the snapshotter would make it: cluster-scoped, ready, bound to the
	// snapshot.
	content := &snapshotv1.VolumeSnapshotContent{ObjectMeta: metav1.ObjectMeta{Name: "snapcontent-" + string(snap.UID)},
		Spec: snapshotv1.VolumeSnapshotContentSpec{
			Driver: Driver, DeletionPolicy: snapshotv1.VolumeSnapshotContentDelete,
			Source:                  snapshotv1.VolumeSnapshotContentSource{SnapshotHandle: ptr.To(s.snapshotDir(snap.Namespace, snap.Name))},
			VolumeSnapshotRef:       corev1.ObjectReference{Kind: "VolumeSnapshot", Namespace: snap.Namespace, Name: snap.Name, UID: snap.UID},
			VolumeSnapshotClassName: snap.Spec.VolumeSnapshotClassName,
		}}
	if err := s.c.Create(ctx, content); client.IgnoreAlreadyExists(err) != nil {
		return err
	}
	content.Status = &snapshotv1.VolumeSnapshotContentStatus{ReadyToUse: ptr.To(true), RestoreSize: ptr.To(size.Value()),
		SnapshotHandle: ptr.To(s.snapshotDir(snap.Namespace, snap.Name))}
	if err := s.c.Status().Update(ctx, content); err != nil {
		return err
	}
	snap.Status = &snapshotv1.VolumeSnapshotStatus{ReadyToUse: ptr.To(true), RestoreSize: &size, CreationTime: &now,
		BoundVolumeSnapshotContentName: &content.Name}
	return s.c.Status().Update(ctx, snap)
}

// copyDir copies a volume: sparse, and by reflink where the filesystem can.
func copyDir(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	_ = os.RemoveAll(dst)
	out, err := exec.Command("cp", "-a", "--reflink=auto", "--sparse=always", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cp %s %s: %w: %s", src, dst, err, out)
	}
	return nil
}
