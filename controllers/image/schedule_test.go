package image_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	virtualmachine "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/goldenimage"
	"github.com/diskpipe/diskpipe/controllers/image"
	"github.com/diskpipe/diskpipe/controllers/internal/ctrltest"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// scheduled is a scheduled image under test: its checks and the images of its revisions are
// played by the test as the kubelet would run them.
type scheduled struct {
	t   *testing.T
	g   *WithT
	vmi *hypercloud.VirtualMachineImage
}

func (s *scheduled) status() *common.ImageStatus {
	s.t.Helper()
	s.g.Expect(env.Client.Get(s.t.Context(), client.ObjectKeyFromObject(s.vmi), s.vmi)).To(Succeed())
	return &s.vmi.Status
}

func (s *scheduled) schedule() *common.ScheduleStatus {
	if st := s.status(); st.Schedule != nil {
		return st.Schedule
	}
	return &common.ScheduleStatus{}
}

func (s *scheduled) upToDate() string {
	if c := meta.FindStatusCondition(s.status().Conditions, image.ConditionUpToDate); c != nil {
		return c.Reason + ": " + c.Message
	}
	return ""
}

// check answers check number n with res.
func (s *scheduled) check(n int, res transfer.Result, phase corev1.PodPhase) {
	s.t.Helper()
	name := fmt.Sprintf("vmim-%s-check-%d", s.vmi.Name, n)
	pod := ctrltest.Pod(s.t, env, s.vmi.Namespace, name)
	s.g.Expect(strings.Join(pod.Spec.Containers[0].Args, " ")).To(ContainSubstring(" --check "))
	exit := int32(0)
	if phase == corev1.PodFailed {
		exit = transfer.ExitFailed
		if res.Transient {
			exit = transfer.ExitTransient
		}
	}
	kubelet(s.t, s.vmi.Namespace, name, phase, &res, exit)
	s.g.Eventually(func() bool {
		return apierrors.IsNotFound(env.Client.Get(s.t.Context(), client.ObjectKey{Namespace: s.vmi.Namespace, Name: name}, &corev1.Pod{}))
	}, 20*time.Second).Should(BeTrue(), "the check's pod is deleted once read")
}

// revision is the image made for rev, once it exists.
func (s *scheduled) revision(rev string) *hypercloud.VirtualMachineImage {
	s.t.Helper()
	img := &hypercloud.VirtualMachineImage{}
	s.g.Eventually(func() (string, error) {
		list := &hypercloud.VirtualMachineImageList{}
		err := env.Client.List(s.t.Context(), list, client.InNamespace(s.vmi.Namespace), client.MatchingLabels{image.LabelScheduledBy: string(s.vmi.UID)})
		for i := range list.Items {
			if list.Items[i].Annotations[image.AnnotationRevision] == rev {
				*img = list.Items[i]
				return img.Name, err
			}
		}
		return "", err
	}, 20*time.Second).ShouldNot(BeEmpty(), "an image for revision %s", rev)
	return img
}

// importRevision plays the probe and the import of rev's image; a non-empty failure fails the
// import for good with that reason.
func (s *scheduled) importRevision(rev string, failure transfer.Reason) *hypercloud.VirtualMachineImage {
	s.t.Helper()
	img := s.revision(rev)
	ns := img.Namespace
	ctrltest.Complete(s.t, env, ns, "vmim-"+img.Name+"-probe-0", transfer.Result{Format: "qcow2", VirtualSize: 1 << 30, Revision: rev})
	ctrltest.Bind(s.t, env, ns, "vmim-"+img.Name)
	if failure != "" {
		kubelet(s.t, ns, "vmim-"+img.Name+"-import-0", corev1.PodFailed,
			&transfer.Result{Reason: failure, Message: "the image is broken"}, transfer.ExitFailed)
	} else {
		ctrltest.Complete(s.t, env, ns, "vmim-"+img.Name+"-import-0", transfer.Result{Format: "qcow2", VirtualSize: 1 << 30, Revision: rev,
			Digest: "sha256:" + strings.Repeat("0", 64)})
	}
	return img
}

// current is the image a disk made now would be cloned from.
func (s *scheduled) current() string {
	golden, err := goldenimage.Lookup(s.t.Context(), env.Client, goldenimage.KindVirtualMachineImage, s.vmi.Namespace, s.vmi.Name)
	if err != nil {
		return err.Error()
	}
	return golden.Obj.GetName() + " " + golden.PVC.Name
}

