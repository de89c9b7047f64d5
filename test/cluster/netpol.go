package cluster

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// kubeRouterUser is the identity kube-router's NetworkPolicy controller acts as, and the
// ClusterRole it is bound to: what it watches to program each node's firewall.
const kubeRouterUser = "system:kube-router"

// EnforceNetworkPolicies runs kube-router's NetworkPolicy controller (its firewall alone: no
// routing, no service proxy) on every node, and waits until each has programmed its
// firewall; from then on the pods' traffic obeys the cluster's NetworkPolicies, as on a
// cluster whose CNI enforces them. The cluster's own network (a CNI bridge) enforces none.
// stop ends the controllers and removes what they programmed (chains and ipsets), checking
// that the firewall chain is gone.
func (c *Cluster) EnforceNetworkPolicies(ctx context.Context) (stop func() error, err error) {
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: kubeRouterUser},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"namespaces", "pods", "nodes", "services", "endpoints"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: kubeRouterUser},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: kubeRouterUser},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: kubeRouterUser}}}
	for _, obj := range []client.Object{role, binding} {
		if err := c.Client.Create(ctx, obj); client.IgnoreAlreadyExists(err) != nil {
			return nil, err
		}
	}
	api := "https://" + net.JoinHostPort(NodeIP, apiPort)
	var started []*node
	stop = func() error {
		// kube-router v2.1.0's --cleanup-config leaves its chains (and crashes in the service
		// proxy it did not run): they are removed here, with the sets they name.
		for _, n := range started {
			if p := c.procNamed(n.proc("kube-router")); p != nil {
				stopProc(p)
			}
			dropChains(c.opts.Log, n.netns, "KUBE-ROUTER-", "KUBE-NWPLCY-", "KUBE-POD-FW-")
			dropSets(c.opts.Log, n.netns, "KUBE-")
			if out, err := c.inNode(n, "iptables", "-S", "KUBE-ROUTER-FORWARD"); err == nil {
				return fmt.Errorf("%s: kube-router's chains are left: %s", n.name, out)
			}
		}
		return nil
	}
	for i, n := range c.nodes {
		kc, err := c.pki.Kubeconfig(n.proc("kube-router"), api, kubeRouterUser)
		if err != nil {
			return stop, err
		}
		c.step("%s: kube-router (NetworkPolicies enforced)", n.name)
		// Ports of their own on each node (the first shares the machine's network).
		health := strconv.Itoa(20244 + i)
		if err := c.startInNode(n, "kube-router", c.bin("kube-router"), "--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
			"--enable-cni=false", "--enable-ibgp=false", "--enable-overlay=false", "--kubeconfig", kc, "--hostname-override", n.name,
			"--metrics-port=0", "--health-port="+health, "--iptables-sync-period=5s"); err != nil {
			return stop, err
		}
		started = append(started, n)
		if err := c.wait(ctx, n.name+"'s NetworkPolicy firewall", n.proc("kube-router"), 2*time.Minute, func(ctx context.Context) error {
			out, err := c.inNode(n, "iptables", "-S", "KUBE-ROUTER-FORWARD")
			if err != nil {
				return fmt.Errorf("no chain KUBE-ROUTER-FORWARD yet: %w: %s", err, out)
			}
			return nil
		}); err != nil {
			return stop, err
		}
	}
	// The controllers sync each 5 s: one sync more, so that every policy made so far is in.
	time.Sleep(6 * time.Second)
	return stop, nil
}

// inNode runs a command in node n's network (the machine's for the first node) and returns
// its output.
func (c *Cluster) inNode(n *node, bin string, args ...string) (string, error) {
	out, err := inNetns(n.netns, bin, args...).CombinedOutput()
	return string(out), err
}
