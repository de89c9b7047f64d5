package hostcopy

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// TestServingBounded: copies of one PVC across namespaces start at most MaxServing clone-source
// pods in its namespace, MaxServingPerNamespace for the copies of one namespace; the next copy
// waits with a BusyError that says so (and starts nothing there), a copy whose pod exists goes
// on, and one ending lets the next start. Another PVC of the namespace has its own bound (one
// step, with a fake client).
func TestServingBounded(t *testing.T) {
	c := fakeClient(t)
	var cfg importpod.Config
	cfg.Defaults()
	src := Source{Namespace: "images", Name: "golden"}
	owner := func(i int) *corev1.ConfigMap { // two copies from each namespace
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("disk-%d", i), Namespace: fmt.Sprintf("vms-%d", i/2), UID: types.UID(fmt.Sprintf("u%d", i))}}
	}
	prepare := func(o *corev1.ConfigMap, s Source) error {
		_, err := Prepare(t.Context(), c, c, cfg, o, s, &importpod.Spec{})
		return err
	}
	if err := prepare(owner(0), src); err != nil {
		t.Fatal(err)
	}
	if err := prepare(owner(1), src); err != nil {
		t.Fatal(err)
	}
	var busy *BusyError
	third := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "disk-third", Namespace: "vms-0", UID: "u-third"}}
	if err := prepare(third, src); !errors.As(err, &busy) || err.Error() !=
		"2 copies of images/golden are being served to namespace vms-0, as many as one namespace may have at once; this one starts when one of them ends" {
		t.Fatalf("a third copy of one namespace: %v", err)
	}
	for i := 2; i < MaxServing; i++ {
		if err := prepare(owner(i), src); err != nil {
			t.Fatalf("copy %d: %v", i, err)
		}
	}
	if err := prepare(owner(MaxServing), src); !errors.As(err, &busy) || err.Error() !=
		"4 copies of images/golden are being served from its namespace to others, as many as may be at once; this one starts when one of them ends" {
		t.Fatalf("copy over the bound: %v", err)
	}
	pods := &corev1.PodList{}
	if err := c.List(t.Context(), pods); err != nil || len(pods.Items) != MaxServing {
		t.Fatalf("%d clone-source pods, %v", len(pods.Items), err)
	}
	if err := prepare(owner(0), src); err != nil {
		t.Errorf("a copy whose pod serves already: %v", err)
	}
	if err := prepare(owner(MaxServing), Source{Namespace: "images", Name: "other"}); err != nil {
		t.Errorf("a copy of another PVC: %v", err)
	}
	own := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "replica", Namespace: "images", UID: "u-own"}}
	if err := prepare(own, Source{Namespace: "images", Name: "golden", Remote: true}); err != nil {
		t.Errorf("the namespace's own copy (a replica) while others hold every slot: %v", err)
	}
	if err := Cleanup(t.Context(), c, owner(2), "images"); err != nil {
		t.Fatal(err)
	}
	if err := prepare(owner(MaxServing), src); err != nil {
		t.Errorf("a copy once one ended: %v", err)
	}
}

