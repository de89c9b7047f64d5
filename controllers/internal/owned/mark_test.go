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
