package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/test/bootdisk"
	realcluster "github.com/diskpipe/diskpipe/test/cluster"
)

// severalNodes skips a spec on a cluster of one node, saying how to run it.
func severalNodes() []string {
	GinkgoHelper()
	nodes := cluster.Nodes()
	if len(nodes) < 3 {
		Skip(fmt.Sprintf("needs three nodes, the cluster has %d: make test-cluster NODES=3", len(nodes)))
	}
	return nodes
}

// probePod is a restricted pod of the harness's pause image on node: "serve" answers HTTP on
// :8080 with the node's name, "get URL" fetches URL and ends with its answer.
func probePod(name, node string, args ...string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  labels: {probe: %s}
spec:
  nodeSelector: {kubernetes.io/hostname: %s}
  restartPolicy: Never
  terminationGracePeriodSeconds: 0
  securityContext:
    runAsNonRoot: true
    runAsUser: 107
    seccompProfile: {type: RuntimeDefault}
  containers:
  - name: probe
    image: %s
    args: [%s]
    env:
    - name: NODE_NAME
      valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
    securityContext:
      allowPrivilegeEscalation: false
      capabilities: {drop: [ALL]}
`, name, name, node, cluster.IdleImage(), quoted(args))
}

// quoted is args as a YAML flow sequence's items.
func quoted(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = fmt.Sprintf("%q", a)
	}
	return strings.Join(q, ", ")
}

// claimOn is a PVC of the node-local class of size, from source (a dataSource or
// dataSourceRef line, or ""), and a pod on node that consumes it (so that it binds there).
func claimOn(name, node, size, source string) string {
	if source != "" {
		source = "  " + source + "\n"
	}
	return fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: %s
spec:
  storageClassName: %s
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: %s}}
%s---
%s  nodeSelector: {kubernetes.io/hostname: %s}
`, name, realcluster.LocalClass, size, source, idlePod("vm-"+name, name), node)
}

// importLocal imports file of the test's server into VirtualMachineImage name of the node-local
// class (spec, YAML lines under the image's spec, added), waits until it is Ready, and returns
// the node its volume is on and the cluster's other nodes.
func importLocal(ns, name, file, spec string, nodes []string) (home string, others []string) {
	GinkgoHelper()
	image := strings.Replace(vmi(name, fmt.Sprintf("    http: %s/%s", server, file)), "storageClassName: cephrbd", "storageClassName: "+realcluster.LocalClass, 1)
	kubectl(image+spec, "apply", "-n", ns, "-f", "-")
	Eventually(phase(ns, "vmimage", name), 5*time.Minute, time.Second).Should(Equal("Ready Imported"))
	golden := pvOf(ns, "vmim-"+name)
	Expect(golden.Spec.NodeAffinity).NotTo(BeNil(), "the golden image is node-local")
	home = golden.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values[0]
	for _, n := range nodes {
		if n != home {
			others = append(others, n)
		}
	}
	return home, others
}

// goldenDataSource is CDI's DataSource golden of ns, of the image golden's PVC.
func goldenDataSource(ns string) string {
	return fmt.Sprintf(`apiVersion: cdi.kubevirt.io/v1beta1
kind: DataSource
metadata:
  name: golden
spec:
  source: {pvc: {namespace: %s, name: vmim-golden}}
---
`, ns)
}

// multiNode labels a spec that needs several nodes: CI runs these on a cluster of three
// with KubeVirt (make test-cluster KUBEVIRT=1 NODES=3 E2E_LABELS=nodes), after the suite on one node.
var multiNode = Label("nodes")

