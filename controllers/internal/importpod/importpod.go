// Package importpod builds the pods that run diskpipe's importer and reads their results. It
// serves every controller that imports or copies into a volume.
package importpod

import (
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/internal/contract"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// Config is how the manager runs importer pods (the chart's importer values, read from the
// manager's --config file).
type Config struct {
	// Image of the importer (the diskpipe image; the pod runs /importer).
	Image            string                        `json:"image,omitempty"`
	ImagePullPolicy  corev1.PullPolicy             `json:"imagePullPolicy,omitempty"`
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
	// MetricsPort is where importer pods serve their progress.
	MetricsPort int32 `json:"metricsPort,omitempty"`
	// Resources of the importer container.
	Resources corev1.ResourceRequirements `json:"resources,omitzero"`
	// ServiceAccountName of importer pods. PrepareNamespace makes it, bound to nothing, in
	// each namespace the pods run in; empty runs them as the namespace's default account.
	// Either way no token is mounted.
	ServiceAccountName string              `json:"serviceAccountName,omitempty"`
	NodeSelector       map[string]string   `json:"nodeSelector,omitempty"`
	Tolerations        []corev1.Toleration `json:"tolerations,omitempty"`
	PriorityClassName  string              `json:"priorityClassName,omitempty"`
	// NetworkPolicy, when set, makes PrepareNamespace give each namespace a policy that
	// admits only the manager to the pods' metrics port and only diskpipe's pods to a clone
	// source.
	NetworkPolicy *NetworkPolicyConfig `json:"networkPolicy,omitempty"`
	// FilesystemOverhead is the share of a filesystem volume its pods keep free for the
	// filesystem, by StorageClass (the chart's filesystemOverhead values).
	FilesystemOverhead FilesystemOverhead `json:"filesystemOverhead,omitzero"`
	// ClusterCIDRs are networks the pods may not connect to (the cluster's pod and service
	// networks), beyond loopback, link-local, unspecified and multicast, which they never may.
	ClusterCIDRs []string `json:"clusterCIDRs,omitempty"`
	// AllowedDestinations are CIDRs, addresses or host names the pods may connect to even
	// inside those: in-cluster mirrors. The manager adds the bundled store's host.
	AllowedDestinations []string `json:"allowedDestinations,omitempty"`
	// Proxy is the HTTP proxy the pods send their requests through (none: they connect
	// directly).
	Proxy Proxy `json:"proxy,omitzero"`
	// ProxyFirst, when set, says the proxy an administrator set elsewhere (CDI's CDIConfig),
	// used before Proxy where it names one. It is called for each pod.
	ProxyFirst func() Proxy `json:"-"`

	prepared *sync.Map // namespaces PrepareNamespace has seen to
}

// NetworkPolicyConfig says where the manager runs, for the policies of importer pods.
type NetworkPolicyConfig struct {
	ManagerNamespace string            `json:"managerNamespace"`
	ManagerLabels    map[string]string `json:"managerLabels"`
	// StoreLabels and StorePort select the bundled store's pods in ManagerNamespace, which
	// importer and exporter pods may reach (none: an external store, reached as the internet).
	StoreLabels map[string]string `json:"storeLabels,omitempty"`
	StorePort   int32             `json:"storePort,omitempty"`
}

// FilesystemOverhead is the share of a filesystem volume kept for the filesystem itself: a
// disk.img of size S needs a volume of S/(1-overhead). Filesystems differ (ext4 keeps more
// than xfs), and some storage keeps room of its own.
type FilesystemOverhead struct {
	// Default applies to the StorageClasses not listed (default 0.06).
	Default *float64 `json:"default,omitempty"`
	// StorageClasses maps a StorageClass name to its overhead.
	StorageClasses map[string]float64 `json:"storageClasses,omitempty"`

	// first, when set, says the overheads an administrator set elsewhere (CDI's CDIConfig),
	// which For consults before these.
	first func() FilesystemOverhead
}

// Under returns o with first consulted before it: For gives first's overhead of a class it
// names, else first's Default, and o's only where first sets neither. first is called each
// time (it reads an object the administrator may change).
func (o FilesystemOverhead) Under(first func() FilesystemOverhead) FilesystemOverhead {
	o.first = first
	return o
}

// For is the overhead of a volume of the named StorageClass.
func (o FilesystemOverhead) For(class string) float64 {
	if o.first != nil {
		f := o.first()
		if v, ok := f.StorageClasses[class]; ok {
			return v
		}
		if f.Default != nil {
			return *f.Default
		}
	}
	if v, ok := o.StorageClasses[class]; ok {
		return v
	}
	if o.Default != nil {
		return *o.Default
	}
	return transfer.DefaultOverhead
}

// Classes are the StorageClasses that have an overhead of their own, here or in what is
// consulted first, sorted.
func (o FilesystemOverhead) Classes() []string {
	classes := slices.Collect(maps.Keys(o.StorageClasses))
	if o.first != nil {
		classes = append(classes, slices.Collect(maps.Keys(o.first().StorageClasses))...)
	}
	slices.Sort(classes)
	return slices.Compact(classes)
}

// MaxOverhead is the largest overhead diskpipe takes: a volume twice its disk's size.
const MaxOverhead = 0.5

// ValidOverhead says whether v is an overhead diskpipe takes: a fraction from 0 to MaxOverhead.
func ValidOverhead(v float64) bool { return v >= 0 && v <= MaxOverhead && !math.IsNaN(v) }

// Validate checks that every overhead is a fraction in [0, 0.5].
func (o FilesystemOverhead) Validate() error {
	check := func(what string, v float64) error {
		if !ValidOverhead(v) {
			return fmt.Errorf("filesystemOverhead %s is %g: give a fraction from 0 to 0.5 (0.06 is 6 %%)", what, v)
		}
		return nil
	}
	if o.Default != nil {
		if err := check("default", *o.Default); err != nil {
			return err
		}
	}
	for class, v := range o.StorageClasses {
		if err := check("of StorageClass "+class, v); err != nil {
			return err
		}
	}
	return nil
}

// ValidateEgress checks ClusterCIDRs, AllowedDestinations and Proxy as the pods will parse them.
func (c Config) ValidateEgress() error {
	if err := c.Proxy.Validate(); err != nil {
		return fmt.Errorf("importer.%w", err)
	}
	var e transfer.Egress
	for _, v := range c.ClusterCIDRs {
		if _, err := netip.ParsePrefix(v); err != nil {
			return fmt.Errorf("importer.clusterCIDRs: %q is not a CIDR", v)
		}
	}
	for _, v := range c.AllowedDestinations {
		if err := e.Allow(v); err != nil {
			return fmt.Errorf("importer.allowedDestinations: %w", err)
		}
	}
	return nil
}

// pod is p, a pod's own flags, with the installation's: the egress rule (transfer.Egress),
// where the pod serves its progress and writes its result.
func (c Config) pod(p contract.Pod) contract.Pod {
	p.ForbidCIDR = append(slices.Clone(p.ForbidCIDR), c.ClusterCIDRs...)
	p.AllowDestination = append(slices.Clone(p.AllowDestination), c.AllowedDestinations...)
	p.MetricsAddr, p.TerminationMessagePath = ":"+strconv.Itoa(int(c.MetricsPort)), corev1.TerminationMessagePathDefault
	return p
}

// Defaults fills what is not set.
func (c *Config) Defaults() {
	if c.Image == "" {
		c.Image = "ghcr.io/diskpipe/diskpipe:latest"
	}
	if c.MetricsPort == 0 {
		c.MetricsPort = 8090
	}
	if c.prepared == nil {
		c.prepared = &sync.Map{}
	}
	if c.Resources.Requests == nil && c.Resources.Limits == nil {
		c.Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: mustQ("100m"), corev1.ResourceMemory: mustQ("192Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: mustQ("2"), corev1.ResourceMemory: mustQ("512Mi")},
		}
	}
}

// Labels on every pod Build makes; the chart's and PrepareNamespace's NetworkPolicies select
// on them.
const (
	LabelManagedBy       = "app.kubernetes.io/managed-by"
	ManagedBy            = "diskpipe"
	LabelComponent       = "app.kubernetes.io/component"
	ComponentCloneSource = "clone-source"
)

// Made says whether pod is one diskpipe made for the object of UID owner: marked for it
// (owned.Marked), and carrying LabelManagedBy, which only the manager may give a pod (the
// admission webhook's own-pods hook). A mark names no pod's UID: a pod its namespace's owner
// makes again under the name, with the mark copied from the one diskpipe made, cannot carry
// the label.
func Made(pod *corev1.Pod, owner types.UID) bool {
	return Labelled(pod) && owned.Marked("Pod", pod, owner)
}

// Labelled says whether pod carries LabelManagedBy, as every pod diskpipe makes does.
func Labelled(pod *corev1.Pod) bool { return pod.Labels[LabelManagedBy] == ManagedBy }

// ServePort is where a clone source (importer --serve) serves its disk.
const ServePort = 8091

// Mount is a Secret or ConfigMap of the pod's namespace mounted read-only at Path.
type Mount struct {
	Secret, ConfigMap string
	Path              string
	// Optional: the pod starts without the Secret, and says itself that it is missing
	// (the manager may not read users' Secrets to find out).
	Optional bool
}

// Spec describes one importer pod.
type Spec struct {
	Name, Namespace string
	Labels          map[string]string
	// Import is the importer's command line, without the target's and the pod's flags, which
	// Build adds; Export, for an exporter pod (Command /exporter), the exporter's.
	Import contract.Import
	Export *contract.Export
	// PVC is the target volume; none for a probe.
	PVC   string
	Block bool
	// Capacity is the volume's size in bytes.
	Capacity int64
	// StorageClass of the target volume, for its filesystem overhead.
	StorageClass string
	// Preallocate allocates the whole disk on the target volume.
	Preallocate bool
	Mounts      []Mount
	// SourcePVC is a volume of the pod's namespace mounted read-only as the source of a copy,
	// at SourceFile or SourceDevice.
	SourcePVC   string
	SourceBlock bool
	// ServePort exposes a port for a clone source (Serve).
	ServePort int32
	// Command is the program the pod runs: /importer (default) or /exporter.
	Command string
	// Scratch gives the pod a writable /tmp, an emptyDir of ScratchSize: the root filesystem
	// is read-only.
	Scratch bool
	// NodePull is a container disk image the node pulls: the pod runs it, with the importer
	// copied in by an init container of diskpipe's image, and reads its disk (ContainerDiskDir).
	NodePull string
	// PullSecrets are Secrets of the pod's namespace the node may pull NodePull with.
	PullSecrets []string
}

// Where a pod that runs a container disk (Spec.NodePull) finds its disk and its importer.
const (
	ContainerDiskDir = "/disk"
	installDir       = "/diskpipe"
)

// NoSidecars are the annotations that keep service meshes from injecting a sidecar into a
// transfer pod (CDI sets them on its pods too): a pod whose sidecar runs on never ends, so its
// import never completes in a namespace the mesh injects into.
var NoSidecars = map[string]string{"sidecar.istio.io/inject": "false", "linkerd.io/inject": "disabled"}

// ScratchSize bounds a pod's scratch /tmp: it holds a few small files (CA bundles), never a
// disk's bytes.
var ScratchSize = resource.MustParse("16Mi")

// ScratchDir is where a pod's scratch directory is mounted.
const ScratchDir = "/tmp"

// Paths inside importer pods.
const (
	TargetDir    = "/data"
	TargetFile   = TargetDir + "/disk.img"
	TargetDevice = "/dev/diskpipe-target"
	SourceDir    = "/source"
	SourceFile   = SourceDir + "/disk.img"
	SourceDevice = "/dev/diskpipe-source"
)

// SourcePath is where a pod of s finds its source disk.
func (s Spec) SourcePath() string {
	if s.SourceBlock {
		return SourceDevice
	}
	return SourceFile
}

// Build returns the pod: restricted security (non-root, no privilege escalation, every
// capability dropped, RuntimeDefault seccomp, read-only root), never restarted — retries
// are the controller's.
func Build(c Config, s Spec) *corev1.Pod {
	imp := s.Import
	command := s.Command
	if command == "" {
		command = "/importer"
	}
	component := strings.TrimPrefix(command, "/")
	if s.ServePort != 0 {
		component = ComponentCloneSource
	}
	labels := map[string]string{LabelManagedBy: ManagedBy, LabelComponent: component}
	maps.Copy(labels, s.Labels)
	ctr := corev1.Container{
		Name: strings.TrimPrefix(command, "/"), Image: c.Image, ImagePullPolicy: c.ImagePullPolicy, Command: []string{command}, Resources: c.Resources,
		Ports:                    []corev1.ContainerPort{{Name: "metrics", ContainerPort: c.MetricsPort}},
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true), RunAsNonRoot: ptr.To(true),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, Labels: labels, Annotations: maps.Clone(NoSidecars)},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			ServiceAccountName:           c.ServiceAccountName,
			AutomountServiceAccountToken: ptr.To(false),
			// No Service's address in the environment (CDI v1.65's transfer pods too): a
			// namespace of thousands of Services made pods slow to start, and the addresses
			// tell a hostile image where everything is.
			EnableServiceLinks: ptr.To(false),
			ImagePullSecrets:   c.ImagePullSecrets,
			NodeSelector:       c.NodeSelector,
			Tolerations:        c.Tolerations,
			PriorityClassName:  c.PriorityClassName,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](107), RunAsGroup: ptr.To[int64](107), FSGroup: ptr.To[int64](107),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
		},
	}
	if s.PVC != "" {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "target", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: s.PVC}}})
		if s.Block {
			ctr.VolumeDevices = []corev1.VolumeDevice{{Name: "target", DevicePath: TargetDevice}}
			imp.Target = TargetDevice
		} else {
			ctr.VolumeMounts = []corev1.VolumeMount{{Name: "target", MountPath: TargetDir}}
			imp.Target, imp.Overhead = TargetFile, ptr.To(c.FilesystemOverhead.For(s.StorageClass))
		}
		imp.Capacity, imp.Preallocate = max(s.Capacity, 0), s.Preallocate
	}
	if s.SourcePVC != "" {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "source", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: s.SourcePVC, ReadOnly: true}}})
		if s.SourceBlock {
			ctr.VolumeDevices = append(ctr.VolumeDevices, corev1.VolumeDevice{Name: "source", DevicePath: SourceDevice})
		} else {
			ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: "source", MountPath: SourceDir, ReadOnly: true})
		}
	}
	if s.ServePort != 0 {
		ctr.Ports = append(ctr.Ports, corev1.ContainerPort{Name: "clone", ContainerPort: s.ServePort})
	}
	for i, m := range s.Mounts {
		name := fmt.Sprintf("m%d", i)
		v := corev1.Volume{Name: name}
		if m.Secret != "" {
			v.Secret = &corev1.SecretVolumeSource{SecretName: m.Secret, DefaultMode: ptr.To[int32](0o440)}
			if m.Optional {
				v.Secret.Optional = ptr.To(true)
			}
		} else {
			v.ConfigMap = &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: m.ConfigMap}}
		}
		pod.Spec.Volumes = append(pod.Spec.Volumes, v)
		ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: m.Path, ReadOnly: true})
	}
	if s.Scratch {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(ScratchSize)}}})
		ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: "scratch", MountPath: ScratchDir})
	}
	if s.Export != nil {
		e := *s.Export
		e.Pod = c.pod(e.Pod)
		ctr.Args = contract.Args(e)
	} else {
		imp.Pod = c.pod(imp.Pod)
		ctr.Args = contract.Args(imp)
	}
	ctr.Env = c.proxyEnv()
	if s.NodePull != "" {
		runContainerDisk(&pod.Spec, &ctr, s)
	}
	pod.Spec.Containers = []corev1.Container{ctr}
	return pod
}

