package cdi

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"
	sdkapi "kubevirt.io/controller-lifecycle-operator-sdk/api"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
)

// Names of the cluster's one CDI object and one CDIConfig, as CDI names them: KubeVirt, once
// CDI's CRDs exist, needs exactly one CDI object and the CDIConfig "config" to size a VM's
// disk image on a Filesystem PVC ("Failed to find CDIConfig but CDI exists" otherwise), and
// virtctl reads the upload proxy's URL from it.
const (
	CDIName       = "cdi"
	CDIConfigName = "config"
	// LabelManagedBy marks the objects diskpipe keeps.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "diskpipe"
)

// Config keeps the CDI object (its status Deployed) and the CDIConfig (its status: what diskpipe
// uses: the filesystem overhead of each class and the upload proxy's URL) as they must be,
// now, every interval, and as the CDIConfig changes, on the elected manager.
type Config struct {
	Client             client.Client
	FilesystemOverhead importpod.FilesystemOverhead
	// UploadProxyURL is the upload proxy's URL outside the cluster ("" when none is told).
	UploadProxyURL string
	Interval       time.Duration
}

// NeedLeaderElection is true: only the leader writes.
func (c *Config) NeedLeaderElection() bool { return true }

// Start keeps the objects until ctx ends.
func (c *Config) Start(ctx context.Context) error {
	t := time.NewTicker(c.Interval)
	defer t.Stop()
	for {
		if err := c.Sync(ctx); err != nil && ctx.Err() == nil {
			ctrl.LoggerFrom(ctx).Error(err, "Could not keep CDI's configuration objects")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Sync makes or repairs both objects once.
func (c *Config) Sync(ctx context.Context) error {
	return errors.Join(c.syncCDI(ctx), c.syncConfig(ctx))
}

func (c *Config) syncCDI(ctx context.Context) error {
	obj := &cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: CDIName}}
	if err := c.ensure(ctx, obj); err != nil {
		return err
	}
	want := sdkapi.Status{Phase: sdkapi.PhaseDeployed, OperatorVersion: managedBy, TargetVersion: managedBy, ObservedVersion: managedBy}
	if obj.Status.Phase == want.Phase && obj.Status.ObservedVersion == want.ObservedVersion {
		return nil
	}
	base := obj.DeepCopy()
	obj.Status.Status = want
	return c.Client.Patch(ctx, obj, client.MergeFrom(base)) // CDI's CRDs of these two have no status subresource
}

func (c *Config) syncConfig(ctx context.Context) error {
	obj := &cdiv1.CDIConfig{ObjectMeta: metav1.ObjectMeta{Name: CDIConfigName}}
	if err := c.ensure(ctx, obj); err != nil {
		return err
	}
	if err := c.fromCDI(ctx, obj); err != nil {
		return err
	}
	want := c.status(&obj.Spec)
	if equality.Semantic.DeepEqual(obj.Status, want) {
		return nil
	}
	base := obj.DeepCopy()
	obj.Status = want
	return c.Client.Patch(ctx, obj, client.MergeFrom(base)) // CDI's CRDs of these two have no status subresource
}

// fromCDI writes into the CDIConfig's spec what the CDI object's spec.config sets of what
// diskpipe reads (the upload proxy's URL, filesystem overheads, the import proxy,
// preallocation, insecure registries), as CDI's operator does: HCO, and CDI's documentation, configure CDI there.
// Where spec.config is set it wins; the CDIConfig's spec is the administrator's otherwise.
func (c *Config) fromCDI(ctx context.Context, obj *cdiv1.CDIConfig) error {
	cdi := &cdiv1.CDI{}
	if err := c.Client.Get(ctx, client.ObjectKey{Name: CDIName}, cdi); err != nil || cdi.Spec.Config == nil {
		return client.IgnoreNotFound(err)
	}
	want := obj.Spec.DeepCopy()
	from := cdi.Spec.Config
	want.UploadProxyURLOverride, want.FilesystemOverhead = from.UploadProxyURLOverride, from.FilesystemOverhead
	want.ImportProxy, want.Preallocation = from.ImportProxy, from.Preallocation
	want.InsecureRegistries = from.InsecureRegistries
	if equality.Semantic.DeepEqual(&obj.Spec, want) {
		return nil
	}
	base := obj.DeepCopy()
	obj.Spec = *want
	return c.Client.Patch(ctx, obj, client.MergeFrom(base))
}

// status is the CDIConfig's status: the filesystem overheads diskpipe uses (the spec's where it
// sets them, see SpecOverhead, else the chart's), the import proxy of the spec (SpecProxy), the
// spec's preallocation (false where it says none), and
// the upload proxy's URL as the
// administrator's spec.uploadProxyURLOverride says, or else as the chart's values do (CDI's
// order). The spec's other settings are refused at admission (policy.CDIPolicy).
func (c *Config) status(spec *cdiv1.CDIConfigSpec) cdiv1.CDIConfigStatus {
	percent := func(f float64) cdiv1.Percent { return cdiv1.Percent(strconv.FormatFloat(f, 'f', -1, 64)) }
	fs := &cdiv1.FilesystemOverhead{Global: percent(c.FilesystemOverhead.For("")), StorageClass: map[string]cdiv1.Percent{}}
	for _, class := range c.FilesystemOverhead.Classes() {
		fs.StorageClass[class] = percent(c.FilesystemOverhead.For(class))
	}
	// spec.preallocation is every DataVolume's default that does not say (DataVolumeReconciler's
	// claim spec); the status says it, as CDI's does.
	st := cdiv1.CDIConfigStatus{FilesystemOverhead: fs, ImportProxy: spec.ImportProxy, Preallocation: ptr.Deref(spec.Preallocation, false)}
	switch {
	case spec.UploadProxyURLOverride != nil && *spec.UploadProxyURLOverride != "":
		st.UploadProxyURL = spec.UploadProxyURLOverride
	case c.UploadProxyURL != "":
		st.UploadProxyURL = &c.UploadProxyURL
	}
	return st
}

// SpecOverhead reads the filesystem overheads the CDIConfig's spec sets, through r (the
// manager's cache), for importpod.FilesystemOverhead.Under: a CDI user's spec.filesystemOverhead
// (global, and per StorageClass) sizes diskpipe's volumes as it sized CDI's, before the chart's
// values. A value outside 0-0.5 is refused at admission; one an older CDIConfig kept is left out.
func SpecOverhead(r client.Reader) func() importpod.FilesystemOverhead {
	fraction := func(p cdiv1.Percent) (float64, bool) {
		v, err := strconv.ParseFloat(string(p), 64)
		return v, err == nil && importpod.ValidOverhead(v)
	}
	return func() importpod.FilesystemOverhead {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		config := &cdiv1.CDIConfig{}
		var o importpod.FilesystemOverhead
		if r.Get(ctx, client.ObjectKey{Name: CDIConfigName}, config) != nil || config.Spec.FilesystemOverhead == nil {
			return o
		}
		if v, ok := fraction(config.Spec.FilesystemOverhead.Global); ok {
			o.Default = &v
		}
		for class, p := range config.Spec.FilesystemOverhead.StorageClass {
			if v, ok := fraction(p); ok {
				if o.StorageClasses == nil {
					o.StorageClasses = map[string]float64{}
				}
				o.StorageClasses[class] = v
			}
		}
		return o
	}
}

// ProxyCAKey is the key of CDIConfig spec.importProxy.trustedCAProxy's ConfigMap that holds the
// PEM bundle, as CDI reads it.
const ProxyCAKey = "ca.pem"

// SpecProxy reads the proxy the CDIConfig's spec.importProxy sets, for importpod.Config's
// ProxyFirst: a CDI user's proxy carries diskpipe's imports as it carried CDI's. Its
// trustedCAProxy names a ConfigMap of namespace (diskpipe's, where CDI's was) whose ca.pem the
// pods trust; r reads it uncached, one ConfigMap of that namespace when a pod is made. A
// setting the pods cannot use (refused at admission, or kept by an older CDIConfig) is left
// out and logged, and the chart's proxy applies.
func SpecProxy(cached, r client.Reader, namespace string) func() importpod.Proxy {
	return func() importpod.Proxy {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		log := ctrl.Log.WithName("cdiconfig")
		config := &cdiv1.CDIConfig{}
		if cached.Get(ctx, client.ObjectKey{Name: CDIConfigName}, config) != nil || config.Spec.ImportProxy == nil {
			return importpod.Proxy{}
		}
		ip := config.Spec.ImportProxy
		p := importpod.Proxy{HTTP: ptr.Deref(ip.HTTPProxy, ""), HTTPS: ptr.Deref(ip.HTTPSProxy, ""), NoProxy: ptr.Deref(ip.NoProxy, "")}
		if name := ptr.Deref(ip.TrustedCAProxy, ""); name != "" && p.Set() {
			cm := &corev1.ConfigMap{}
			if err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, cm); err != nil {
				log.Error(err, "CDIConfig spec.importProxy.trustedCAProxy: the proxy's CA is left out", "configMap", namespace+"/"+name)
			} else {
				p.TrustedCA = cm.Data[ProxyCAKey]
			}
		}
		if err := p.Validate(); err != nil {
			log.Error(err, "CDIConfig spec.importProxy is left out")
			return importpod.Proxy{}
		}
		return p
	}
}

