package gateway

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// AllClusters is the ?cluster= of a list across the host and every member.
const AllClusters = "*"

// memberTimeout bounds each request to a member's apiserver: a cluster that cannot be reached
// is said to be so, not waited for.
const memberTimeout = 10 * time.Second

// Cluster is one cluster the gateway serves: the host, where it runs, or a member the
// administrator registered. Own acts there with the gateway's rights (only the names of
// namespaces, for a cluster-wide view); AsCaller as each request's caller, impersonated, so
// that the cluster's own RBAC decides what the caller may do there.
type Cluster struct {
	Name     string
	Own      client.Client
	AsCaller client.WithWatch
}

// NewCluster is the cluster named name, reached with cfg.
func NewCluster(name string, cfg *rest.Config) (*Cluster, error) {
	opts := client.Options{Scheme: clientgoscheme.Scheme, Mapper: mapper()}
	own, err := client.New(cfg, opts)
	if err != nil {
		return nil, err
	}
	as, err := callerClient(cfg, opts)
	if err != nil {
		return nil, err
	}
	return &Cluster{Name: name, Own: own, AsCaller: as}, nil
}

// LoadMembers reads the member clusters registered in dir: each file <name>.kubeconfig is the
// kubeconfig the gateway reaches that member with (a mounted Secret's keys; chart value
// gateway.memberClusters.secretName). Its user needs there what the gateway's service account
// has on the host: impersonate users, groups, service accounts, UIDs and extras, and list
// namespaces; callers are authenticated on the host and impersonated on the member.
func LoadMembers(dir string) (map[string]*Cluster, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.kubeconfig"))
	if err != nil {
		return nil, err
	}
	out := map[string]*Cluster{}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".kubeconfig")
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 || name == HostCluster {
			return nil, fmt.Errorf("member cluster %s: its name (the file's, before .kubeconfig) must be a DNS label other than %q: %s", f, HostCluster, strings.Join(errs, "; "))
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		cfg, err := clientcmd.RESTConfigFromKubeConfig(data)
		if err != nil {
			return nil, fmt.Errorf("member cluster %s: %w", name, err)
		}
		cfg.Timeout = memberTimeout
		if out[name], err = NewCluster(name, cfg); err != nil {
			return nil, fmt.Errorf("member cluster %s: %w", name, err)
		}
	}
	return out, nil
}

// clusterNames are the host's and the members', sorted after the host.
func (s *Server) clusterNames() []string {
	names := []string{HostCluster}
	for n := range s.Members {
		names = append(names, n)
	}
	slices.Sort(names[1:])
	return names
}

// clusterOf is the cluster of ?cluster=: the host when none is named.
func (s *Server) clusterOf(name string) (*Cluster, error) {
	switch {
	case name == "" || name == HostCluster:
		return s.Host, nil
	case s.Members[name] != nil:
		return s.Members[name], nil
	}
	return nil, fail(http.StatusNotFound, "NotFound", "the cluster %q is not registered with this gateway, which serves %s (and %s for all of them, in a list)",
		name, strings.Join(s.clusterNames(), ", "), AllClusters)
}