// runContainerDisk makes ctr run in the container disk s.NodePull, which the node pulls, with
// diskpipe's importer copied into an emptyDir by an init container of diskpipe's image.
func runContainerDisk(spec *corev1.PodSpec, ctr *corev1.Container, s Spec) {
	install := *ctr.DeepCopy()
	install.Name, install.Ports, install.VolumeMounts, install.VolumeDevices, install.Env = "install", nil, nil, nil, nil
	install.Args = contract.Args(contract.Import{Install: installDir + ctr.Command[0]})
	mount := corev1.VolumeMount{Name: "diskpipe", MountPath: installDir}
	install.VolumeMounts = []corev1.VolumeMount{mount}
	mount.ReadOnly = true
	ctr.VolumeMounts = append(ctr.VolumeMounts, mount)
	// Always: the node checks with the registry that this pod's pull secrets (or the node's)
	// may pull the image, rather than handing over a copy another namespace pulled with its own.
	ctr.Image, ctr.ImagePullPolicy, ctr.Command = s.NodePull, corev1.PullAlways, []string{installDir + ctr.Command[0]}
	spec.InitContainers = append(spec.InitContainers, install)
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "diskpipe", VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("256Mi"))}}})
	for _, name := range s.PullSecrets {
		spec.ImagePullSecrets = append(spec.ImagePullSecrets, corev1.LocalObjectReference{Name: name})
	}
}

