package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// KubeSphere registers its member clusters as Cluster objects (cluster.kubesphere.io/v1alpha1,
// cluster-scoped), each holding the kubeconfig ks-apiserver reaches the member with
// (spec.connection.kubeconfig); the host's own is labelled cluster-role.kubesphere.io/host.
var kubesphereClusters = schema.GroupVersionResource{Group: "cluster.kubesphere.io", Version: "v1alpha1", Resource: "clusters"}

// KubeSphereHostLabel marks KubeSphere's Cluster object of the host cluster.
const KubeSphereHostLabel = "cluster-role.kubesphere.io/host"

// kubesphereRetry is how long the gateway waits to look again for KubeSphere's Cluster kind
// when the host does not serve it, and after a failed watch.
var kubesphereRetry = time.Minute

// kubesphereRelist is the least time between two lists of the Clusters.
const kubesphereRelist = time.Second

// KubeSphereClusters are the member clusters of KubeSphere's Cluster objects, kept up to date
// by a watch (WatchKubeSphere): a Cluster added is served at once under its name, one
// deleted is gone. A Cluster the gateway cannot reach itself (an agent's, type proxy, holds
// no kubeconfig; or its kubeconfig is refused, newMember) is named with the reason.
type KubeSphereClusters struct {
	log *slog.Logger

	mu      sync.RWMutex
	members map[string]*Cluster
	sums    map[string][sha256.Size]byte // of each member's kubeconfig, to keep its clients while it stays
	why     map[string]string            // the Clusters not served, and why
}

// WatchKubeSphere follows KubeSphere's Cluster objects on the cluster of cfg, read with the
// gateway's own rights (list and watch clusters.cluster.kubesphere.io), until ctx ends.
func WatchKubeSphere(ctx context.Context, cfg *rest.Config, log *slog.Logger) (*KubeSphereClusters, error) {
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	k := &KubeSphereClusters{log: log, members: map[string]*Cluster{}, sums: map[string][sha256.Size]byte{}, why: map[string]string{}}
	go k.follow(ctx, dc.Resource(kubesphereClusters))
	return k, nil
}

func (k *KubeSphereClusters) follow(ctx context.Context, res dynamic.ResourceInterface) {
	absent := false
	for ctx.Err() == nil {
		err := k.once(ctx, res)
		switch {
		case ctx.Err() != nil:
			return
		case apierrors.IsNotFound(err):
			if !absent {
				k.log.Info("KubeSphere's Cluster kind is not served here: no KubeSphere member clusters; looking again each minute")
			}
			absent = true
		case err != nil:
			k.log.Error("KubeSphere's member clusters", "error", err)
		default:
			absent = false
			continue // a watch the apiserver ended: list and watch again at once
		}
		select {
		case <-ctx.Done():
		case <-time.After(kubesphereRetry):
		}
	}
}

// once lists the Clusters, takes them, and watches until the watch ends; each change lists
// them again (they are few).
func (k *KubeSphereClusters) once(ctx context.Context, res dynamic.ResourceInterface) error {
	list, err := res.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	k.take(list.Items)
	w, err := res.Watch(ctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
	if err != nil {
		return err
	}
	defer w.Stop()
	began := time.Now()
	events := w.ResultChan()
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-events:
			if !ok {
				if time.Since(began) < kubesphereRelist { // a watch that ends at once is not followed at once
					time.Sleep(kubesphereRelist)
				}
				return nil
			}
		}
		// Changes come in bursts (KubeSphere writes a Cluster's status often): one list for all
		// that come within kubesphereRelist.
		for quiet := time.After(kubesphereRelist); ; {
			select {
			case _, ok := <-events:
				if ok {
					continue
				}
			case <-quiet:
			case <-ctx.Done():
				return nil
			}
			break
		}
		if list, err = res.List(ctx, metav1.ListOptions{}); err != nil {
			return err
		}
		k.take(list.Items)
	}
}

// take makes the members those of items.
func (k *KubeSphereClusters) take(items []unstructured.Unstructured) {
	members, sums, why := map[string]*Cluster{}, map[string][sha256.Size]byte{}, map[string]string{}
	k.mu.RLock()
	old, oldSums := k.members, k.sums
	k.mu.RUnlock()
	for _, it := range items {
		name := it.GetName()
		if _, host := it.GetLabels()[KubeSphereHostLabel]; host || name == HostCluster {
			continue // the host is served already, with its callers' own rights
		}
		cl, sum, err := memberOf(it, old[name], oldSums[name])
		if err != nil {
			why[name] = err.Error()
			continue
		}
		members[name], sums[name] = cl, sum
	}
	k.mu.Lock()
	for n := range members {
		if old[n] == nil {
			k.log.Info("KubeSphere member cluster served", "cluster", n)
		}
	}
	for n, w := range why {
		if k.why[n] != w {
			k.log.Warn("KubeSphere member cluster not served", "cluster", n, "reason", w)
		}
	}
	k.members, k.sums, k.why = members, sums, why
	k.mu.Unlock()
}

// memberOf is the member of Cluster it: was (whose kubeconfig's sum is wasSum) while its
// kubeconfig stays the same, or a new one.
func memberOf(it unstructured.Unstructured, was *Cluster, wasSum [sha256.Size]byte) (*Cluster, [sha256.Size]byte, error) {
	kc, _, _ := unstructured.NestedString(it.Object, "spec", "connection", "kubeconfig")
	switch typ, _, _ := unstructured.NestedString(it.Object, "spec", "connection", "type"); {
	case typ == "proxy":
		// Its kubeconfig, which KubeSphere's agent writes, names the member's apiserver as the
		// member sees it, which from here is another server, or none.
		return nil, wasSum, fmt.Errorf("it is reached through KubeSphere's agent (connection type proxy), by ks-apiserver only")
	case kc == "":
		return nil, wasSum, fmt.Errorf("its connection (type %q) holds no kubeconfig", typ)
	}
	data, err := base64.StdEncoding.DecodeString(kc)
	if err != nil {
		return nil, wasSum, fmt.Errorf("spec.connection.kubeconfig is not base64: %w", err)
	}
	sum := sha256.Sum256(data)
	if was != nil && sum == wasSum {
		return was, sum, nil
	}
	cl, err := newMember(it.GetName(), data)
	if err != nil {
		return nil, sum, fmt.Errorf("its kubeconfig: %w", err)
	}
	return cl, sum, nil
}

// clusters are the members served now.
func (k *KubeSphereClusters) clusters() map[string]*Cluster {
	out := map[string]*Cluster{}
	if k == nil {
		return out
	}
	k.mu.RLock()
	defer k.mu.RUnlock()
	maps.Copy(out, k.members)
	return out
}

// brokenAll are the Clusters not served, each with why.
func (k *KubeSphereClusters) brokenAll() map[string]string {
	out := map[string]string{}
	if k == nil {
		return out
	}
	k.mu.RLock()
	defer k.mu.RUnlock()
	maps.Copy(out, k.why)
	return out
}