func digestOf(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }

// TestScheduledImage: a registry image checked every 2 seconds, keeping 2 revisions. Each new
// digest gets an image of its own, pinned to that digest; the newest Ready one is what
// disks are made from; an unchanged digest, a failed check and a failed import keep the
// current one; older ones are pruned, each once no clone reads it; the source going back to
// a kept revision makes it current again; deleting the scheduled image deletes them all.
func TestScheduledImage(t *testing.T) {
	startManager(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "schedule")
	g.Expect(err).NotTo(HaveOccurred())
	vmi := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "fedora", Namespace: ns, Labels: map[string]string{"os": "fedora"}},
		Spec: hypercloud.VirtualMachineImageSpec{
			Source:   hypercloud.VirtualMachineImageSource{Registry: &common.RegistrySource{URL: "docker://registry.example.com:5000/fedora:latest"}},
			Schedule: &common.ImageSchedule{Cron: "@every 2s", Keep: ptr.To[int32](2)}}}
	g.Expect(env.Client.Create(ctx, vmi)).To(Succeed())
	s := &scheduled{t: t, g: g, vmi: vmi}
	g.Eventually(func() string { return readyReason(s.status()) }, 20*time.Second).Should(Equal("WaitingForRevision"))
	g.Expect(s.current()).To(ContainSubstring("has no Ready revision yet"))

	// The first check finds digest a: an image pinned to it is made and imported.
	before := time.Now()
	s.check(0, transfer.Result{Succeeded: true, Revision: digestOf('a')}, corev1.PodSucceeded)
	a := s.revision(digestOf('a'))
	g.Expect(a.Spec.Source.Registry.URL).To(Equal("docker://registry.example.com:5000/fedora@" + digestOf('a')))
	g.Expect(a.Spec.Schedule).To(BeNil())
	g.Expect(metav1.IsControlledBy(a, vmi)).To(BeTrue())
	g.Expect(a.Labels).To(HaveKeyWithValue("os", "fedora"))
	g.Eventually(s.upToDate, 10*time.Second).Should(HavePrefix("Updating: revision " + digestOf('a') + " is being imported into " + a.Name))
	ss := s.schedule()
	g.Expect(ss.Checks).To(Equal(int64(1)))
	g.Expect(ss.LastCheckTime.Time).To(BeTemporally(">=", before.Truncate(time.Second)))
	g.Expect(ss.NextCheckTime.Time).To(BeTemporally("~", ss.LastCheckTime.Add(2*time.Second), time.Second))
	s.importRevision(digestOf('a'), "")
	g.Eventually(func() string { return s.schedule().Current }, 20*time.Second).Should(Equal(a.Name))
	st := s.status()
	g.Expect(st.Phase).To(Equal(common.PhaseReady))
	g.Expect(st.Revision).To(Equal(digestOf('a')))
	g.Expect(st.PVCName).To(Equal("vmim-" + a.Name))
	g.Expect(s.upToDate()).To(HavePrefix("Updated: "))
	g.Expect(st.Schedule.UpToDateTime).NotTo(BeNil())
	g.Expect(st.Schedule.OutOfDateTime.Time).To(BeTemporally(">", st.Schedule.UpToDateTime.Time))
	g.Expect(s.current()).To(Equal(a.Name + " vmim-" + a.Name))

	// Unchanged: nothing is made.
	s.check(1, transfer.Result{Succeeded: true, Revision: digestOf('a')}, corev1.PodSucceeded)
	g.Eventually(s.upToDate, 10*time.Second).Should(HavePrefix("Unchanged: the source is still at revision " + digestOf('a')))

	// A new digest: imported, then current; a is kept (keep is 2).
	s.check(2, transfer.Result{Succeeded: true, Revision: digestOf('b')}, corev1.PodSucceeded)
	b := s.importRevision(digestOf('b'), "")
	g.Eventually(s.current, 20*time.Second).Should(Equal(b.Name + " vmim-" + b.Name))
	g.Expect(s.schedule().Revisions).To(HaveLen(2))

	// A check that fails keeps the current image and says why.
	s.check(3, transfer.Result{Reason: transfer.ReasonSourceUnavailable, Transient: true, Message: "registry.example.com: connection refused"}, corev1.PodFailed)
	g.Eventually(s.upToDate, 10*time.Second).Should(Equal("SourceUnavailable: the check failed: registry.example.com: connection refused; disks are still made from " + b.Name))
	g.Expect(s.status().Phase).To(Equal(common.PhaseReady))

	// A revision whose import fails keeps the current image too.
	s.check(4, transfer.Result{Succeeded: true, Revision: digestOf('c')}, corev1.PodSucceeded)
	c := s.importRevision(digestOf('c'), transfer.ReasonMalformedImage)
	g.Eventually(s.upToDate, 20*time.Second).Should(HavePrefix("UpdateFailed: the import of revision " + digestOf('c') + " into " + c.Name + " failed (MalformedImage"))
	g.Expect(s.current()).To(Equal(b.Name + " vmim-" + b.Name))

	// A disk is being cloned from a when d is found: a is pruned (keep 2: d and b), but waits
	// for the clone; the failed c, older than the current d, goes at once. The disk's PVCs hold
	// a: diskpipe's, for a disk made from a.
	disk := &diskvolume.DiskVolume{ObjectMeta: metav1.ObjectMeta{Name: "disk-of-a", Namespace: ns}, Spec: diskvolume.DiskVolumeSpec{
		Source: diskvolume.DiskVolumeSource{Image: &diskvolume.ImageSource{Name: common.LocalName(a.Name), Kind: goldenimage.KindVirtualMachineImage}}}}
	g.Expect(env.Client.Create(ctx, disk)).To(Succeed())
	g.Eventually(func() []corev1.PersistentVolumeClaim {
		clones := &corev1.PersistentVolumeClaimList{}
		_ = env.Client.List(ctx, clones, client.InNamespace(ns), client.MatchingLabels{goldenimage.LabelCloneOf: string(a.UID)})
		return clones.Items
	}, 20*time.Second).ShouldNot(BeEmpty())
	s.check(5, transfer.Result{Succeeded: true, Revision: digestOf('d')}, corev1.PodSucceeded)
	d := s.importRevision(digestOf('d'), "")
	g.Eventually(s.current, 20*time.Second).Should(Equal(d.Name + " vmim-" + d.Name))
	gone := func(name string) func() bool {
		return func() bool {
			return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &hypercloud.VirtualMachineImage{}))
		}
	}
	g.Eventually(gone(c.Name), 20*time.Second).Should(BeTrue())
	held := &hypercloud.VirtualMachineImage{}
	heldPhase := func() common.Phase {
		g.Expect(env.Client.Get(ctx, client.ObjectKeyFromObject(a), held)).To(Succeed())
		return held.Status.Phase
	}
	g.Eventually(heldPhase, 10*time.Second).Should(Equal(common.PhaseDeleting))
	g.Consistently(heldPhase, 3*time.Second).Should(Equal(common.PhaseDeleting))
	g.Expect(env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vmim-" + a.Name}, &corev1.PersistentVolumeClaim{})).To(Succeed(), "a's golden PVC stays while the clone reads it")
	g.Expect(env.Client.Delete(ctx, disk)).To(Succeed()) // the clone ends
	g.Eventually(gone(a.Name), 30*time.Second).Should(BeTrue())
	g.Eventually(func() []string {
		var names []string
		for _, r := range s.schedule().Revisions {
			names = append(names, r.Image)
		}
		return names
	}, 10*time.Second).Should(Equal([]string{d.Name, b.Name}))

	// The tag goes back to b, which is still kept: b is current again, nothing is imported.
	s.check(6, transfer.Result{Succeeded: true, Revision: digestOf('b')}, corev1.PodSucceeded)
	g.Eventually(s.current, 20*time.Second).Should(Equal(b.Name + " vmim-" + b.Name))
	g.Expect(s.schedule().Revisions).To(HaveLen(2))

	// Deleting the scheduled image deletes the images of its revisions.
	g.Expect(env.Client.Delete(ctx, vmi)).To(Succeed())
	g.Eventually(gone(vmi.Name), 30*time.Second).Should(BeTrue())
	g.Expect(gone(b.Name)()).To(BeTrue())
	g.Expect(gone(d.Name)()).To(BeTrue())
}