// Result reads the result a finished pod left in its termination message. A pod that ended
// without one (killed, evicted, crashed) gets a transient failure, so it is retried.
func Result(pod *corev1.Pod) *transfer.Result {
	r := result(pod)
	if !r.Succeeded && !r.Transient && pod.DeletionTimestamp != nil {
		// A pod deleted or evicted mid-way was stopped, whatever it said as it went: an
		// older image's pod, or one stopped before it could tell, is tried again.
		r.Transient = true
		r.Message = "the pod was deleted before it finished: " + r.Message
	}
	return r
}

func result(pod *corev1.Pod) *transfer.Result {
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			if r, err := transfer.ReadResult(t.Message); err == nil {
				if !r.Succeeded && r.Reason == "" { // a result that says neither: never a silent success
					r.Reason, r.Transient = transfer.ReasonInternal, true
					r.Message = fmt.Sprintf("the pod ended with exit code %d and a result that reports neither success nor a reason", t.ExitCode)
				}
				if r.Succeeded && (t.ExitCode != 0 || pod.Status.Phase == corev1.PodFailed) {
					// Killed after it wrote its result (the chaos suite's pod kills found it):
					// not trusted, tried again.
					return &transfer.Result{Reason: transfer.ReasonInternal, Transient: true,
						Message: fmt.Sprintf("the pod reported success but ended with exit code %d (%s)", t.ExitCode, t.Reason)}
				}
				return r
			}
			return &transfer.Result{Reason: transfer.ReasonInternal, Transient: true,
				Message: fmt.Sprintf("the importer ended with exit code %d (%s) and no result", t.ExitCode, t.Reason)}
		}
	}
	return &transfer.Result{Reason: transfer.ReasonInternal, Transient: true,
		Message: fmt.Sprintf("the importer pod %s (%s)", pod.Status.Phase, pod.Status.Message)}
}
