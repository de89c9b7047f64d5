// Package virtualmachine is the thin VirtualMachine controller: a VM's diskVolumeTemplates
// become DiskVolumes it owns, and once they are all Ready its hardware (a KubeVirt
// VirtualMachineInstance spec) becomes a kubevirt.io/v1 VirtualMachine whose disks are bound to
// those DiskVolumes' PVCs. KubeVirt's printable status is mirrored back.
package virtualmachine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	diskvolume "github.com/diskpipe/diskpipe/apis/diskvolume/v1alpha1"
	vmv1 "github.com/diskpipe/diskpipe/apis/virtualmachine/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/internal/status"
)

// AnnotationIPPool is the IPAM annotation the VM's pod gets for spec.ippool: Calico's, which
// KubeSphere uses for its IP pools. KubeVirt copies template annotations to the virt-launcher
// pod, where Calico's CNI plugin reads it.
const AnnotationIPPool = "cni.projectcalico.org/ipv4pools"

// Condition types and reasons.
const (
	ConditionDisksReady = "DisksReady"

	reasonInvalidHardware = "InvalidHardware"
	reasonWaitingForDisks = "WaitingForDisks"
	reasonDiskFailed      = "DiskFailed"
	reasonDisksReady      = "DisksReady"
	reasonCreated         = "VirtualMachineCreated"
	reasonKubeVirtRefused = "KubeVirtRefused"
	// reasonWaitingForKubeVirt: KubeVirt is not installed yet.
	reasonWaitingForKubeVirt = "WaitingForKubeVirt"
)

// Reconciler reconciles VirtualMachines.
type Reconciler struct {
	client.Client
	Events events.EventRecorder
	// AllowHostDisk lets a VM's hardware name hostDisk volumes.
	AllowHostDisk bool
}

// Setup registers the controller. diskpipe may be installed before KubeVirt: the controller
// watches KubeVirt's VirtualMachines once their CRD is served (watchKubeVirt), and until then a
// VM says it waits for KubeVirt.
func Setup(mgr ctrl.Manager, allowHostDisk bool) error {
	r := &Reconciler{Client: mgr.GetClient(), Events: mgr.GetEventRecorder("diskpipe-virtualmachine"), AllowHostDisk: allowHostDisk}
	c, err := ctrl.NewControllerManagedBy(mgr).Named("virtualmachine").For(&vmv1.VirtualMachine{}).
		Owns(&diskvolume.DiskVolume{}).Build(r)
	if err != nil {
		return err
	}
	return mgr.Add(&watchKubeVirt{mgr: mgr, controller: c, every: 10 * time.Second})
}

// watchKubeVirt makes the controller watch the KubeVirt VirtualMachines it owns as soon as their
// CRD is served: at once where KubeVirt is installed, else when it is.
type watchKubeVirt struct {
	mgr        ctrl.Manager
	controller controller.Controller
	every      time.Duration
}

// NeedLeaderElection is true: the controller runs on the leader.
func (w *watchKubeVirt) NeedLeaderElection() bool { return true }

// Start adds the watch once the kind is served, and returns. A failure to ask the apiserver is
// tried again with the rest: it must not stop the manager.
func (w *watchKubeVirt) Start(ctx context.Context) error {
	gvk := kubevirtv1.VirtualMachineGroupVersionKind
	logged := false
	for {
		_, err := w.mgr.GetRESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
		if err == nil {
			return w.controller.Watch(source.Kind(w.mgr.GetCache(), client.Object(&kubevirtv1.VirtualMachine{}),
				handler.EnqueueRequestForOwner(w.mgr.GetScheme(), w.mgr.GetRESTMapper(), &vmv1.VirtualMachine{}, handler.OnlyControllerOwner())))
		}
		switch {
		case !meta.IsNoMatchError(err):
			ctrl.LoggerFrom(ctx).Error(err, "Could not learn whether KubeVirt is installed; trying again")
		case !logged:
			ctrl.LoggerFrom(ctx).Info("KubeVirt's VirtualMachine CRD is not installed: VirtualMachines wait for it")
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(w.every):
		}
	}
}

// Reconcile brings one VM forward.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, err error) {
	vm := &vmv1.VirtualMachine{}
	if err := r.Get(ctx, req.NamespacedName, vm); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !vm.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil // owner references take the DiskVolumes and the KubeVirt VM
	}
	base := vm.DeepCopy()
	defer func() {
		if err == nil {
			vm.Status.ObservedGeneration = vm.Generation
		}
		if werr := status.Write(ctx, r.Client, base, vm, base.Status, vm.Status); werr != nil {
			err = werr
		}
	}()
	return r.reconcile(ctx, vm)
}

