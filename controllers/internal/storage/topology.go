package storage

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// AnnotationSelectedNode is where the scheduler writes the node of a claim's first consumer;
// on a DiskVolume, the node its PVC is provisioned on.
const AnnotationSelectedNode = "volume.kubernetes.io/selected-node"

// Reaches says whether node can use volume pv: pv has no node affinity (network storage every
// node reaches), or node meets one of its required terms, as the scheduler reads them (a term
// that cannot be read is skipped, as the scheduler skips it). A node-local volume (TopoLVM,
// local-path, OpenEBS LocalPV) reaches only its node.
func Reaches(pv *corev1.PersistentVolume, node *corev1.Node) bool {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return true
	}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		if ok, err := meets(term, node); err == nil && ok {
			return true
		}
	}
	return false
}

// Lost says whether pv's volume is on nodes none of which is in the cluster: its affinity
// names nodes, and none of nodes meets it. A node lost for good is deleted from the cluster,
// and a node-local volume's data goes with it unless the node comes back. A volume of a zone
// or region (Zonal) is never lost: a zone without nodes (scaled to none) still holds it.
func Lost(pv *corev1.PersistentVolume, nodes []corev1.Node) bool {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return false
	}
	if Zonal(pv) {
		return false
	}
	for i := range nodes {
		if Reaches(pv, &nodes[i]) {
			return false
		}
	}
	return true
}

// Zonal says whether pv's affinity names a zone or region (topology.kubernetes.io/zone, and
// the drivers' own keys: topology.gke.io/zone, topology.ebs.csi.aws.com/zone, ...) rather than
// nodes alone: a volume of EBS, Persistent Disk or Azure Disk, which outlives any node.
func Zonal(pv *corev1.PersistentVolume) bool {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return false
	}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, req := range term.MatchExpressions {
			if k := strings.ToLower(req.Key); strings.Contains(k, "zone") || strings.Contains(k, "region") {
				return true
			}
		}
	}
	return false
}

// meets says whether node meets every requirement of term; a term of none is met by no node.
func meets(term corev1.NodeSelectorTerm, node *corev1.Node) (bool, error) {
	if len(term.MatchExpressions) == 0 && len(term.MatchFields) == 0 {
		return false, nil
	}
	for _, f := range term.MatchFields {
		if f.Key != "metadata.name" {
			return false, fmt.Errorf("node affinity on the field %q, which the scheduler does not know", f.Key)
		}
		// Compared as such: a node's name may be longer than a label's value.
		in := slices.Contains(f.Values, node.Name)
		switch f.Operator {
		case corev1.NodeSelectorOpIn:
			if !in {
				return false, nil
			}
		case corev1.NodeSelectorOpNotIn:
			if in {
				return false, nil
			}
		default:
			return false, fmt.Errorf("node affinity on metadata.name with the operator %s", f.Operator)
		}
	}
	sel := labels.NewSelector()
	for _, e := range term.MatchExpressions {
		req, err := labels.NewRequirement(e.Key, operator(e.Operator), e.Values)
		if err != nil {
			return false, err
		}
		sel = sel.Add(*req)
	}
	return sel.Matches(labels.Set(node.Labels)), nil
}

func operator(op corev1.NodeSelectorOperator) selection.Operator {
	switch op {
	case corev1.NodeSelectorOpIn:
		return selection.In
	case corev1.NodeSelectorOpNotIn:
		return selection.NotIn
	case corev1.NodeSelectorOpExists:
		return selection.Exists
	case corev1.NodeSelectorOpDoesNotExist:
		return selection.DoesNotExist
	case corev1.NodeSelectorOpGt:
		return selection.GreaterThan
	case corev1.NodeSelectorOpLt:
		return selection.LessThan
	}
	return selection.Operator(strings.ToLower(string(op)))
}

// Placement says where pv can be used, for a person: "every node", or its node affinity's
// values (a node-local volume's node).
func Placement(pv *corev1.PersistentVolume) string {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return "every node"
	}
	var terms []string
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		var all []string
		for _, e := range append(term.MatchExpressions, term.MatchFields...) {
			all = append(all, strings.TrimSpace(fmt.Sprintf("%s %s %s", e.Key, strings.ToLower(string(e.Operator)), strings.Join(e.Values, ","))))
		}
		terms = append(terms, strings.Join(all, " and "))
	}
	return "nodes with " + strings.Join(terms, " or ")
}

// NodeLocal says whether pv's volume is node-local: its affinity admits at most one of nodes
// (TopoLVM, local-path), rather than a zone's nodes or every node.
func NodeLocal(pv *corev1.PersistentVolume, nodes []corev1.Node) bool {
	if pv.Spec.NodeAffinity == nil {
		return false
	}
	reached := 0
	for i := range nodes {
		if Reaches(pv, &nodes[i]) {
			reached++
		}
	}
	return reached <= 1
}

// VolumeOf is the PersistentVolume pvc is bound to, nil when none is.
func VolumeOf(ctx context.Context, c client.Reader, pvc *corev1.PersistentVolumeClaim) (*corev1.PersistentVolume, error) {
	if pvc.Spec.VolumeName == "" {
		return nil, nil
	}
	pv := &corev1.PersistentVolume{}
	if err := c.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, pv); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return pv, nil
}

// NodeReaching is the first node by name that takes new pods and reaches pv, and whether pv is
// node-local (NodeLocal); "" when no node reaches it now.
func NodeReaching(ctx context.Context, c client.Reader, pv *corev1.PersistentVolume) (string, bool, error) {
	nodes := &corev1.NodeList{}
	if err := c.List(ctx, nodes); err != nil {
		return "", false, err
	}
	slices.SortFunc(nodes.Items, func(a, b corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	for i := range nodes.Items {
		if n := &nodes.Items[i]; !n.Spec.Unschedulable && Reaches(pv, n) {
			return n.Name, NodeLocal(pv, nodes.Items), nil
		}
	}
	return "", NodeLocal(pv, nodes.Items), nil
}
