package gateway

import (
	"fmt"
	"maps"
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
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if out[name], err = newMember(name, data); err != nil {
			return nil, fmt.Errorf("member cluster %s (%s): %w", name, f, err)
		}
	}
	return out, nil
}

// newMember is the member cluster name, reached with the kubeconfig in data. The kubeconfig
// must hold everything inline: one that names files (a token file, a client certificate or
// CA by path) or runs a command (exec, an auth provider) would have the gateway read its own
// files — its service account's token among them — or run a program, for whoever wrote the
// kubeconfig, so it is refused.
func newMember(name string, data []byte) (*Cluster, error) {
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 || name == HostCluster || name == AllClusters {
		return nil, fmt.Errorf("its name must be a DNS label other than %q: %s", HostCluster, strings.Join(errs, "; "))
	}
	kc, err := clientcmd.Load(data)
	if err != nil {
		return nil, err
	}
	for n, a := range kc.AuthInfos {
		switch {
		case a.Exec != nil || a.AuthProvider != nil:
			return nil, fmt.Errorf("its user %q runs a command or an auth provider for its credentials: give a token or a client certificate inline", n)
		case a.TokenFile != "" || a.ClientCertificate != "" || a.ClientKey != "":
			return nil, fmt.Errorf("its user %q names files (tokenFile, client-certificate, client-key): give their contents inline (token, client-certificate-data, client-key-data)", n)
		case a.Impersonate != "" || a.ImpersonateUID != "" || len(a.ImpersonateGroups) > 0 || len(a.ImpersonateUserExtra) > 0:
			return nil, fmt.Errorf("its user %q impersonates: the gateway impersonates each caller there, and only them", n)
		}
	}
	for n, c := range kc.Clusters {
		if c.CertificateAuthority != "" {
			return nil, fmt.Errorf("its cluster %q names a CA file: give it inline (certificate-authority-data)", n)
		}
	}
	cfg, err := clientcmd.NewDefaultClientConfig(*kc, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, err
	}
	cfg.Timeout = memberTimeout
	return NewCluster(name, cfg)
}

// members are the member clusters: those registered with the gateway (Members), and
// KubeSphere's (KubeSphere) of other names.
func (s *Server) members() map[string]*Cluster {
	if s.KubeSphere == nil {
		return s.Members
	}
	out := s.KubeSphere.clusters()
	maps.Copy(out, s.Members)
	return out
}

// brokenMembers are KubeSphere's Clusters not served, each with why, but for names a member
// registered with the gateway serves.
func (s *Server) brokenMembers() map[string]string {
	out := s.KubeSphere.brokenAll()
	for n := range s.Members {
		delete(out, n)
	}
	return out
}

// clusterNames are the host's and the members', sorted after the host.
func (s *Server) clusterNames() []string {
	names := []string{HostCluster}
	for n := range s.members() {
		names = append(names, n)
	}
	slices.Sort(names[1:])
	return names
}

// clusterOf is the cluster of ?cluster=: the host when none is named.
func (s *Server) clusterOf(name string) (*Cluster, error) {
	if name == "" || name == HostCluster {
		return s.Host, nil
	}
	if m := s.members()[name]; m != nil {
		return m, nil
	}
	if why := s.brokenMembers()[name]; why != "" {
		return nil, fail(http.StatusServiceUnavailable, "ServiceUnavailable", "the cluster %q is KubeSphere's but cannot be reached from this gateway: %s", name, why)
	}
	return nil, fail(http.StatusNotFound, "NotFound", "the cluster %q is not registered with this gateway, which serves %s (and %s for all of them, in a list)",
		name, strings.Join(s.clusterNames(), ", "), AllClusters)
}
