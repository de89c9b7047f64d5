package storage

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// Reaches says whether node can use volume pv: pv has no node affinity (network storage every
// node reaches), or node meets one of its required terms, as the scheduler reads them. A
// node-local volume (TopoLVM, local-path, OpenEBS LocalPV) reaches only its node.
func Reaches(pv *corev1.PersistentVolume, node *corev1.Node) (bool, error) {
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return true, nil
	}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		ok, err := meets(term, node)
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
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
		req, err := labels.NewRequirement("name", operator(f.Operator), f.Values)
		if err != nil {
			return false, err
		}
		if !req.Matches(labels.Set{"name": node.Name}) {
			return false, nil
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
