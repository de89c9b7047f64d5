// Package ctrltest runs diskpipe's manager against a test's apiserver and plays the parts
// that envtest has no process for: the kubelet (pod status, termination messages, a pod IP
// whose metrics port the test controls) and the CSI driver (binding PVCs). Only tests import
// it.
package ctrltest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/onsi/gomega"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/controllers/manager"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/test/testenv"
)

// Manager is a running manager and the importer metrics it is served.
type Manager struct {
	// Metrics is what importer pods' metrics endpoints answer: send a body to serve it.
	Metrics chan string
}

// StartManager starts the manager with opts (its importer pods' metrics port pointed at a
// server the test controls) until the control plane stops. Call it once per binary: controller
// names are unique per process.
func StartManager(env *testenv.Env, opts manager.Options) (*Manager, error) {
	return StartManagerAs(env, env.Config, opts)
}

// StartManagerAs is StartManager with the manager reaching the apiserver through cfg: as a
// user with only the chart's role, say.
func StartManagerAs(env *testenv.Env, cfg *rest.Config, opts manager.Options) (*Manager, error) {
	m := &Manager{Metrics: make(chan string, 1)}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		select {
		case b := <-m.Metrics:
			fmt.Fprint(w, b)
			m.Metrics <- b
		default:
		}
	})}
	go func() { _ = srv.Serve(l) }()
	level := zapcore.ErrorLevel
	if os.Getenv("DISKPIPE_TEST_LOG") == "debug" { // the manager's whole log, for a failing test
		level = zapcore.DebugLevel
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(level)))
	if opts.MetricsAddr == "" { // a test that scrapes the manager gives an address
		opts.MetricsAddr = "0"
	}
	opts.ProbeAddr, opts.SkipNameValidation = "0", true
	// Importer pods' metrics are served by this test's server; the rest of opts.Importer stays.
	opts.Importer.Image, opts.Importer.MetricsPort = "diskpipe:test", int32(l.Addr().(*net.TCPAddr).Port) //nolint:gosec // a port
	if opts.OwnerKeySecret.Name == "" {
		owned.UseKey([]byte("the key of the tests' children marks"), time.Time{})
	}
	mgr, err := manager.New(cfg, opts)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "the manager stopped:", err)
		}
		close(done)
	}()
	env.OnStop(func() { cancel(); <-done; _ = srv.Close() })
	if w := opts.Webhook; w != nil {
		// Requests fail closed until the webhooks answer.
		addr := net.JoinHostPort(w.Host, fmt.Sprint(w.Port))
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			c, err := net.Dial("tcp", addr)
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("the webhooks are not served on %s: %w", addr, err)
			}
		}
	}
	return m, nil
}

// Pod waits for a pod to exist and returns it.
func Pod(t *testing.T, env *testenv.Env, ns, name string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{}
	gomega.NewWithT(t).Eventually(func() error { return env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, pod) },
		Wait).Should(gomega.Succeed(), "pod %s/%s", ns, name)
	return pod
}

// Wait is how long these helpers wait for what a controller makes. On an idle machine it comes
// within a second or two; on two cores shared with the real node's suite and a cold build, a
// pod took more than 20 s to come (export's TestRetainPolicyDelete, image's
// TestObjectStoreSource). Each wait ends as soon as the object is there.
const Wait = time.Minute

// Kubelet plays the kubelet's part for a pod: its phase, IP 127.0.0.1, and when it ended, the
// result in its termination message (none with res nil: a killed container).
func Kubelet(t *testing.T, env *testenv.Env, ns, name string, phase corev1.PodPhase, res *transfer.Result, exit int32) {
	t.Helper()
	pod := Pod(t, env, ns, name)
	pod.Status.Phase, pod.Status.PodIP = phase, "127.0.0.1"
	if res != nil || exit != 0 {
		msg := ""
		if res != nil {
			b, _ := json.Marshal(res)
			msg = string(b)
		}
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "importer", State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{ExitCode: exit, Reason: "Error", Message: msg,
				StartedAt: metav1.NewTime(pod.CreationTimestamp.Add(time.Second)), FinishedAt: metav1.Now()}}}}
	}
	gomega.NewWithT(t).Expect(env.Client.Status().Update(t.Context(), pod)).To(gomega.Succeed())
}