// TestNoSourceForACopyThatCannotRun: a clone source is started only for a copy whose volume
// can take it: bound, or of a class that binds it with its writer. A volume of a class that
// does not exist, or not bound in a class that binds at once, waits with a BusyError that
// says why, and holds no slot of the source (one step, with a fake client).
func TestNoSourceForACopyThatCannotRun(t *testing.T) {
	c := fakeClient(t)
	var cfg importpod.Config
	cfg.Defaults()
	src := Source{Namespace: "images", Name: "golden"}
	late, now := storagev1.VolumeBindingWaitForFirstConsumer, storagev1.VolumeBindingImmediate
	for _, obj := range []client.Object{
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "late"}, Provisioner: "x", VolumeBindingMode: &late},
		&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "now"}, Provisioner: "x", VolumeBindingMode: &now},
	} {
		if err := c.Create(t.Context(), obj); err != nil {
			t.Fatal(err)
		}
	}
	for i, tc := range []struct {
		class string
		bound bool
		want  string
	}{
		{"no-such-class", false, "the copy's volume disk-0 is of storage class no-such-class, which does not exist: its clone source starts when the volume can be made"},
		{"now", false, "the copy's volume disk-1 (storage class now) is not bound yet: its clone source starts when it is"},
		{"now", true, ""},
		{"late", false, ""},
	} {
		name := fmt.Sprintf("disk-%d", i)
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "vms"},
			Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &tc.class}}
		if err := c.Create(t.Context(), pvc); err != nil {
			t.Fatal(err)
		}
		if tc.bound {
			pvc.Status.Phase = corev1.ClaimBound
			if err := c.Status().Update(t.Context(), pvc); err != nil {
				t.Fatal(err)
			}
		}
		owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "vms", UID: types.UID(name)}}
		_, err := Prepare(t.Context(), c, c, cfg, owner, src, &importpod.Spec{PVC: name})
		started := c.Get(t.Context(), types.NamespacedName{Namespace: "images", Name: sourceName(owner)}, &corev1.Pod{}) == nil
		switch {
		case tc.want == "" && (err != nil || !started):
			t.Errorf("%s: %v, started %v", name, err, started)
		case tc.want != "" && (err == nil || err.Error() != tc.want || started):
			t.Errorf("%s: %v, started %v; want %q", name, err, started, tc.want)
		}
	}
}

