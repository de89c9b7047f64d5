package plugin

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"

	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/internal/transfer"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// diskpipe's groups: a KIND/NAME must name a kind of one of them.
var groups = map[string]bool{"hypercloud.tmaxanc.com": true, "virtualmachine.kubesphere.io": true, "diskvolume.kubesphere.io": true}

// formerShortNames are short names diskpipe's kinds had before, still taken by kubectl
// diskpipe: vmim, VirtualMachineImage's until it turned out to be KubeVirt's
// VirtualMachineInstanceMigration's too.
var formerShortNames = map[string]string{"vmim": "virtualmachineimages"}

// exports is the VirtualMachineVolumeExport resource.
var exports = schema.GroupVersionResource{Group: "hypercloud.tmaxanc.com", Version: "v1alpha1", Resource: "virtualmachinevolumeexports"}

// exportRef is the VirtualMachineVolumeExport name.
func exportRef(name string) ref {
	return ref{gvr: exports, kind: "VirtualMachineVolumeExport", name: name}
}

type client struct {
	config    *rest.Config
	discovery discovery.CachedDiscoveryInterface
	dyn       dynamic.Interface
	mapper    meta.RESTMapper
	namespace string
}

// ref is one object: its resource, kind and name, in the client's namespace.
type ref struct {
	gvr  schema.GroupVersionResource
	kind string
	name string
}

func (r ref) String() string { return strings.ToLower(r.kind) + "/" + r.name }

func (o *options) client() (*client, error) {
	cfg, err := o.config.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	mapper, err := o.config.ToRESTMapper()
	if err != nil {
		return nil, err
	}
	ns, _, err := o.config.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, err
	}
	disc, err := o.config.ToDiscoveryClient()
	if err != nil {
		return nil, err
	}
	return &client{config: cfg, discovery: disc, dyn: dyn, mapper: mapper, namespace: ns}, nil
}

// resolve turns KIND/NAME into a reference, with the names kubectl knows (short names too,
// through discovery).
func (c *client) resolve(arg string) (ref, error) {
	kind, name, ok := strings.Cut(arg, "/")
	if !ok || kind == "" || name == "" {
		return ref{}, usageError("%q: want KIND/NAME, for example vmimage/ubuntu", arg)
	}
	gvr, err := c.mapper.ResourceFor(schema.ParseGroupResource(kind).WithVersion(""))
	if (err != nil && meta.IsNoMatchError(err)) || (err == nil && !groups[gvr.Group]) {
		// kubectl's discovery cache (~/.kube/cache) may predate diskpipe's CRDs; short names
		// are expanded from it before the mapper could refresh itself. And a short name may be
		// another API's too (vmim, diskpipe's former name for images, is KubeVirt's
		// VirtualMachineInstanceMigration's): diskpipe's own kind is meant.
		c.discovery.Invalidate()
		if m, ok := c.mapper.(meta.ResettableRESTMapper); ok {
			m.Reset()
		}
		if own, ok := ownResource(c.discovery, kind); ok {
			gvr, err = own, nil
		} else {
			gvr, err = c.mapper.ResourceFor(schema.ParseGroupResource(kind).WithVersion(""))
		}
	}
	if err != nil {
		return ref{}, usageError("%q is not a kind this cluster knows: %v", kind, err)
	}
	if !groups[gvr.Group] {
		return ref{}, usageError("%s is not one of diskpipe's kinds", gvr.GroupResource())
	}
	gvk, err := c.mapper.KindFor(gvr)
	if err != nil {
		return ref{}, err
	}
	return ref{gvr: gvr, kind: gvk.Kind, name: name}, nil
}

// downloadURL reads the download URL of an export from the Secret s names: the caller needs
// the right to read Secrets in the namespace, which the namespace's viewers do not have.
func (c *client) downloadURL(ctx context.Context, r ref, s state) (string, error) {
	if s.DownloadSecret == "" {
		return "", fmt.Errorf("%s has no download Secret in its status yet", r)
	}
	secrets := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	obj, err := c.dyn.Resource(secrets).Namespace(c.namespace).Get(ctx, s.DownloadSecret, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading the download URL of %s from the Secret %s (reading it needs the right to get Secrets in %s): %w",
			r, s.DownloadSecret, c.namespace, err)
	}
	enc, _, _ := unstructured.NestedString(obj.Object, "data", hypercloud.DownloadSecretKeyURL)
	u, err := base64.StdEncoding.DecodeString(enc)
	if err != nil || len(u) == 0 {
		return "", fmt.Errorf("the Secret %s holds no download URL in %q", s.DownloadSecret, hypercloud.DownloadSecretKeyURL)
	}
	return string(u), nil
}