// Complete ends a pod with a successful result.
func Complete(t *testing.T, env *testenv.Env, ns, name string, res transfer.Result) {
	t.Helper()
	res.Succeeded = true
	Kubelet(t, env, ns, name, corev1.PodSucceeded, &res, 0)
}

// Bind plays the CSI provisioner and Kubernetes' PV controller for a PVC: a new one gets a
// volume of its requested size (a PersistentVolume, whose claimRef is the PVC) and is bound to
// it; one made pre-bound to a volume (spec.volumeName) is bound once that volume's claimRef
// names it.
func Bind(t *testing.T, env *testenv.Env, ns, name string) *corev1.PersistentVolumeClaim {
	t.Helper()
	return BindWith(t, env, ns, name, nil)
}

// BindWith is Bind, the volume it makes shaped by volume (its node affinity), unless nil.
func BindWith(t *testing.T, env *testenv.Env, ns, name string, volume func(*corev1.PersistentVolume)) *corev1.PersistentVolumeClaim {
	t.Helper()
	pvc := &corev1.PersistentVolumeClaim{}
	g := gomega.NewWithT(t)
	g.Eventually(func() error { return env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, pvc) },
		Wait).Should(gomega.Succeed(), "PVC %s/%s", ns, name)
	size := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if pvc.Spec.VolumeName == "" {
		pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-" + string(pvc.UID)},
			Spec: corev1.PersistentVolumeSpec{Capacity: corev1.ResourceList{corev1.ResourceStorage: size},
				AccessModes: pvc.Spec.AccessModes, StorageClassName: ptr.Deref(pvc.Spec.StorageClassName, ""), VolumeMode: pvc.Spec.VolumeMode,
				ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ns, Name: name, UID: pvc.UID},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
				PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "test.diskpipe.io", VolumeHandle: string(pvc.UID)}}}}
		if volume != nil {
			volume(pv)
		}
		g.Expect(env.Client.Create(t.Context(), pv)).To(gomega.Succeed())
		// The controllers write the claim too (labels, annotations): a conflict is tried again.
		g.Expect(Update(t.Context(), env.Client, pvc, func() { pvc.Spec.VolumeName = pv.Name })).To(gomega.Succeed())
	} else {
		pv := &corev1.PersistentVolume{}
		g.Eventually(func() types.UID {
			if err := env.Client.Get(t.Context(), client.ObjectKey{Name: pvc.Spec.VolumeName}, pv); err != nil || pv.Spec.ClaimRef == nil {
				return ""
			}
			return pv.Spec.ClaimRef.UID
		}, Wait).Should(gomega.Equal(pvc.UID), "the claimRef of volume %s", pvc.Spec.VolumeName)
		size = pv.Spec.Capacity[corev1.ResourceStorage]
	}
	g.Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(pvc), pvc); err != nil {
			return err
		}
		pvc.Status.Phase = corev1.ClaimBound
		pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: size}
		return env.Client.Status().Update(t.Context(), pvc)
	})).To(gomega.Succeed())
	return pvc
}

// OnNode shapes a volume BindWith makes into a node-local one of node (by its hostname label),
// as TopoLVM's and local-path's are.
func OnNode(node string) func(*corev1.PersistentVolume) {
	return func(pv *corev1.PersistentVolume) {
		pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}}
	}
}

// Fill plays the storage and the kubelet for a disk an importer pod fills: the prime PVC is
// bound, the pod ends with res, and the disk's PVC is bound to the prime's volume once the
// disk controller hands it over.
func Fill(t *testing.T, env *testenv.Env, ns, prime, pod, pvc string, res transfer.Result) {
	t.Helper()
	p := &corev1.PersistentVolumeClaim{}
	gomega.NewWithT(t).Eventually(func() error { return env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: prime}, p) },
		Wait).Should(gomega.Succeed(), "PVC %s/%s", ns, prime)
	if p.Status.Phase != corev1.ClaimBound {
		Bind(t, env, ns, prime)
	}
	Complete(t, env, ns, pod, res)
	Bind(t, env, ns, pvc)
}

// Quantity parses s.
func Quantity(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

// Update writes change to the latest version of obj as c, reading it again when a controller
// wrote it in between (a conflict), so a test's update never races the manager's status writes.
// Any other error, such as a webhook's refusal, is returned as it is.
func Update(ctx context.Context, c client.Client, obj client.Object, change func()) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		change()
		return c.Update(ctx, obj)
	})
}