// TestStoppingSourceNotUsed: a clone-source pod being deleted (evicted, or deleted when a copy
// ended) is not given to a copy, though it still runs and has an address: the copy would be
// cut short. The copy waits for it to go (one step, with a fake client).
func TestStoppingSourceNotUsed(t *testing.T) {
	c := fakeClient(t)
	var cfg importpod.Config
	cfg.Defaults()
	src := Source{Namespace: "images", Name: "golden"}
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "disk", Namespace: "vms", UID: "u1"}}
	prepare := func() bool {
		t.Helper()
		ready, err := Prepare(t.Context(), c, c, cfg, owner, src, &importpod.Spec{})
		if err != nil {
			t.Fatal(err)
		}
		return ready
	}
	if prepare() {
		t.Fatal("ready before its pod runs")
	}
	pod := &corev1.Pod{}
	if err := c.Get(t.Context(), types.NamespacedName{Namespace: "images", Name: sourceName(owner)}, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7"}
	if err := c.Status().Update(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	if !prepare() {
		t.Fatal("not ready while its pod serves")
	}
	pod.Finalizers = []string{"diskpipe.test/stopping"}
	if err := c.Update(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	if prepare() {
		t.Error("a stopping clone-source pod was given to the copy")
	}
}

// diskpipes are the labels of pods diskpipe made, which only the manager may give.
var diskpipes = map[string]string{importpod.LabelManagedBy: importpod.ManagedBy}

// fakeClient is a fake client of core objects, for one step's tests, with the key by which
// diskpipe marks its own.
func fakeClient(t *testing.T) client.Client {
	t.Helper()
	if !owned.HasKey() {
		owned.UseKey([]byte("hostcopy test"), time.Time{})
	}
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := storagev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&corev1.Pod{}, &corev1.PersistentVolumeClaim{}).Build()
}

// TestPlainSourceReplaced: a clone source that an older diskpipe made to serve plain HTTP is
// not given to a copy (its token would cross the node network in the clear): it and its
// Secrets are deleted, and the copy waits for one that serves over TLS (one step, with a fake
// client).
func TestPlainSourceReplaced(t *testing.T) {
	c := fakeClient(t)
	var cfg importpod.Config
	cfg.Defaults()
	src := Source{Namespace: "images", Name: "golden"}
	owner := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "disk", Namespace: "vms", UID: "u1"}}
	old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: sourceName(owner), Namespace: "images", Labels: diskpipes},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "importer",
			Args: []string{"--serve", ":8091", "--path", "/source/disk.img", "--token-file", "/var/run/diskpipe/clone/token"}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7"}}
	owned.Stamp("Pod", old, owner.GetUID())
	oldSecrets := []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Name: sourceName(owner), Namespace: "images"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "clone-token-u1", Namespace: "vms"}},
	}
	for _, obj := range []client.Object{old, oldSecrets[0], oldSecrets[1]} {
		if err := c.Create(t.Context(), obj); err != nil {
			t.Fatal(err)
		}
	}
	s := &importpod.Spec{}
	if ready, err := Prepare(t.Context(), c, c, cfg, owner, src, s); err != nil || ready || s.Import.URL != "" {
		t.Fatalf("a plain clone source: ready %v, URL %q, %v", ready, s.Import.URL, err)
	}
	for _, obj := range []client.Object{&corev1.Pod{}, &corev1.Secret{}} {
		if err := c.Get(t.Context(), types.NamespacedName{Namespace: "images", Name: sourceName(owner)}, obj); err == nil {
			t.Errorf("the old %T is left", obj)
		}
	}
	if err := c.Get(t.Context(), types.NamespacedName{Namespace: "vms", Name: "clone-token-u1"}, &corev1.Secret{}); err == nil {
		t.Error("the old importer's token is left")
	}
	// The next pass makes a source that serves over TLS, and the copy reads it so.
	if _, err := Prepare(t.Context(), c, c, cfg, owner, src, &importpod.Spec{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{}
	if err := c.Get(t.Context(), types.NamespacedName{Namespace: "images", Name: sourceName(owner)}, pod); err != nil || !servesTLS(pod) {
		t.Fatalf("the new clone source: %v, args %v", err, pod.Spec.Containers)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.8"}
	if err := c.Status().Update(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	s = &importpod.Spec{}
	if ready, err := Prepare(t.Context(), c, c, cfg, owner, src, s); err != nil || !ready ||
		s.Import.URL != "https://10.0.0.8:8091/disk" || s.Import.ServerName != ServerName || s.Import.CAFile == "" {
		t.Fatalf("ready %v, %+v, %v", ready, s.Import, err)
	}
}

// TestIdleSourceGivesItsSlotUp: a clone source is made with an idle timeout; one that ended
// idle (its copy did not read it) holds no slot while it waits as long again, so another
// namespace's copy starts, and its own copy waits, saying why; after that it is started
// again, subject to the bound like any copy (one step, with a fake client).
func TestIdleSourceGivesItsSlotUp(t *testing.T) {
	c := fakeClient(t)
	var cfg importpod.Config
	cfg.Defaults()
	src := Source{Namespace: "images", Name: "golden"}
	owner := func(i int) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("disk-%d", i), Namespace: fmt.Sprintf("vms-%d", i/2), UID: types.UID(fmt.Sprintf("u%d", i))}}
	}
	prepare := func(i int) error {
		_, err := Prepare(t.Context(), c, c, cfg, owner(i), src, &importpod.Spec{})
		return err
	}
	for i := range MaxServing {
		if err := prepare(i); err != nil {
			t.Fatal(err)
		}
	}
	pod := &corev1.Pod{}
	key := types.NamespacedName{Namespace: "images", Name: sourceName(owner(0))}
	if err := c.Get(t.Context(), key, pod); err != nil {
		t.Fatal(err)
	}
	args := strings.Join(pod.Spec.Containers[0].Args, " ")
	if !strings.Contains(args, "--idle-timeout "+IdleTimeout.String()) || !strings.Contains(args, "--stall-timeout "+StallTimeout.String()) {
		t.Fatalf("a clone source without its limits: %s", args)
	}
	idled := func(at time.Time) {
		t.Helper()
		res := &transfer.Result{}
		res.Fail(transfer.Transient(transfer.ReasonIdle, "no copy read the disk for 10m0s"))
		msg, err := res.Encode()
		if err != nil {
			t.Fatal(err)
		}
		pod.Status = corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{Name: "importer",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: string(msg), FinishedAt: metav1.NewTime(at)}}}}}
		if err := c.Status().Update(t.Context(), pod); err != nil {
			t.Fatal(err)
		}
	}
	idled(time.Now())
	// Its importer, made but not started (not scheduled, say), would read the old address:
	// it is deleted, to be made again with the next source.
	importer := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "disk-0-clone-0", Namespace: "vms-0", Labels: diskpipes}, Status: corev1.PodStatus{Phase: corev1.PodPending}}
	owned.Stamp("Pod", importer, owner(0).GetUID())
	if err := c.Create(t.Context(), importer); err != nil {
		t.Fatal(err)
	}
	var busy *BusyError
	if _, err := Prepare(t.Context(), c, c, cfg, owner(0), src, &importpod.Spec{Name: importer.Name}); !errors.As(err, &busy) ||
		!strings.Contains(err.Error(), "was not read for 10m0s") || !strings.Contains(err.Error(), "gave its slot up") {
		t.Fatalf("the copy whose source idled: %v", err)
	}
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(importer), &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Errorf("an importer not started, left with the address of a source that ended: %v", err)
	}
	// An importer that ended (it read the disk, then wrote on past the idle timeout) has its
	// result read, whatever its source became.
	importer = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "disk-0-clone-1", Namespace: "vms-0", Labels: diskpipes}}
	owned.Stamp("Pod", importer, owner(0).GetUID())
	if err := c.Create(t.Context(), importer); err != nil {
		t.Fatal(err)
	}
	importer.Status.Phase = corev1.PodSucceeded
	if err := c.Status().Update(t.Context(), importer); err != nil {
		t.Fatal(err)
	}
	if ready, err := Prepare(t.Context(), c, c, cfg, owner(0), src, &importpod.Spec{Name: importer.Name}); err != nil || !ready {
		t.Fatalf("an importer that ended, while its source cools down: ready %v, %v", ready, err)
	}
	if err := c.Get(t.Context(), key, pod); err != nil {
		t.Fatalf("the idle source, kept while it waits: %v", err)
	}
	if err := prepare(MaxServing); err != nil {
		t.Fatalf("another namespace's copy, while a source is idle: %v", err)
	}
	idled(time.Now().Add(-IdleTimeout - time.Second))
	// Waited long enough, it starts again as any copy does: once a slot is free.
	if err := prepare(0); !errors.As(err, &busy) || !strings.Contains(err.Error(), "4 copies of images/golden are being served") {
		t.Fatalf("starting again while every slot is taken: %v", err)
	}
	if err := Cleanup(t.Context(), c, owner(MaxServing), "images"); err != nil {
		t.Fatal(err)
	}
	if err := prepare(0); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(t.Context(), key, &corev1.Pod{}); !apierrors.IsNotFound(err) {
		t.Fatalf("an idle source that waited long enough is not deleted to start again: %v", err)
	}
	if err := prepare(0); err != nil {
		t.Fatalf("started again in a free slot: %v", err)
	}
	// A source of its own that ended otherwise holds no slot, and is no pass past the bound.
	if err := c.Get(t.Context(), key, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodFailed}
	if err := c.Status().Update(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	if err := prepare(MaxServing); err != nil {
		t.Fatalf("a copy beside a source that ended: %v", err)
	}
	if err := prepare(0); !errors.As(err, &busy) || !strings.Contains(err.Error(), "4 copies of images/golden are being served") {
		t.Fatalf("a copy whose own source ended, while every slot is taken: %v", err)
	}
}

// TestSourceLocksPruned: a source's lock excludes a second pass while held, and is dropped
// once nobody holds or waits for it, so that the map does not grow with every PVC copied.
func TestSourceLocksPruned(t *testing.T) {
	src := Source{Namespace: "images", Name: "golden"}
	unlock := lockSource(src)
	got := make(chan struct{})
	go func() { defer close(got); lockSource(src)() }()
	select {
	case <-got:
		t.Fatal("a second pass took a held lock")
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	<-got
	sourceLocksMu.Lock()
	defer sourceLocksMu.Unlock()
	if len(sourceLocks) != 0 {
		t.Errorf("%d locks left after every pass ended", len(sourceLocks))
	}
}