func (r *Reconciler) reconcile(ctx context.Context, vm *vmv1.VirtualMachine) (ctrl.Result, error) {
	st := &vm.Status
	spec, err := decodeHardware(vm.Spec.Hardware.Raw)
	if err == nil && !r.AllowHostDisk {
		err = refuseHostDisk(spec)
	}
	if err != nil {
		st.Phase = common.PhaseFailed
		setCondition(st, common.ConditionReady, metav1.ConditionFalse, reasonInvalidHardware, err.Error())
		return ctrl.Result{}, nil
	}

	pvcs, waiting, failed, err := r.ensureDisks(ctx, vm)
	if err != nil {
		return ctrl.Result{}, err
	}
	switch {
	case len(failed) > 0:
		st.Phase = common.PhaseFailed
		msg := "DiskVolumes failed: " + strings.Join(failed, "; ")
		setCondition(st, ConditionDisksReady, metav1.ConditionFalse, reasonDiskFailed, msg)
		setCondition(st, common.ConditionReady, metav1.ConditionFalse, reasonDiskFailed, msg)
		return ctrl.Result{}, nil
	case len(waiting) > 0:
		st.Phase = common.PhasePending
		msg := "waiting for DiskVolumes: " + strings.Join(waiting, "; ")
		setCondition(st, ConditionDisksReady, metav1.ConditionFalse, reasonWaitingForDisks, msg)
		setCondition(st, common.ConditionReady, metav1.ConditionFalse, reasonWaitingForDisks, msg)
		// Disks made outside the VM are not its children: look again.
		return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
	}
	setCondition(st, ConditionDisksReady, metav1.ConditionTrue, reasonDisksReady, fmt.Sprintf("%d DiskVolumes Ready", len(pvcs)))

	bindDisks(spec, pvcs)
	kv, err := r.ensureKubeVirtVM(ctx, vm, spec)
	if err != nil {
		var nt *owned.ErrNotOwned
		var terminating *owned.ErrTerminating
		switch {
		case errors.As(err, &terminating):
			// Made again before its earlier self's KubeVirt VM is gone (a VM's shutdown takes
			// its grace period): it is made once that is.
			st.Phase = common.PhasePending
			setCondition(st, common.ConditionReady, metav1.ConditionFalse, owned.ReasonNameTerminating, terminating.Error())
			return ctrl.Result{RequeueAfter: 5 * time.Second}, nil
		case errors.As(err, &nt):
			st.Phase = common.PhaseFailed
			setCondition(st, common.ConditionReady, metav1.ConditionFalse, "NameTaken", nt.Error())
			return ctrl.Result{}, nil
		case meta.IsNoMatchError(err):
			// diskpipe was installed before KubeVirt: the VM is made once KubeVirt is.
			setCondition(st, common.ConditionReady, metav1.ConditionFalse, reasonWaitingForKubeVirt,
				"KubeVirt is not installed (no CRD virtualmachines.kubevirt.io): the KubeVirt VirtualMachine is made once it is")
			return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
		case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || apierrors.IsForbidden(err):
			// KubeVirt's webhook (or the apiserver) refused the hardware as written: say why.
			// KubeVirt's configuration may change (a feature gate), so it is tried again.
			st.Phase = common.PhaseFailed
			setCondition(st, common.ConditionReady, metav1.ConditionFalse, reasonKubeVirtRefused,
				"KubeVirt refused the VirtualMachine made of spec.hardware: "+err.Error())
			return ctrl.Result{RequeueAfter: time.Minute}, nil
		}
		return ctrl.Result{}, err
	}
	st.Phase, st.VirtualMachineName, st.PrintableStatus = common.PhaseReady, kv.Name, string(kv.Status.PrintableStatus)
	if c := meta.FindStatusCondition(st.Conditions, common.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
		r.Events.Eventf(vm, nil, corev1.EventTypeNormal, reasonCreated, "Create", "Created the KubeVirt VirtualMachine %s", kv.Name)
	}
	setCondition(st, common.ConditionReady, metav1.ConditionTrue, reasonCreated, "the KubeVirt VirtualMachine "+kv.Name+" exists")
	return ctrl.Result{}, nil
}

