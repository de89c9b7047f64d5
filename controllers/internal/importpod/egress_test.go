package importpod

import (
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/diskpipe/diskpipe/internal/contract"
)

// Every pod gets the egress rule of the configuration as flags, and each namespace a policy
// that lets importer and exporter pods reach DNS, the store, clone sources, the allowed CIDRs
// and the internet but none of the cluster's networks.
func TestEgress(t *testing.T) {
	c := Config{ClusterCIDRs: []string{"10.244.0.0/16", "fd00::/8"}, AllowedDestinations: []string{"10.244.0.1", "10.96.7.0/24", "mirror.local"},
		NetworkPolicy: &NetworkPolicyConfig{ManagerNamespace: "diskpipe-system", StoreLabels: map[string]string{"app.kubernetes.io/component": "objectstore"}, StorePort: 9000}}
	c.Defaults()
	args := strings.Join(Build(c, Spec{Name: "p", Namespace: "ns", Import: contract.Import{Source: "http"}}).Spec.Containers[0].Args, " ")
	for _, want := range []string{"--forbid-cidr 10.244.0.0/16", "--forbid-cidr fd00::/8", "--allow-destination 10.244.0.1",
		"--allow-destination 10.96.7.0/24", "--allow-destination mirror.local"} {
		if !strings.Contains(args, want) {
			t.Errorf("the pod's args lack %q: %s", want, args)
		}
	}
	p := c.egressPolicy("ns")
	if got := p.Spec.PolicyTypes; !slices.Equal(got, []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}) {
		t.Errorf("policy types %v", got)
	}
	if sel := p.Spec.PodSelector.MatchExpressions; len(sel) != 1 || !slices.Equal(sel[0].Values, []string{"importer", "exporter"}) {
		t.Errorf("the policy selects %v: clone sources serve, they do not connect out", p.Spec.PodSelector)
	}
	var blocks []string
	store, exports := false, false
	for _, r := range p.Spec.Egress {
		for _, to := range r.To {
			if to.IPBlock != nil {
				blocks = append(blocks, to.IPBlock.CIDR+" except "+strings.Join(to.IPBlock.Except, ","))
			}
			if to.PodSelector != nil && to.PodSelector.MatchLabels["app.kubernetes.io/component"] == "objectstore" && r.Ports[0].Port.IntVal == 9000 {
				store = true
			}
			if e := to.PodSelector; e != nil && len(e.MatchExpressions) == 1 && e.MatchExpressions[0].Key == exportServiceLabel && r.Ports[0].Port.IntVal == 8443 {
				exports = true
			}
		}
	}
	want := []string{"10.244.0.1/32 except ", "10.96.7.0/24 except ", "0.0.0.0/0 except 10.244.0.0/16", "::/0 except fd00::/8"}
	if !slices.Equal(blocks, want) {
		t.Errorf("ip blocks %q, want %q", blocks, want)
	}
	if !store || !exports {
		t.Errorf("the policy does not let pods reach the store (%t) or KubeVirt's export servers (%t)", store, exports)
	}
	if c.ValidateEgress() != nil || (Config{ClusterCIDRs: []string{"10.0.0.1"}}).ValidateEgress() == nil {
		t.Error("ValidateEgress")
	}
}
