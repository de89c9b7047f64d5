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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// Driver is the CSI stand-in's provisioner name.
const Driver = "local.csi.diskpipe.io"

// csi stands in for a CSI driver, the external provisioner and snapshotter, and Kubernetes'
// PV controller: a volume is a directory named as its PersistentVolume, a clone or restore a
// sparse (reflink where the filesystem can) copy of one; a claim made pre-bound to a volume
// is bound once the volume's claimRef names it (diskpipe hands filled volumes over so).
type csi struct {
	c   client.Client
	dir string

	mu    sync.Mutex
	loops map[string]string // block volume file → loop device
}

// blockDevice is a block volume's device: its file, block.img, attached to a loop device
// where the machine allows it (root, /dev/loop-control), else the file itself.
func (s *csi) blockDevice(volume string, size int64) (string, error) {
	file := filepath.Join(s.volumeDir(volume), "block.img")
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

// volumeDir is the directory of the PersistentVolume named volume.
func (s *csi) volumeDir(volume string) string     { return filepath.Join(s.dir, "volumes", volume) }
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
		if pvc.Spec.VolumeName != "" {
			if err := s.bindPreBound(ctx, pvc); err != nil {
				return fmt.Errorf("binding %s/%s: %w", pvc.Namespace, pvc.Name, err)
			}
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
	if err := s.release(ctx, pvcs.Items); err != nil {
		return err
	}
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

const (
	pvcProtection = "kubernetes.io/pvc-protection"
	pvProtection  = "kubernetes.io/pv-protection"
)

// release deletes the volumes (their PersistentVolume and data) whose claim is gone.
func (s *csi) release(ctx context.Context, pvcs []corev1.PersistentVolumeClaim) error {
	claims := map[types.UID]bool{}
	for _, p := range pvcs {
		claims[p.UID] = true
	}
	pvs := &corev1.PersistentVolumeList{}
	if err := s.c.List(ctx, pvs); err != nil {
		return err
	}
	exists := map[string]bool{}
	for i := range pvs.Items {
		pv := &pvs.Items[i]
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != Driver {
			continue
		}
		exists[s.volumeDir(pv.Name)] = true
		ref := pv.Spec.ClaimRef
		if ref == nil || claims[ref.UID] {
			continue
		}
		// Not in the list: gone, or made (or handed the volume) since it was taken.
		claim := &corev1.PersistentVolumeClaim{}
		err := s.c.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, claim)
		if err == nil && claim.UID == ref.UID {
			continue
		}
		if client.IgnoreNotFound(err) != nil {
			return err
		}
		if controllerutil.RemoveFinalizer(pv, pvProtection) { // kube-controller-manager's pv-protection
			if err := s.c.Update(ctx, pv); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
		if err := s.c.Delete(ctx, pv); client.IgnoreNotFound(err) != nil {
			return err
		}
		delete(exists, s.volumeDir(pv.Name))
	}
	dirs, _ := filepath.Glob(filepath.Join(s.dir, "volumes", "*"))
	for _, d := range dirs {
		if !exists[d] {
			s.detach(d)
			_ = os.RemoveAll(d)
		}
	}
	return nil
}

// bindPreBound plays the PV controller for a claim that names its volume: bound once the
// volume's claimRef is the claim.
func (s *csi) bindPreBound(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	pv := &corev1.PersistentVolume{}
	if err := s.c.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, pv); err != nil {
		return client.IgnoreNotFound(err)
	}
	if pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != pvc.UID {
		return nil // the volume is another claim's still
	}
	pvc.Status.Phase = corev1.ClaimBound
	pvc.Status.AccessModes = pv.Spec.AccessModes
	pvc.Status.Capacity = pv.Spec.Capacity
	return s.c.Status().Update(ctx, pvc)
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

// provision makes the claim's volume (a PersistentVolume named as the external-provisioner
// names it) and binds the claim to it.
func (s *csi) provision(ctx context.Context, pvc *corev1.PersistentVolumeClaim) error {
	volume := "pvc-" + string(pvc.UID)
	dst := s.volumeDir(volume)
	if ds := pvc.Spec.DataSource; ds != nil {
		var src string
		switch ds.Kind {
		case "PersistentVolumeClaim":
			from := &corev1.PersistentVolumeClaim{}
			if err := s.c.Get(ctx, client.ObjectKey{Namespace: pvc.Namespace, Name: ds.Name}, from); err != nil || from.Status.Phase != corev1.ClaimBound {
				return nil // the source is not there yet
			}
			src = s.volumeDir(from.Spec.VolumeName)
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
	size := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: volume}, Spec: corev1.PersistentVolumeSpec{
		Capacity: corev1.ResourceList{corev1.ResourceStorage: size}, AccessModes: pvc.Spec.AccessModes,
		StorageClassName: ptr.Deref(pvc.Spec.StorageClassName, ""), VolumeMode: pvc.Spec.VolumeMode,
		PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
		ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID},
		PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: Driver, VolumeHandle: dst}},
	}}
	if err := s.c.Create(ctx, pv); client.IgnoreAlreadyExists(err) != nil {
		return err
	}
	pvc.Spec.VolumeName = volume
	if err := s.c.Update(ctx, pvc); err != nil {
		return err
	}
	pvc.Status.Phase = corev1.ClaimBound
	pvc.Status.AccessModes = pvc.Spec.AccessModes
	pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: size}
	return s.c.Status().Update(ctx, pvc)
}

func (s *csi) snapshot(ctx context.Context, snap *snapshotv1.VolumeSnapshot) error {
	name := ptr.Deref(snap.Spec.Source.PersistentVolumeClaimName, "")
	pvc := &corev1.PersistentVolumeClaim{}
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: snap.Namespace, Name: name}, pvc); err != nil || pvc.Status.Phase != corev1.ClaimBound {
		return nil
	}
	if err := copyDir(s.volumeDir(pvc.Spec.VolumeName), s.snapshotDir(snap.Namespace, snap.Name)); err != nil {
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