var _ = Describe("on three nodes: the harness's network and node-local storage", Ordered, multiNode, func() {
	var (
		ns    string
		nodes []string
	)
	BeforeAll(func() {
		node()
		nodes = severalNodes()
		ns = namespace()
	})

	It("gives every node its CSI driver and its topology", func() {
		for _, n := range nodes {
			csiNode := kubectl("", "get", "csinode", n, "-o", `jsonpath={.spec.drivers[*].name} {.spec.drivers[*].topologyKeys}`)
			Expect(csiNode).To(ContainSubstring(realcluster.Driver), n)
			Expect(csiNode).To(ContainSubstring(realcluster.TopologyKey), n)
			Expect(kubectl("", "get", "node", n, "-o", "jsonpath={.metadata.labels}")).To(ContainSubstring(`"` + realcluster.TopologyKey + `":"` + n + `"`))
		}
	})

	It("lets pods on every node reach a Service and a pod on another, by name", func() {
		for i, server := range nodes {
			name := fmt.Sprintf("server-%d", i)
			kubectl(probePod(name, server, "serve", ":8080"), "apply", "-n", ns, "-f", "-")
			kubectl("", "expose", "pod", name, "-n", ns, "--port", "80", "--target-port", "8080")
		}
		for i := range nodes {
			kubectl("", "wait", "-n", ns, "--for=condition=Ready", "--timeout=120s", fmt.Sprintf("pod/server-%d", i))
		}
		for i, client := range nodes {
			for j, server := range nodes {
				if i == j {
					continue
				}
				name := fmt.Sprintf("get-%d-%d", i, j)
				kubectl(probePod(name, client, "get", fmt.Sprintf("http://server-%d.%s.svc.cluster.local/", j, ns)), "apply", "-n", ns, "-f", "-")
				Eventually(func() string {
					pod := &corev1.Pod{}
					if err := get(ns, name, pod); err != nil || len(pod.Status.ContainerStatuses) == 0 || pod.Status.ContainerStatuses[0].State.Terminated == nil {
						return string(pod.Status.Phase)
					}
					t := pod.Status.ContainerStatuses[0].State.Terminated
					return fmt.Sprintf("%s on %s: %s", pod.Status.Phase, pod.Spec.NodeName, strings.TrimSpace(t.Message))
				}, 2*time.Minute, time.Second).Should(Equal(fmt.Sprintf("Succeeded on %s: 200 %s", client, server)), "%s from %s", server, client)
			}
		}
	})

	It("makes a node-local volume where its consumer runs, and clones it only there", func() {
		kubectl(claimOn("local", nodes[1], "64Mi", ""), "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "pvc", "local"), 2*time.Minute, time.Second).Should(Equal("Bound"))
		pv := pvOf(ns, "local")
		Expect(pv.Spec.NodeAffinity).NotTo(BeNil())
		Expect(pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values).To(Equal([]string{nodes[1]}))
		kubectl("", "wait", "-n", ns, "--for=condition=Ready", "--timeout=120s", "pod/vm-local")

		kubectl(claimOn("here", nodes[1], "64Mi", "dataSource: {kind: PersistentVolumeClaim, name: local}"), "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "pvc", "here"), 2*time.Minute, time.Second).Should(Equal("Bound"))
		Expect(pvOf(ns, "here").Spec.CSI.VolumeAttributes).To(HaveKeyWithValue(realcluster.ContentSourceAttribute, "volume/"+pv.Spec.CSI.VolumeHandle))

		kubectl(claimOn("there", nodes[2], "64Mi", "dataSource: {kind: PersistentVolumeClaim, name: local}"), "apply", "-n", ns, "-f", "-")
		Eventually(func() string {
			return observe("get", "events", "-n", ns, "--field-selector", "involvedObject.name=there,reason=ProvisioningFailed", "-o", "jsonpath={.items[*].message}")
		}, 2*time.Minute, 2*time.Second).Should(ContainSubstring(fmt.Sprintf("the source lives on node %s: a clone or a restore of a node-local volume is made only there, and this one is wanted on %s", nodes[1], nodes[2])))
		Expect(phase(ns, "pvc", "there")()).To(Equal("Pending"))
	})

	It("restores another namespace's snapshot of a node-local volume on that volume's node, for an image of it", func() {
		golden := namespace()
		home, _ := importLocal(golden, "snapped", "disk.qcow2", "", nodes)
		kubectl(volumeSnapshot("snapped", "vmim-snapped"), "apply", "-n", golden, "-f", "-")
		Eventually(func() string {
			return observe("get", "volumesnapshot", "snapped", "-n", golden, "-o", "jsonpath={.status.readyToUse}")
		}, 2*time.Minute, time.Second).Should(Equal("true"))
		// The driver restores a node-local snapshot only on its volume's node: the claim restored
		// for the copy is provisioned there, wherever the scheduler would have put its reader.
		var restoredOn sync.Map
		ctx, stop := context.WithCancel(context.Background())
		defer stop()
		go func() {
			defer GinkgoRecover()
			for ctx.Err() == nil {
				pvcs := &corev1.PersistentVolumeClaimList{}
				if err := cluster.APIClient().List(ctx, pvcs, client.InNamespace(golden), client.HasLabels{"diskpipe.io/clone-for"}); err == nil {
					for _, p := range pvcs.Items {
						restoredOn.Store(p.Name, p.Annotations["volume.kubernetes.io/selected-node"])
					}
				}
				time.Sleep(200 * time.Millisecond)
			}
		}()
		kubectl(vmi("fromsnap", "    snapshot: {name: snapped, namespace: "+golden+"}"), "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "vmimage", "fromsnap"), 5*time.Minute, time.Second).Should(Equal("Ready Imported"))
		stop()
		sameDisk(filepath.Join(cluster.VolumePath(ns, "vmim-fromsnap"), "disk.img"))
		seen := map[string]string{}
		restoredOn.Range(func(k, v any) bool { seen[k.(string)] = v.(string); return true })
		Expect(seen).To(HaveLen(1), "one claim restored for the copy")
		for name, node := range seen {
			Expect(node).To(Equal(home), "%s is restored on the node of the snapshot's volume", name)
		}
		// Once the image is Ready, the copy's claim and pod are removed (not before: a retry reads them).
		Eventually(func() string {
			return observe("get", "pvc,pods", "-n", golden, "-l", "diskpipe.io/clone-for", "-o", "name")
		}, time.Minute, time.Second).
			Should(BeEmpty(), "the restored claim and its pod are gone")
	})

	It("pre-warms every node its image's replica policy selects, before any disk is wanted there", func() {
		_, rest := importLocal(ns, "warm", "disk.qcow2", "  replicas:\n    nodeSelector: {matchLabels: {kubernetes.io/os: linux}}\n    evictAfter: 720h\n", nodes)
		var others []string
		for _, n := range rest {
			others = append(others, n+" Ready")
		}
		Eventually(func() []string {
			return strings.Split(strings.TrimSuffix(observe("get", "vmimage", "warm", "-n", ns, "-o", "jsonpath={range .status.replicas[*]}{.node} {.phase};{end}"), ";"), ";")
		}, 4*time.Minute, 2*time.Second).Should(ConsistOf(others), "a replica on each other node, with no disk wanted yet")

		// A disk wanted there now is a clone of the replica at once: nothing is copied for it.
		away := rest[0]
		kubectl(claimOn("prewarmed", away, "256Mi", "dataSourceRef: {apiGroup: hypercloud.tmaxanc.com, kind: VirtualMachineImage, name: warm}"), "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "pvc", "prewarmed"), 2*time.Minute, time.Second).Should(Equal("Bound"))
		uid := kubectl("", "get", "vmimage", "warm", "-n", ns, "-o", "jsonpath={.metadata.uid}")
		replica := kubectl("", "get", "diskvolumes", "-n", ns, "-l", "diskpipe.io/replica-of="+uid, "-o",
			fmt.Sprintf(`jsonpath={.items[?(@.metadata.annotations.volume\.kubernetes\.io/selected-node=="%s")].metadata.name}`, away))
		Expect(pvOf(ns, "prewarmed").Spec.CSI.VolumeAttributes).To(HaveKeyWithValue(realcluster.ContentSourceAttribute, "volume/"+pvOf(ns, replica).Spec.CSI.VolumeHandle))
		kubectl("", "wait", "-n", ns, "--for=condition=Ready", "--timeout=120s", "pod/vm-prewarmed")
		sameDisk(filepath.Join(cluster.VolumePath(ns, "prewarmed"), "disk.img"))
		Expect(kubectl("", "get", "diskvolume", replica, "-n", ns, "-o", `jsonpath={.metadata.annotations.diskpipe\.io/replica-last-used}`)).NotTo(BeEmpty(),
			"the use is noted, for eviction")
	})

	It("copies a node-local image once to each node its VMs run on, and clones every disk there", func() {
		home, others := importLocal(ns, "golden", "disk.qcow2", "", nodes)
		golden := pvOf(ns, "vmim-golden")
		away := others[0]
		claims := map[string]string{"far": away, "far2": away, "near": home}
		for name, node := range claims {
			kubectl(claimOn(name, node, "256Mi", "dataSourceRef: {apiGroup: hypercloud.tmaxanc.com, kind: VirtualMachineImage, name: golden}"), "apply", "-n", ns, "-f", "-")
		}
		for name, node := range claims {
			Eventually(phase(ns, "pvc", name), 4*time.Minute, time.Second).Should(Equal("Bound"), name)
			pv := pvOf(ns, name)
			Expect(pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values).To(Equal([]string{node}), "%s is on the VM's node", name)
			kubectl("", "wait", "-n", ns, "--for=condition=Ready", "--timeout=120s", "pod/vm-"+name)
			sameDisk(filepath.Join(cluster.VolumePath(ns, name), "disk.img"))
		}
		// Near the image, the storage cloned it. Away from it, the image was copied once into a
		// replica on that node (a clone-source pod on the image's node streamed it to the
		// importer on the VM's), and both disks there are clones of the replica.
		Expect(pvOf(ns, "near").Spec.CSI.VolumeAttributes).To(HaveKeyWithValue(realcluster.ContentSourceAttribute, "volume/"+golden.Spec.CSI.VolumeHandle))
		uid := kubectl("", "get", "vmimage", "golden", "-n", ns, "-o", "jsonpath={.metadata.uid}")
		replicas := strings.Fields(kubectl("", "get", "diskvolumes", "-n", ns, "-l", "diskpipe.io/replica-of="+uid, "-o", "name"))
		Expect(replicas).To(HaveLen(1), "one replica, on the one node away from the image")
		replica := pvOf(ns, strings.TrimPrefix(replicas[0], "diskvolume.diskvolume.kubesphere.io/"))
		Expect(replica.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values).To(Equal([]string{away}))
		Expect(replica.Spec.CSI.VolumeAttributes).To(HaveKeyWithValue(realcluster.ContentSourceAttribute, "empty"), "the replica is a copy")
		Eventually(func() string {
			return observe("get", "vmimage", "golden", "-n", ns, "-o", "jsonpath={range .status.replicas[*]}{.node} {.name} {.phase};{end}")
		}, time.Minute, time.Second).Should(Equal(fmt.Sprintf("%s %s Ready;", away, replica.Spec.ClaimRef.Name)), "the image lists its replicas by node")
		for _, name := range []string{"far", "far2"} {
			Expect(pvOf(ns, name).Spec.CSI.VolumeAttributes).To(HaveKeyWithValue(realcluster.ContentSourceAttribute, "volume/"+replica.Spec.CSI.VolumeHandle), name)
		}
		Expect(kubectl("", "get", "events", "-n", ns, "--field-selector", "involvedObject.kind=DiskVolume,reason=Preferred", "-o", "jsonpath={.items[*].message}")).
			To(ContainSubstring(fmt.Sprintf("Cloning with CSIClone of the image's replica %s on node %s, where the image's volume is not", replica.Spec.ClaimRef.Name, away)))

		// A DiskVolume the storage would clone (CSIClone) waits for its VM's node, and is made
		// there: from the replica on that node, not pinned to the image's.
		kubectl(fmt.Sprintf(`apiVersion: diskvolume.kubesphere.io/v1alpha1
kind: DiskVolume
metadata:
  name: roaming
spec:
  source:
    image: {name: golden, kind: VirtualMachineImage}
  cloneStrategy: CSIClone
  storageClassName: %s
---
%s  nodeSelector: {kubernetes.io/hostname: %s}
`, realcluster.LocalClass, idlePod("vm-roaming", "roaming"), away), "apply", "-n", ns, "-f", "-")
		Eventually(phase(ns, "pvc", "roaming"), 4*time.Minute, time.Second).Should(Equal("Bound"))
		Expect(pvOf(ns, "roaming").Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values).To(Equal([]string{away}))
		Expect(pvOf(ns, "roaming").Spec.CSI.VolumeAttributes).To(HaveKeyWithValue(realcluster.ContentSourceAttribute, "volume/"+replica.Spec.CSI.VolumeHandle))
		kubectl("", "wait", "-n", ns, "--for=condition=Ready", "--timeout=120s", "pod/vm-roaming")
		sameDisk(filepath.Join(cluster.VolumePath(ns, "roaming"), "disk.img"))
		Expect(kubectl("", "get", "events", "-n", ns, "--field-selector", "involvedObject.name=roaming,reason=Populated", "-o", "jsonpath={.items[*].message}")).
			To(ContainSubstring("filled from VirtualMachineImage golden"))

		// The same through CDI's API: a DataVolume of a DataSource of the image, on the third
		// node, waits for its VM's pod (PendingPopulation) and is made there from a new replica.
		third := nodes[0]
		for _, n := range nodes {
			if n != home && n != away {
				third = n
			}
		}
		kubectl(goldenDataSource(ns)+fmt.Sprintf(`apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: dv-third
spec:
  sourceRef: {kind: DataSource, name: golden}
  storage: {storageClassName: %s}
`, realcluster.LocalClass), "apply", "-n", ns, "-f", "-")
		dvPhase := func() string { return observe("get", "dv", "dv-third", "-n", ns, "-o", "jsonpath={.status.phase}") }
		Eventually(dvPhase, 2*time.Minute, time.Second).Should(Equal("PendingPopulation"))
		kubectl(idlePod("vm-dv-third", "dv-third")+fmt.Sprintf("  nodeSelector: {kubernetes.io/hostname: %s}\n", third), "apply", "-n", ns, "-f", "-")
		Eventually(dvPhase, 4*time.Minute, time.Second).Should(Equal("Succeeded"))
		Expect(pvOf(ns, "dv-third").Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values).To(Equal([]string{third}))
		kubectl("", "wait", "-n", ns, "--for=condition=Ready", "--timeout=120s", "pod/vm-dv-third")
		sameDisk(filepath.Join(cluster.VolumePath(ns, "dv-third"), "disk.img"))
		Eventually(func() string {
			return observe("get", "vmimage", "golden", "-n", ns, "-o", "jsonpath={range .status.replicas[*]}{.node} {.phase};{end}")
		}, time.Minute, time.Second).Should(SatisfyAll(ContainSubstring(away+" Ready;"), ContainSubstring(third+" Ready;")), "a replica on each node away from the image")
	})
})

// onNode pins a KubeVirt VirtualMachine's VMs to node.
func onNode(vm, node string) string {
	return strings.Replace(vm, "    spec:\n      domain:\n", "    spec:\n      nodeSelector: {kubernetes.io/hostname: "+node+"}\n      domain:\n", 1)
}

var _ = Describe("real KubeVirt on three nodes", afterKubeVirtRollout, multiNode, func() {
	BeforeEach(requireKubeVirt)

	It("boots VMs on the nodes away from a node-local image, through a DiskVolume and a DataVolume of a DataSource beside a blank one, each from a replica on its node", func() {
		nodes := severalNodes()
		ns := vmNamespace()
		_, away := importLocal(ns, "golden", "disk.qcow2", "", nodes)

		// On one node, a DiskVolume of the image on the node-local class; on another, KubeVirt's
		// dataVolumeTemplates from a DataSource of it. Neither disk exists before its VM's node
		// is known.
		kubectl(fmt.Sprintf(`apiVersion: diskvolume.kubesphere.io/v1alpha1
kind: DiskVolume
metadata:
  name: byhand
spec:
  source:
    image: {name: golden, kind: VirtualMachineImage}
  storageClassName: %s
  resources: {requests: {storage: 512Mi}}
---
`, realcluster.LocalClass)+goldenDataSource(ns)+
			onNode(kubeVirtVM("byhand", "Once", "byhand"), away[0])+"---\n"+
			onNode(fmt.Sprintf(`apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: fromsource
spec:
  runStrategy: Once
  dataVolumeTemplates:
  - metadata: {name: fromsource-root}
    spec:
      storage: {storageClassName: %[1]s, resources: {requests: {storage: 512Mi}}}
      sourceRef: {kind: DataSource, name: golden}
  - metadata: {name: fromsource-data}
    spec:
      storage: {storageClassName: %[1]s, resources: {requests: {storage: 128Mi}}}
      source: {blank: {}}
  template:
    spec:
      domain:
        devices:
          autoattachPodInterface: false
          disks:
          - {name: root, disk: {bus: virtio}}
          - {name: data, disk: {bus: virtio}}
        resources: {requests: {memory: 128Mi}}
      volumes:
      - {name: root, dataVolume: {name: fromsource-root}}
      - {name: data, dataVolume: {name: fromsource-data}}
`, realcluster.LocalClass), away[1]),
			"apply", "-n", ns, "-f", "-")

		// The DiskVolume's disk is its size less the filesystem's overhead; a DataVolume's is at
		// least the size asked for, as CDI makes it.
		Expect(guestConsole(ns, "byhand", "")[0]).To(Equal(fmt.Sprintf("DISKPIPE-BOOT disk=vda size=%d marker=%s", grown(512<<20), bootdisk.Marker)))
		lines := guestConsole(ns, "fromsource", "")
		line := lines[0]
		Expect(line).To(And(HavePrefix("DISKPIPE-BOOT disk=vda size="), HaveSuffix(" marker="+bootdisk.Marker)))
		Expect(lines).To(ContainElement(And(HavePrefix("DISKPIPE-DISK disk=vdb size="), Not(ContainSubstring(bootdisk.Marker)))), "the blank disk: %q", lines)
		size, err := strconv.ParseInt(strings.Fields(strings.TrimPrefix(line, "DISKPIPE-BOOT disk=vda size="))[0], 10, 64)
		Expect(err).NotTo(HaveOccurred())
		Expect(size).To(BeNumerically(">=", 512<<20))
		for vm, node := range map[string]string{"byhand": away[0], "fromsource": away[1]} {
			Expect(kubectl("", "get", "vmi", vm, "-n", ns, "-o", "jsonpath={.status.nodeName}")).To(Equal(node), vm)
		}
		// Every disk is on its VM's node: the blank one too, which a pod filling it before the VM
		// was scheduled would have put on that pod's node.
		for claim, node := range map[string]string{"byhand": away[0], "fromsource-root": away[1], "fromsource-data": away[1]} {
			Expect(pvOf(ns, claim).Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values).To(Equal([]string{node}), "%s is on its VM's node", claim)
			Expect(kubectl("", "get", "pvc", claim, "-n", ns, "-o", "jsonpath={.spec.dataSourceRef.kind}")).To(Equal("DiskVolume"), "%s was filled once its VM's node was known", claim)
		}
		// The image was copied once into each of those nodes, and nowhere else.
		want := make([]string, 0, len(away))
		for _, n := range away {
			want = append(want, n+" Ready")
		}
		Eventually(func() []string {
			return strings.FieldsFunc(observe("get", "vmimage", "golden", "-n", ns, "-o", "jsonpath={range .status.replicas[*]}{.node} {.phase};{end}"),
				func(r rune) bool { return r == ';' })
		}, time.Minute, time.Second).Should(ConsistOf(want), "a replica on each VM's node, none on the image's")
	})
})

// migratable is a VM of kubeVirtVM whose guest stays up, printing a line for each disk it is
// given (bootdisk.HotplugSerial): after a move, a disk plugged in shows it runs on.
func migratable(vm string) string {
	return strings.Replace(vm, "      domain:\n", "      domain:\n        firmware: {serial: "+bootdisk.HotplugSerial+"}\n", 1)
}

var _ = Describe("live migration on three nodes", afterKubeVirtRollout, multiNode, func() {
	BeforeEach(requireKubeVirt)

	It("moves a running VM whose disk is a DiskVolume on shared storage to another node, the guest running on", func() {
		severalNodes()
		ns := vmNamespace()
		importHTTP(ns, "golden", "disk.qcow2")
		vm := migratable(kubeVirtVM("moving", "Always", "moving"))
		kubectl(`apiVersion: diskvolume.kubesphere.io/v1alpha1
kind: DiskVolume
metadata:
  name: moving
spec:
  source:
    image: {name: golden, kind: VirtualMachineImage}
  accessModes: [ReadWriteMany]
  volumeMode: Block
  resources: {requests: {storage: 512Mi}}
---
`+diskOf("extra", "", "Block", "256Mi")+"---\n"+vm, "apply", "-n", ns, "-f", "-")
		first := guestConsole(ns, "moving", "")
		Expect(first[0]).To(HavePrefix("DISKPIPE-BOOT disk=vda "))
		Eventually(func() string {
			return observe("get", "vmi", "moving", "-n", ns, "-o", `jsonpath={.status.conditions[?(@.type=="LiveMigratable")].status} {.status.conditions[?(@.type=="LiveMigratable")].message}`)
		}, time.Minute, time.Second).Should(HavePrefix("True"), "KubeVirt finds the VM live-migratable: its disk is on storage every node reaches")
		from := kubectl("", "get", "vmi", "moving", "-n", ns, "-o", "jsonpath={.status.nodeName}")

		kubectl(`apiVersion: kubevirt.io/v1
kind: VirtualMachineInstanceMigration
metadata:
  name: move
spec:
  vmiName: moving
`, "apply", "-n", ns, "-f", "-")
		Eventually(func() string {
			return observe("get", "virtualmachineinstancemigrations.kubevirt.io", "move", "-n", ns, "-o", "jsonpath={.status.phase}")
		}, 5*time.Minute, 2*time.Second).Should(Equal("Succeeded"), "the migration")
		state := kubectl("", "get", "vmi", "moving", "-n", ns, "-o", "jsonpath={.status.migrationState.completed} {.status.migrationState.failed} {.status.migrationState.sourceNode} {.status.migrationState.targetNode} {.status.nodeName} {.status.phase}")
		f := strings.Fields(state)
		Expect(f).To(HaveLen(5), "completed, source, target, node, phase: %q", state) // failed is empty
		Expect(f[0]).To(Equal("true"))
		Expect(f[1]).To(Equal(from))
		Expect(f[2]).NotTo(Equal(from), "the VM moved to another node")
		Expect(f[3]).To(Equal(f[2]))
		Expect(f[4]).To(Equal("Running"))

		// The guest runs on where it moved: a disk plugged in now shows in the console of the
		// launcher pod on the target node.
		pod := kubectl("", "get", "pods", "-n", ns, "-l", "kubevirt.io/created-by="+vmiUID(ns, "moving"),
			"--field-selector", "spec.nodeName="+f[2]+",status.phase=Running", "-o", "jsonpath={.items[*].metadata.name}")
		Expect(strings.Fields(pod)).To(HaveLen(1), "one launcher pod running on the target node")
		virtctl("addvolume", "moving", "--volume-name=extra", "--bus=virtio", "-n", ns)
		Eventually(func() []string { return consoleLines(ns, pod) }, 3*time.Minute, 2*time.Second).Should(
			ContainElement(fmt.Sprintf("DISKPIPE-DISK disk=vdb size=%d marker=%s", 256<<20, bootdisk.Marker)),
			"a disk plugged in after the move (a block volume: all of it), whole, in the guest")
	})
})

var _ = Describe("storage live migration on three nodes", afterKubeVirtRollout, multiNode, func() {
	BeforeEach(requireKubeVirt)

	It("moves a running VM's disk to a blank DiskVolume on the node-local class, the guest running on and booting from the copy", func() {
		severalNodes()
		ns := vmNamespace()
		// KubeVirt moves a VM's volumes only when its VMs roll out live and its workloads are
		// updated by live migration (its documentation's storage migration); the rest of the
		// suite keeps Stage (test/cluster/kubevirt.go).
		setRollout := func(strategy, methods string) {
			kubectl("", "patch", "kubevirt", "kubevirt", "-n", "kubevirt", "--type=merge", "-p",
				`{"spec":{"configuration":{"vmRolloutStrategy":"`+strategy+`"},"workloadUpdateStrategy":{"workloadUpdateMethods":`+methods+`}}}`)
		}
		setRollout("LiveUpdate", `["LiveMigrate"]`)
		DeferCleanup(setRollout, "Stage", "[]")

		importHTTP(ns, "golden", "disk.qcow2")
		vm := migratable(kubeVirtVM("relocating", "Always", "relocating"))
		vm = strings.Replace(vm, "  runStrategy: Always\n", "  runStrategy: Always\n  updateVolumesStrategy: Migration\n", 1)
		kubectl(diskOf("relocating", "", "Filesystem", "512Mi")+"---\n"+diskOf("extra", "", "Block", "256Mi")+"---\n"+vm, "apply", "-n", ns, "-f", "-")
		Expect(guestConsole(ns, "relocating", "")[0]).To(HavePrefix("DISKPIPE-BOOT disk=vda "))
		from := kubectl("", "get", "vmi", "relocating", "-n", ns, "-o", "jsonpath={.status.nodeName}")

		// The destination: a blank DiskVolume on the node-local class (WaitForFirstConsumer),
		// made where the migration's target pod is scheduled.
		kubectl(fmt.Sprintf(`apiVersion: diskvolume.kubesphere.io/v1alpha1
kind: DiskVolume
metadata:
  name: moved
spec:
  source: {blank: {}}
  storageClassName: %s
  resources: {requests: {storage: 1Gi}}
`, realcluster.LocalClass), "apply", "-n", ns, "-f", "-")
		kubectl("", "patch", "vm", "relocating", "-n", ns, "--type=json", "-p",
			`[{"op":"replace","path":"/spec/template/spec/volumes/0/persistentVolumeClaim/claimName","value":"moved"}]`)
		Eventually(func() string {
			return observe("get", "vmi", "relocating", "-n", ns, "-o",
				`jsonpath={.status.migrationState.completed}/{.status.migrationState.failed} {.spec.volumes[0].persistentVolumeClaim.claimName} {.status.migrationState.failureReason}`)
		}, 5*time.Minute, 2*time.Second).Should(Equal("true/ moved "), "the VM's disk moved to the DiskVolume moved")
		to := kubectl("", "get", "vmi", "relocating", "-n", ns, "-o", "jsonpath={.status.nodeName}")
		Expect(to).NotTo(Equal(from), "the VM moved with its disk")
		Expect(pvOf(ns, "moved").Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values).To(Equal([]string{to}), "the new disk is on the VM's node")
		Expect(phase(ns, "dvol", "moved")()).To(HavePrefix("Ready"))

		// The guest runs on: a disk plugged in now shows in the target's console.
		pod := kubectl("", "get", "pods", "-n", ns, "-l", "kubevirt.io/created-by="+vmiUID(ns, "relocating"),
			"--field-selector", "spec.nodeName="+to+",status.phase=Running", "-o", "jsonpath={.items[*].metadata.name}")
		Expect(strings.Fields(pod)).To(HaveLen(1), "one launcher pod running on the target node")
		virtctl("addvolume", "relocating", "--volume-name=extra", "--bus=virtio", "-n", ns)
		Eventually(func() []string { return consoleLines(ns, pod) }, 3*time.Minute, 2*time.Second).Should(
			ContainElement(fmt.Sprintf("DISKPIPE-DISK disk=vdb size=%d marker=%s", 256<<20, bootdisk.Marker)),
			"a disk plugged in after the move (a block volume: all of it), whole, in the guest")

		// And boots from the copy: the bootable disk's marker, read from the new volume.
		old := vmiUID(ns, "relocating")
		virtctl("restart", "relocating", "-n", ns)
		Expect(guestConsole(ns, "relocating", old)[0]).To(And(HavePrefix("DISKPIPE-BOOT disk=vda "), HaveSuffix(" marker="+bootdisk.Marker)))
		Expect(kubectl("", "get", "vmi", "relocating", "-n", ns, "-o", "jsonpath={.status.nodeName}")).To(Equal(to), "a VM on node-local storage boots where its disk is")
	})
})