// ensureDisks makes the VM's DiskVolumes and returns the PVC of each by template name, and
// which are not Ready yet or failed. A DiskVolume of a template's name made outside the VM is
// used as it is, and not deleted with the VM.
func (r *Reconciler) ensureDisks(ctx context.Context, vm *vmv1.VirtualMachine) (pvcs map[string]string, waiting, failed []string, err error) {
	pvcs = map[string]string{}
	vm.Status.DiskVolumes = nil
	for _, t := range vm.Spec.DiskVolumeTemplates {
		d := &diskvolume.DiskVolume{ObjectMeta: metav1.ObjectMeta{Name: t.Metadata.Name, Namespace: vm.Namespace,
			Labels: t.Metadata.Labels, Annotations: t.Metadata.Annotations}, Spec: *t.Spec.DeepCopy()}
		err := owned.Create(ctx, r.Client, vm, d)
		var nt *owned.ErrNotOwned
		if err != nil && !errors.As(err, &nt) && !errors.As(err, new(*owned.ErrTerminating)) {
			return nil, nil, nil, err
		}
		vm.Status.DiskVolumes = append(vm.Status.DiskVolumes, d.Name)
		if err != nil && nt == nil {
			// An earlier VM's of the name, still being deleted: not used; the VM's is made once
			// it is gone.
			waiting = append(waiting, d.Name+" (an earlier DiskVolume of this name is being deleted)")
			continue
		}
		switch d.Status.Phase {
		case common.PhaseReady:
			pvcs[t.Metadata.Name] = d.Status.PVCName
		case common.PhaseFailed:
			failed = append(failed, d.Name+": "+readyMessage(d.Status.Conditions))
		default:
			waiting = append(waiting, fmt.Sprintf("%s (%s)", d.Name, phaseOr(d.Status.Phase)))
		}
	}
	sort.Strings(waiting)
	return pvcs, waiting, failed, nil
}

// ensureKubeVirtVM creates the KubeVirt VM, or brings its spec up to date.
func (r *Reconciler) ensureKubeVirtVM(ctx context.Context, vm *vmv1.VirtualMachine, spec *kubevirtv1.VirtualMachineInstanceSpec) (*kubevirtv1.VirtualMachine, error) {
	strategy := kubevirtv1.RunStrategyAlways
	if vm.Spec.RunStrategy != nil {
		strategy = kubevirtv1.VirtualMachineRunStrategy(*vm.Spec.RunStrategy)
	}
	tmpl := &kubevirtv1.VirtualMachineInstanceTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"kubevirt.io/vm": vm.Name}},
		Spec:       *spec,
	}
	if vm.Spec.IPPool != "" {
		pools, _ := json.Marshal([]string{vm.Spec.IPPool})
		tmpl.ObjectMeta.Annotations = map[string]string{AnnotationIPPool: string(pools)}
	}
	want := kubevirtv1.VirtualMachineSpec{RunStrategy: &strategy, Template: tmpl}
	hash, err := specHash(want)
	if err != nil {
		return nil, err
	}
	kv := &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: vm.Name, Namespace: vm.Namespace,
		Annotations: map[string]string{AnnotationSpecHash: hash}}, Spec: want}
	if err := owned.Create(ctx, r.Client, vm, kv); err != nil {
		return nil, err
	}
	// KubeVirt completes the spec it is given (its webhook's defaults, the firmware's UUID its
	// controller writes back): the spec is rewritten only when what diskpipe wants of it
	// changed, never to undo KubeVirt's own fields, which the two would fight over for ever.
	if kv.Annotations[AnnotationSpecHash] != hash {
		kv.Spec.Template, kv.Spec.RunStrategy = want.Template, want.RunStrategy
		metav1.SetMetaDataAnnotation(&kv.ObjectMeta, AnnotationSpecHash, hash)
		if err := r.Update(ctx, kv); err != nil {
			return nil, err
		}
	}
	return kv, nil
}

// AnnotationSpecHash on a KubeVirt VirtualMachine is the hash of the spec diskpipe last wrote
// to it from the VM's hardware and disks.
const AnnotationSpecHash = "virtualmachine.kubesphere.io/spec-hash"

// specHash is a short hash of spec's JSON.
func specHash(spec kubevirtv1.VirtualMachineSpec) (string, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8]), nil
}

func setCondition(st *vmv1.VirtualMachineStatus, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg})
}

func readyMessage(conds []metav1.Condition) string {
	if c := meta.FindStatusCondition(conds, common.ConditionReady); c != nil {
		return c.Reason + ": " + c.Message
	}
	return "no reason given"
}

func phaseOr(p common.Phase) string {
	if p == "" {
		return "new"
	}
	return string(p)
}
