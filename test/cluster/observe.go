package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/objectstore"
	"github.com/diskpipe/diskpipe/objectstore/tenancy"
	"github.com/diskpipe/diskpipe/test/testenv"
)

// What a long run (make chaos CLUSTER=real) looks back at when it ends: the manager's counters
// over all its pods, the logs of pods long deleted, and the bundled store as root.

// StoreClient reaches the bundled store through its NodePort with its root keys.
func (c *Cluster) StoreClient(ctx context.Context) (*objectstore.Client, error) {
	id, secret, err := c.storeKeys(ctx)
	if err != nil {
		return nil, err
	}
	store, err := objectstore.NewClient(objectstore.ClientConfig{Endpoint: StoreEndpoint, AccessKey: id, SecretKey: secret, BucketLookup: "Path", Scoped: true})
	if err == nil {
		store.ResolveNamespaces(tenancy.UIDs(c.Client))
	}
	return store, err
}

// StoreSecretKey is the bundled store's root secret, which no log line may hold.
func (c *Cluster) StoreSecretKey(ctx context.Context) (string, error) {
	_, secret, err := c.storeKeys(ctx)
	return secret, err
}

// ManagerMetrics reads /metrics of each running manager pod, from the node (pod addresses are
// on its bridge): what it read, and which pods it could not.
func (c *Cluster) ManagerMetrics(ctx context.Context) ([]string, error) {
	pods, err := c.componentPods(ctx, "manager")
	if err != nil {
		return nil, err
	}
	token, err := c.metricsToken(ctx)
	if err != nil {
		return nil, err
	}
	// The manager's certificate for its metrics is self-signed: the token is what is checked.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // see above
	var texts []string
	var errs []error
	for _, p := range pods {
		if p.Status.PodIP == "" || p.DeletionTimestamp != nil {
			continue
		}
		port := 8080
		for _, ctr := range p.Spec.Containers {
			for _, cp := range ctr.Ports {
				if cp.Name == "metrics" {
					port = int(cp.ContainerPort)
				}
			}
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+net.JoinHostPort(p.Status.PodIP, strconv.Itoa(port))+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		// A pod is Ready by its health probe a moment before its metrics server listens.
		for err != nil && errors.Is(err, syscall.ECONNREFUSED) && ctx.Err() == nil {
			time.Sleep(250 * time.Millisecond)
			resp, err = hc.Do(req)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.Name, err))
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = errors.New(resp.Status)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.Name, err))
			continue
		}
		texts = append(texts, string(b))
	}
	if len(texts) == 0 && len(errs) == 0 {
		return nil, errors.New("no manager pod is running")
	}
	return texts, errors.Join(errs...)
}

// metricsToken is a token of the service account metrics-scraper of the release namespace,
// bound to the chart's ClusterRole that may get /metrics, as Prometheus' would be.
func (c *Cluster) metricsToken(ctx context.Context) (string, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "metrics-scraper", Namespace: ReleaseNamespace}}
	if err := c.Client.Create(ctx, sa); client.IgnoreAlreadyExists(err) != nil {
		return "", err
	}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: Release + "-metrics-scraper"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: Release + "-metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.Name, Namespace: ReleaseNamespace}}}
	if err := c.Client.Create(ctx, crb); client.IgnoreAlreadyExists(err) != nil {
		return "", err
	}
	tr := &authenticationv1.TokenRequest{}
	if err := c.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
		return "", fmt.Errorf("a token to read the manager's metrics: %w", err)
	}
	return tr.Status.Token, nil
}

// ManagerCounter sums a counter of the manager's metrics, all its labels, over the running
// manager pods and each pod RestartManager deleted, as it was just before.
func (c *Cluster) ManagerCounter(name string) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	texts, err := c.ManagerMetrics(ctx)
	if err != nil {
		return 0, err
	}
	c.mu.Lock()
	texts = append(texts, c.killedMetrics...)
	unscraped := errors.Join(c.unscraped...)
	c.mu.Unlock()
	if unscraped != nil {
		return 0, fmt.Errorf("manager pods deleted before their metrics were read: %w", unscraped)
	}
	return testenv.SumCounter(texts, name)
}

// KeepPodLogs keeps every container log the kubelet writes, under dir, until ctx ends: the
// kubelet removes a deleted pod's logs, and an importer's pod is deleted once its work is
// done. Each file is hard-linked as it appears, so it keeps what is written to it after.
func (c *Cluster) KeepPodLogs(ctx context.Context, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var srcs []string
	for _, n := range c.nodes {
		srcs = append(srcs, c.podLogs(n))
	}
	go func() {
		for ctx.Err() == nil {
			for _, src := range srcs {
				keepLogs(src, dir)
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return nil
}

// keepLogs hard-links into dir each log under src not kept yet.
func keepLogs(src, dir string) {
	_ = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		rel, _ := filepath.Rel(src, p)
		// By inode, so that a rotated file and its successor are both kept.
		kept := filepath.Join(dir, strings.ReplaceAll(rel, string(filepath.Separator), "_")+"."+strconv.FormatUint(st.Ino, 10)+".log")
		if _, err := os.Lstat(kept); err == nil {
			return nil
		}
		_ = os.Link(p, kept)
		return nil
	})
}