func (c *client) get(ctx context.Context, r ref) (*unstructured.Unstructured, error) {
	return c.dyn.Resource(r.gvr).Namespace(c.namespace).Get(ctx, r.name, metav1.GetOptions{})
}

// state is what the plugin reads of an object's status.
type state struct {
	Kind     string `json:"kind"`
	Name     string `json:"name"`
	Phase    string `json:"phase"`
	Progress string `json:"progress,omitempty"`
	// BytesDone and BytesTotal are the running copy's, when the status has them.
	BytesDone  int64  `json:"bytesDone,omitempty"`
	BytesTotal int64  `json:"bytesTotal,omitempty"`
	Ready      string `json:"ready"`
	Reason     string `json:"reason,omitempty"`
	Message    string `json:"message,omitempty"`
	Retries    int64  `json:"retries,omitempty"`
	// Advice says what to do about a failure.
	Advice string `json:"advice,omitempty"`
	// For an export: the Secret that holds its download URL, and its object's digest.
	DownloadSecret string `json:"downloadSecret,omitempty"`
	Digest         string `json:"digest,omitempty"`
}

func stateOf(r ref, obj *unstructured.Unstructured) state {
	s := state{Kind: r.kind, Name: r.name, Ready: "Unknown"}
	s.Phase, _, _ = unstructured.NestedString(obj.Object, "status", "phase")
	s.Progress, _, _ = unstructured.NestedString(obj.Object, "status", "progress")
	s.BytesDone, _, _ = unstructured.NestedInt64(obj.Object, "status", "transfer", "bytesDone")
	s.BytesTotal, _, _ = unstructured.NestedInt64(obj.Object, "status", "transfer", "bytesTotal")
	s.Retries, _, _ = unstructured.NestedInt64(obj.Object, "status", "retries")
	s.DownloadSecret, _, _ = unstructured.NestedString(obj.Object, "status", "downloadSecretName")
	s.Digest, _, _ = unstructured.NestedString(obj.Object, "status", "digest")
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		m, ok := c.(map[string]any)
		if !ok || m["type"] != "Ready" {
			continue
		}
		s.Ready, _ = m["status"].(string)
		s.Reason, _ = m["reason"].(string)
		s.Message, _ = m["message"].(string)
	}
	if s.Phase == "Failed" {
		s.Advice = advice(s.Reason)
	}
	if s.Phase == "" {
		s.Phase = "Pending"
	}
	return s
}

// done says whether the object reached an end: Ready, or failed for good.
func (s state) done() bool { return s.Phase == "Ready" || s.Phase == "Failed" }

// advice is what to do about a failure's reason: the troubleshooting table's words
// (internal/transfer's Catalog).
func advice(reason string) string { return transfer.Advice(reason) }

func (s state) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s/%s: %s", strings.ToLower(s.Kind), s.Name, s.Phase)
	if s.Progress != "" && s.Phase != "Ready" {
		fmt.Fprintf(&b, " %s", s.Progress)
	}
	if s.BytesTotal > 0 && s.Phase != "Ready" {
		fmt.Fprintf(&b, " (%s of %s)", bytesOf(s.BytesDone), bytesOf(s.BytesTotal))
	}
	if s.Reason != "" {
		fmt.Fprintf(&b, ", %s", s.Reason)
	}
	if s.Message != "" && s.Phase != "Ready" {
		fmt.Fprintf(&b, ": %s", s.Message)
	}
	if s.Retries > 0 {
		fmt.Fprintf(&b, " (retries: %d)", s.Retries)
	}
	return b.String()
}

func bytesOf(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// ownResource is the resource of diskpipe's groups that name (a plural, singular, kind or
// short name, in any case) names, from discovery.
func ownResource(disc discovery.DiscoveryInterface, name string) (schema.GroupVersionResource, bool) {
	name = strings.ToLower(name)
	list, err := disc.ServerGroups()
	if err != nil {
		return schema.GroupVersionResource{}, false
	}
	for _, g := range list.Groups {
		if !groups[g.Name] {
			continue
		}
		res, err := disc.ServerResourcesForGroupVersion(g.PreferredVersion.GroupVersion)
		if err != nil {
			continue
		}
		for _, r := range res.APIResources {
			if strings.Contains(r.Name, "/") {
				continue // a subresource
			}
			if r.Name == name || r.SingularName == name || strings.ToLower(r.Kind) == name || slices.Contains(r.ShortNames, name) ||
				formerShortNames[name] == r.Name {
				return schema.GroupVersionResource{Group: g.Name, Version: g.PreferredVersion.Version, Resource: r.Name}, true
			}
		}
	}
	return schema.GroupVersionResource{}, false
}
