package cluster

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// KubeVirtVersion is the KubeVirt the real node runs (test/tools/kubevirt).
const KubeVirtVersion = "v1.7.0"

// kubeVirtImages are KubeVirt's images (make kubevirt-images writes bin/kubevirt/NAME-image.tar).
var kubeVirtImages = []string{"virt-operator", "virt-api", "virt-controller", "virt-exportserver", "virt-exportproxy", "virt-handler", "virt-launcher"}

// kubeVirtCR is the KubeVirt object, as a user writes it for a one-node cluster without
// /dev/kvm: software emulation, one replica of virt-api and virt-controller. VMs are rolled
// out by restarting them (Stage), which the specs do themselves; the storage migration spec
// turns live updates on for its own run. The feature gates Snapshot (beta in 1.7, off unless named:
// VirtualMachineSnapshot and VirtualMachineRestore), HotplugVolumes (virtctl addvolume) and
// VMExport (VirtualMachineExport, with its export proxy) are on.
const kubeVirtCR = `apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata:
  name: kubevirt
  namespace: kubevirt
spec:
  imagePullPolicy: IfNotPresent
  infra:
    replicas: 1
  configuration:
    vmRolloutStrategy: Stage
    # Under emulation a VM's CPU is kvm64, which KubeVirt counts obsolete by default and so
    # labels no node for: a live migration's target would fit no node.
    obsoleteCPUModels: {"486": true}
    developerConfiguration:
      useEmulation: true
      featureGates: [Snapshot, HotplugVolumes, VMExport]
`

// kubevirt installs the real KubeVirt as its documentation tells users: virt-operator from its
// release manifest (rendered by make kubevirt-images for the registry's names), then a
// KubeVirt object. It waits until virt-operator has made KubeVirt's VirtualMachine CRD, which
// diskpipe's manager watches; kubevirtAvailable waits for the rest of the rollout. The node is
// labelled a control-plane node first: virt-operator, virt-api and virt-controller run only on
// one.
func (c *Cluster) kubevirt(ctx context.Context) error {
	dir := c.bin("kubevirt")
	for _, name := range kubeVirtImages {
		ref := fmt.Sprintf("%s/kubevirt/%s:%s", registry, name, KubeVirtVersion)
		c.step("push %s", ref)
		archive := filepath.Join(dir, name+"-image.tar")
		if out, err := exec.CommandContext(ctx, c.bin("image"), "push", "--archive", archive, ref).CombinedOutput(); err != nil { //nolint:gosec // hack/image
			return fmt.Errorf("pushing %s (make kubevirt-images builds it): %w: %s", ref, err, out)
		}
	}
	if _, stderr, err := c.Kubectl(ctx, nil, "label", "node", NodeName, "node-role.kubernetes.io/control-plane=", "--overwrite"); err != nil {
		return fmt.Errorf("labelling the node: %w: %s", err, stderr)
	}
	c.step("KubeVirt %s: virt-operator, then the KubeVirt object", KubeVirtVersion)
	if _, stderr, err := c.Kubectl(ctx, nil, "apply", "--server-side", "-f", filepath.Join(dir, "kubevirt-operator.yaml")); err != nil {
		return fmt.Errorf("installing virt-operator: %w: %s", err, stderr)
	}
	if _, stderr, err := c.Kubectl(ctx, nil, "wait", "--for=condition=Established", "--timeout=60s", "crd/kubevirts.kubevirt.io"); err != nil {
		return fmt.Errorf("waiting for KubeVirt's CRD: %w: %s", err, stderr)
	}
	if _, stderr, err := c.Kubectl(ctx, []byte(kubeVirtCR), "apply", "-f", "-"); err != nil {
		return fmt.Errorf("creating the KubeVirt object: %w: %s", err, stderr)
	}
	// diskpipe's manager starts without KubeVirt's VirtualMachine CRD and watches it once
	// virt-operator has made it: the chart is installed beside KubeVirt's rollout.
	return nil
}

// WaitKubeVirt waits until KubeVirt is Available (Options.KubeVirt), and says why it is not
// when it will not be.
func (c *Cluster) WaitKubeVirt() error {
	if c.kubeVirtDone == nil {
		return nil
	}
	<-c.kubeVirtDone
	return c.kubeVirtErr
}

// kubevirtAvailable waits until the KubeVirt object says KubeVirt is Available.
func (c *Cluster) kubevirtAvailable(ctx context.Context) (err error) {
	start := time.Now()
	defer func() {
		if err == nil {
			c.step("KubeVirt is Available, %s after its rollout began", time.Since(start).Round(time.Second))
		}
	}()
	return c.wait(ctx, "KubeVirt to be Available", "kubelet", 10*time.Minute, func(ctx context.Context) error {
		kv := &unstructured.Unstructured{}
		kv.SetGroupVersionKind(schema.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "KubeVirt"})
		if err := c.Client.Get(ctx, client.ObjectKey{Namespace: "kubevirt", Name: "kubevirt"}, kv); err != nil {
			return err
		}
		if conditionTrue(kv, "Available") {
			return nil
		}
		phase, _, _ := unstructured.NestedString(kv.Object, "status", "phase")
		pods := &corev1.PodList{}
		_ = c.Client.List(ctx, pods, client.InNamespace("kubevirt"))
		var states []string
		for i := range pods.Items {
			states = append(states, podState(&pods.Items[i]))
		}
		return fmt.Errorf("KubeVirt is %q; its pods: %v", phase, states)
	})
}

// conditionTrue says whether obj's status holds the condition typ with status True.
func conditionTrue(obj *unstructured.Unstructured, typ string) bool {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, cond := range conds {
		m, _ := cond.(map[string]any)
		if m["type"] == typ && m["status"] == string(corev1.ConditionTrue) {
			return true
		}
	}
	return false
}
