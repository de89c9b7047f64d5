package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/diskpipe/diskpipe/internal/authn"
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
	synced  bool
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
	for range w.ResultChan() {
		if list, err = res.List(ctx, metav1.ListOptions{}); err != nil {
			return err
		}
		k.take(list.Items)
	}
	return nil
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
	k.members, k.sums, k.why, k.synced = members, sums, why, true
	k.mu.Unlock()
}

// memberOf is the member of Cluster it: was (whose kubeconfig's sum is wasSum) while its
// kubeconfig stays the same, or a new one.
func memberOf(it unstructured.Unstructured, was *Cluster, wasSum [sha256.Size]byte) (*Cluster, [sha256.Size]byte, error) {
	kc, _, _ := unstructured.NestedString(it.Object, "spec", "connection", "kubeconfig")
	if kc == "" {
		typ, _, _ := unstructured.NestedString(it.Object, "spec", "connection", "type")
		return nil, wasSum, fmt.Errorf("its connection (type %q) holds no kubeconfig: a member reached through KubeSphere's agent is reached by ks-apiserver only", typ)
	}
	data, err := base64.StdEncoding.DecodeString(kc)
	if err != nil {
		return nil, wasSum, fmt.Errorf("spec.connection.kubeconfig is not base64: %v", err)
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

// broken is why the Cluster name is not served; "" when it is, or is none.
func (k *KubeSphereClusters) broken(name string) string {
	if k == nil {
		return ""
	}
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.why[name]
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

// Synced says the Clusters have been read once.
func (k *KubeSphereClusters) Synced() bool {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.synced
}

// KubeSphereTokens reviews KubeSphere's own tokens (the JWTs ks-apiserver issues its users,
// which it forwards unchanged to an extension's APIService, and which the Kubernetes
// apiserver does not know) with ks-apiserver's token review, POST /oauth/authenticate. A user
// it vouches for is impersonated under their KubeSphere name: KubeSphere writes its project
// roles as Kubernetes RoleBindings to that name (kind User), so Kubernetes' RBAC decides, as
// for any caller. The gateway never trusts ks-apiserver's X-Remote-User headers, which any
// client that reaches the gateway could send.
type KubeSphereTokens struct {
	// URL is ks-apiserver's (http://ks-apiserver.kubesphere-system.svc).
	URL    string
	Client *http.Client
}

// kubesphereName is what a KubeSphere user's name is (KubeSphere's own rule); any other name
// it vouched for — above all system:… or one with a colon, which name Kubernetes' own
// users, groups and service accounts — is refused rather than impersonated.
var kubesphereName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,62}[a-z0-9])?$`)

// Review asks ks-apiserver who bears token.
func (k *KubeSphereTokens) Review(ctx context.Context, token string) (authenticationv1.UserInfo, bool, error) {
	body, err := json.Marshal(map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": map[string]string{"token": token}})
	if err != nil {
		return authenticationv1.UserInfo{}, false, err
	}
	ctx, cancel := context.WithTimeout(ctx, memberTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(k.URL, "/")+"/oauth/authenticate", bytes.NewReader(body))
	if err != nil {
		return authenticationv1.UserInfo{}, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := k.Client.Do(req)
	if err != nil {
		return authenticationv1.UserInfo{}, false, fmt.Errorf("asking KubeSphere: %w", err)
	}
	defer resp.Body.Close()
	var tr struct {
		Status struct {
			Authenticated bool `json:"authenticated"`
			User          struct {
				Username string `json:"username"`
			} `json:"user"`
		} `json:"status"`
	}
	switch {
	case resp.StatusCode == http.StatusBadRequest || resp.StatusCode == http.StatusUnauthorized:
		return authenticationv1.UserInfo{}, false, nil // ks-apiserver's answer to a token it did not issue, or one expired
	case resp.StatusCode != http.StatusOK:
		return authenticationv1.UserInfo{}, false, fmt.Errorf("KubeSphere's token review answered %s", resp.Status)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&tr); err != nil {
		return authenticationv1.UserInfo{}, false, fmt.Errorf("KubeSphere's token review: %w", err)
	}
	name := tr.Status.User.Username
	if !tr.Status.Authenticated {
		return authenticationv1.UserInfo{}, false, nil
	}
	if !kubesphereName.MatchString(name) {
		return authenticationv1.UserInfo{}, false, &authn.Error{Status: http.StatusUnauthorized,
			Message: fmt.Sprintf("KubeSphere vouches for the user %q, a name the gateway does not act as: a KubeSphere user's name is lowercase letters, digits, '-' and '.', and any other (system:…, or one with a colon) would name a Kubernetes user, group or service account", name)}
	}
	return authenticationv1.UserInfo{Username: name, Groups: []string{"system:authenticated"}}, true, nil
}
