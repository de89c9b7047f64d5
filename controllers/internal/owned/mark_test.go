package owned

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// TestMarks: a mark holds for the child it was made for, and for nothing else: another name,
// namespace, kind or owner, another key, an edited mark; a child older than the key is
// diskpipe's whatever its mark.
func TestMarks(t *testing.T) {
	since := time.Now()
	UseKey([]byte("the key of this test"), since)
	owner := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: "a", UID: "owner-uid"}}
	child := func(name, ns string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, CreationTimestamp: metav1.NewTime(since.Add(time.Minute)),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "PersistentVolumeClaim", Name: "owner", UID: "owner-uid", Controller: ptr.To(true)}}}}
	}
	made := child("pod", "a")
	Stamp("Pod", made, owner.UID)
	if !Mine("Pod", made, owner) {
		t.Fatal("a child stamped for its owner is not its")
	}
	copied := func(name, ns string) *corev1.Pod {
		c := child(name, ns)
		c.Annotations = made.Annotations
		return c
	}
	for what, c := range map[string]struct {
		kind string
		obj  *corev1.Pod
	}{
		"the mark copied to another name":      {"Pod", copied("other", "a")},
		"the mark copied to another namespace": {"Pod", copied("pod", "b")},
		"the mark taken for another kind":      {"Secret", copied("pod", "a")},
		"no mark, made after the key":          {"Pod", child("pod", "a")},
	} {
		if Mine(c.kind, c.obj, owner) {
			t.Errorf("%s is taken as diskpipe's", what)
		}
	}
	edited := copied("pod", "a")
	edited.Annotations = map[string]string{AnnotationMade: made.Annotations[AnnotationMade] + "x"}
	if Mine("Pod", edited, owner) {
		t.Error("an edited mark is taken")
	}
	other := owner.DeepCopy()
	other.UID = "another-uid"
	if Mine("Pod", made, other) || Marked("Pod", made, other.UID) {
		t.Error("a child is taken as another owner's")
	}
	old := child("pod", "a")
	old.CreationTimestamp = metav1.NewTime(since.Add(-time.Hour))
	if !Mine("Pod", old, owner) {
		t.Error("a child made before marks is not taken")
	}
	old.Annotations = map[string]string{AnnotationMade: "of a key since lost"}
	if !Mine("Pod", old, owner) {
		t.Error("a child made before the key, with a mark of another key, is not taken")
	}

	UseKey([]byte("another key"), since)
	if Mine("Pod", made, owner) {
		t.Error("a mark under another key is taken")
	}
}

// TestUnderController: a child made under its owner's controller (CreateUnder's) is its
// owner's, when it lists the owner beside that controller and carries the owner's mark; not
// when its controller is another, when it does not list the owner, or when it is unmarked.
// MadeFor finds the marked owner among its references.
func TestUnderController(t *testing.T) {
	since := time.Now()
	UseKey([]byte("the key of this test"), since)
	controller := metav1.OwnerReference{APIVersion: "cdi.kubevirt.io/v1beta1", Kind: "DataVolume", Name: "root", UID: "dv-uid", Controller: ptr.To(true)}
	disk := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "root", Namespace: "a", UID: "disk-uid",
		OwnerReferences: []metav1.OwnerReference{controller}}}
	plain := metav1.OwnerReference{APIVersion: "v1", Kind: "PersistentVolumeClaim", Name: "root", UID: "disk-uid"}
	claim := func(refs ...metav1.OwnerReference) *corev1.PersistentVolumeClaim {
		c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "root", Namespace: "a", CreationTimestamp: metav1.NewTime(since.Add(time.Minute)),
			OwnerReferences: refs}}
		Stamp("PersistentVolumeClaim", c, disk.UID)
		return c
	}
	if c := claim(controller, plain); !Controls(disk, c) || !MineUnder("PersistentVolumeClaim", c, disk) || Mine("PersistentVolumeClaim", c, disk) {
		t.Fatal("a claim under the disk's controller, owned by the disk, is not the disk's by MineUnder (or is by Mine, which asks for the disk as controller)")
	}
	if ref := MadeFor("PersistentVolumeClaim", claim(controller, plain), "PersistentVolumeClaim"); ref == nil || ref.UID != disk.UID {
		t.Fatalf("MadeFor answers %v, not the disk", ref)
	}
	another := controller
	another.UID = "another-dv"
	for what, c := range map[string]*corev1.PersistentVolumeClaim{
		"controlled by another object":        claim(another, plain),
		"not listing the disk":                claim(controller),
		"listing the disk with no controller": claim(plain),
	} {
		if Controls(disk, c) || MineUnder("PersistentVolumeClaim", c, disk) {
			t.Errorf("a claim %s is taken as the disk's", what)
		}
	}
	unmarked := claim(controller, plain)
	unmarked.Annotations = nil
	if !Controls(disk, unmarked) || MineUnder("PersistentVolumeClaim", unmarked, disk) {
		t.Error("an unmarked claim under the disk's controller is taken as the disk's (or not seen as under it)")
	}
	if MadeFor("PersistentVolumeClaim", unmarked, "PersistentVolumeClaim") != nil {
		t.Error("MadeFor names the owner of an unmarked claim")
	}
	if MadeFor("PersistentVolumeClaim", claim(controller, plain), "DiskVolume") != nil {
		t.Error("MadeFor names an owner of a kind it was not asked for")
	}
}