// ensure reads obj, making it if missing. One that diskpipe did not make is CDI's own: it is
// left alone, and said so.
func (c *Config) ensure(ctx context.Context, obj client.Object) error {
	err := c.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	if apierrors.IsNotFound(err) {
		obj.SetLabels(map[string]string{LabelManagedBy: managedBy})
		if err = c.Client.Create(ctx, obj); apierrors.IsAlreadyExists(err) {
			err = c.Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		}
	}
	if err != nil {
		return err
	}
	if obj.GetLabels()[LabelManagedBy] != managedBy {
		return fmt.Errorf("%T %s was not made by diskpipe (is CDI installed?): left alone", obj, obj.GetName())
	}
	return nil
}

// settings reads the CDIConfig's spec (its insecure registries, read over plain HTTP or TLS
// unverified, and its preallocation: an administrator's settings, of a cluster-scoped object)
// for what is made once from them: from api while made is false, so that what is made right
// after a setting changed is made as it says now, and from cached after. No CDIConfig (or no
// CDI API) is an empty spec; another error is returned, so that nothing is made from a setting
// that could not be read.
func settings(ctx context.Context, cached, api client.Reader, made bool) (cdiv1.CDIConfigSpec, error) {
	r := api
	if made {
		r = cached
	}
	config := &cdiv1.CDIConfig{}
	if err := r.Get(ctx, client.ObjectKey{Name: CDIConfigName}, config); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return cdiv1.CDIConfigSpec{}, nil
		}
		return cdiv1.CDIConfigSpec{}, fmt.Errorf("reading the CDIConfig: %w", err)
	}
	return config.Spec, nil
}
