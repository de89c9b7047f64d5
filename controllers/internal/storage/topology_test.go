package storage

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestReaches: a volume without node affinity reaches every node; one with it, the nodes that
// meet one of its terms (expressions on labels, fields on the name), as the scheduler reads it.
func TestReaches(t *testing.T) {
	n1 := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"topology.topolvm.io/node": "n1", "zone": "a"}}}
	n2 := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2", Labels: map[string]string{"topology.topolvm.io/node": "n2", "zone": "a"}}}
	pv := func(terms ...corev1.NodeSelectorTerm) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{Spec: corev1.PersistentVolumeSpec{NodeAffinity: &corev1.VolumeNodeAffinity{
			Required: &corev1.NodeSelector{NodeSelectorTerms: terms}}}}
	}
	expr := func(key string, op corev1.NodeSelectorOperator, values ...string) corev1.NodeSelectorTerm {
		return corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: op, Values: values}}}
	}
	for _, tc := range []struct {
		name      string
		pv        *corev1.PersistentVolume
		node      *corev1.Node
		want      bool
		placement string
	}{
		{"network storage", &corev1.PersistentVolume{}, n2, true, "every node"},
		{"its node", pv(expr("topology.topolvm.io/node", corev1.NodeSelectorOpIn, "n1")), n1, true, "nodes with topology.topolvm.io/node in n1"},
		{"another node", pv(expr("topology.topolvm.io/node", corev1.NodeSelectorOpIn, "n1")), n2, false, "nodes with topology.topolvm.io/node in n1"},
		{"either term", pv(expr("topology.topolvm.io/node", corev1.NodeSelectorOpIn, "n1"), expr("zone", corev1.NodeSelectorOpExists)), n2, true,
			"nodes with topology.topolvm.io/node in n1 or zone exists"},
		{"by name", pv(corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"n1"}}}}),
			n1, false, "nodes with metadata.name notin n1"},
		{"an empty term", pv(corev1.NodeSelectorTerm{}), n1, false, "nodes with "},
		{"a long name", pv(corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{strings.Repeat("n", 100)}}}}),
			&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: strings.Repeat("n", 100)}}, true, "nodes with metadata.name in " + strings.Repeat("n", 100)},
		{"a term unread, another met", pv(expr("zone", corev1.NodeSelectorOpGt, "a"), expr("zone", corev1.NodeSelectorOpIn, "a")), n2, true,
			"nodes with zone gt a or zone in a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Reaches(tc.pv, tc.node); got != tc.want {
				t.Errorf("Reaches = %v; want %v", got, tc.want)
			}
			if p := Placement(tc.pv); p != tc.placement {
				t.Errorf("Placement = %q; want %q", p, tc.placement)
			}
		})
	}
	// Node-local: its affinity admits one node of the cluster, not a zone's or every node.
	nodes := []corev1.Node{*n1, *n2}
	for pv, want := range map[*corev1.PersistentVolume]bool{
		{}: false,
		pv(expr("topology.topolvm.io/node", corev1.NodeSelectorOpIn, "n1")): true,
		pv(expr("zone", corev1.NodeSelectorOpIn, "a")):                      false,
	} {
		if got := NodeLocal(pv, nodes); got != want {
			t.Errorf("NodeLocal(%s) = %v; want %v", Placement(pv), got, want)
		}
	}
	// Lost: no node of the cluster meets the affinity of a node's volume; a zone's volume is
	// never lost.
	for _, tc := range []struct {
		pv    *corev1.PersistentVolume
		nodes []corev1.Node
		want  bool
	}{
		{&corev1.PersistentVolume{}, nil, false},
		{pv(expr("topology.topolvm.io/node", corev1.NodeSelectorOpIn, "n1")), nodes, false},
		{pv(expr("topology.topolvm.io/node", corev1.NodeSelectorOpIn, "n1")), []corev1.Node{*n2}, true},
		{pv(expr("topology.topolvm.io/node", corev1.NodeSelectorOpIn, "n1")), nil, true},
		{pv(expr(corev1.LabelTopologyZone, corev1.NodeSelectorOpIn, "b")), nodes, false},
		{pv(expr("topology.ebs.csi.aws.com/zone", corev1.NodeSelectorOpIn, "b")), nil, false},
	} {
		if got := Lost(tc.pv, tc.nodes); got != tc.want {
			t.Errorf("Lost(%s) on %d nodes = %v; want %v", Placement(tc.pv), len(tc.nodes), got, tc.want)
		}
	}
}