// TestScheduleValidation: what the API refuses, and a schedule the controller cannot parse.
func TestScheduleValidation(t *testing.T) {
	startManager(t)
	g := NewWithT(t)
	ctx := t.Context()
	ns, err := env.CreateNamespace(ctx, "schedule-validation")
	g.Expect(err).NotTo(HaveOccurred())
	sched := &common.ImageSchedule{Cron: "@daily"}
	for name, src := range map[string]virtualmachine.ImageTemplateSource{
		"schedule needs an http, objectStore, s3 or registry source": {Clone: &virtualmachine.ObjectReference{Name: "other"}},
		"checksum does not apply": {HTTP: &common.HTTPSource{URL: "https://example.com/a.qcow2"},
			Checksum: "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"},
	} {
		imt := &virtualmachine.ImageTemplate{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: ns},
			Spec: virtualmachine.ImageTemplateSpec{Source: src, Schedule: sched}}
		err := env.Client.Create(ctx, imt)
		g.Expect(err).To(MatchError(ContainSubstring(name)))
	}
	plain := &virtualmachine.ImageTemplate{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: ns},
		Spec: virtualmachine.ImageTemplateSpec{Source: virtualmachine.ImageTemplateSource{HTTP: &common.HTTPSource{URL: "https://example.com/a.qcow2"}}}}
	g.Expect(env.Client.Create(ctx, plain)).To(Succeed())
	g.Eventually(func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(plain), plain); err != nil {
			return err
		}
		plain.Spec.Schedule = sched
		return env.Client.Update(ctx, plain)
	}, 10*time.Second).Should(MatchError(ContainSubstring("schedule cannot be added or removed")))

	bad := &virtualmachine.ImageTemplate{ObjectMeta: metav1.ObjectMeta{Name: "typo", Namespace: ns},
		Spec: virtualmachine.ImageTemplateSpec{Source: virtualmachine.ImageTemplateSource{HTTP: &common.HTTPSource{URL: "https://example.com/a.qcow2"}},
			Schedule: &common.ImageSchedule{Cron: "every day"}}}
	g.Expect(env.Client.Create(ctx, bad)).To(Succeed())
	g.Eventually(func() common.Phase { return phase(status(t, bad, &bad.Status)()) }, 20*time.Second).Should(Equal(common.PhaseFailed))
	g.Expect(readyReason(&bad.Status)).To(Equal("InvalidSchedule"))
	g.Expect(meta.FindStatusCondition(bad.Status.Conditions, common.ConditionReady).Message).To(ContainSubstring(`spec.schedule.cron "every day"`))
	// Fixed, it recovers: the first check starts.
	g.Eventually(func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(bad), bad); err != nil {
			return err
		}
		bad.Spec.Schedule.Cron = "@every 2h"
		return env.Client.Update(ctx, bad)
	}, 10*time.Second).Should(Succeed())
	// Its first check fails: the image says why, and waits for the next check.
	kubelet(t, ns, "imt-typo-check-0", corev1.PodFailed,
		&transfer.Result{Reason: transfer.ReasonSourceNotFound, Message: "https://example.com/a.qcow2: 404 Not Found"}, transfer.ExitFailed)
	g.Eventually(func() string { return readyReason(status(t, bad, &bad.Status)()) }, 20*time.Second).Should(Equal("SourceNotFound"))
	g.Expect(bad.Status.Phase).To(Equal(common.PhasePending))
	g.Expect(meta.FindStatusCondition(bad.Status.Conditions, common.ConditionReady).Message).To(
		Equal("the check failed: https://example.com/a.qcow2: 404 Not Found; no revision is imported yet"))
	g.Expect(bad.Status.Schedule.NextCheckTime.Time).To(BeTemporally(">", time.Now().Add(time.Hour)), "a permanent failure waits for the schedule")

	// A suspended schedule makes no check, and says so.
	paused := &virtualmachine.ImageTemplate{ObjectMeta: metav1.ObjectMeta{Name: "paused", Namespace: ns},
		Spec: virtualmachine.ImageTemplateSpec{Source: virtualmachine.ImageTemplateSource{HTTP: &common.HTTPSource{URL: "https://example.com/a.qcow2"}},
			Schedule: &common.ImageSchedule{Cron: "@every 1h", Suspend: ptr.To(true)}}}
	g.Expect(env.Client.Create(ctx, paused)).To(Succeed())
	g.Eventually(func() string {
		c := meta.FindStatusCondition(status(t, paused, &paused.Status)().Conditions, image.ConditionUpToDate)
		if c == nil {
			return ""
		}
		return c.Reason + ": " + c.Message
	}, 20*time.Second).Should(Equal("Suspended: the schedule is suspended (spec.schedule.suspend): no check is made until it is cleared"))
	g.Consistently(func() error {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "imt-paused-check-0"}, &corev1.Pod{})
	}, 2*time.Second).
		ShouldNot(Succeed(), "no check while suspended")
}
