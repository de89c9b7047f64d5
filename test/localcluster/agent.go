package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Image is the image the manager is told to give its pods; the agent runs only those.
const Image = "diskpipe:local"

// agent stands in for the kubelet: it runs diskpipe's pods as local processes.
type agent struct {
	c   client.Client
	csi *csi
	bin string // directory of the importer and exporter binaries
	dir string
	log io.Writer

	mu      sync.Mutex
	running map[types.UID]*process
	// stopping are the processes of deleted pods, told to stop, until they exit.
	stopping []*process
	nextIP   int
	// subnet is this agent's 127.A.B.0/24, drawn at random: the pods' ports are fixed (metrics,
	// clone sources), so two local clusters at once (make test's and the chaos run's) must not
	// hand out the same addresses.
	subnet [2]byte
}

// newSubnet draws an agent's subnet of loopback, leaving out 127.0.0.0/24 (the test's own
// servers and the cluster's components listen on 127.0.0.1).
func newSubnet() [2]byte {
	n := 256 + rand.IntN(65536-256)
	return [2]byte{byte(n >> 8), byte(n)}
}

type process struct {
	cmd             *exec.Cmd
	namespace, name string
	exited          chan struct{}
}

// stillStopping reports whether the process of an earlier pod of that name has yet to exit:
// as a kubelet does (a pod leaves the API only once its containers stopped), the agent starts
// the pod made again under the same name only then, so the two never share its volumes. The
// old importer's cleanup once removed the new one's disk.img here.
func (a *agent) stillStopping(ns, name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	live := a.stopping[:0]
	found := false
	for _, pr := range a.stopping {
		select {
		case <-pr.exited:
			continue
		default:
		}
		live = append(live, pr)
		found = found || (pr.namespace == ns && pr.name == name)
	}
	a.stopping = live
	return found
}

// kill kills a pod's process at once.
func (a *agent) kill(ns, name string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, pr := range a.running {
		if pr.namespace == ns && pr.name == name {
			return pr.cmd.Process.Kill()
		}
	}
	return fmt.Errorf("no process runs pod %s/%s", ns, name)
}

var listenAddr = regexp.MustCompile(`^:[0-9]+$`)

// sync starts the pods that wait and kills the processes of pods that are gone.
func (a *agent) sync(ctx context.Context, pods []corev1.Pod) {
	alive := map[types.UID]bool{}
	for i := range pods {
		p := &pods[i]
		alive[p.UID] = true
		if p.Status.Phase != "" && p.Status.Phase != corev1.PodPending {
			continue
		}
		if len(p.Spec.Containers) != 1 || p.Spec.Containers[0].Image != Image {
			continue // not diskpipe's: nothing runs it here
		}
		a.mu.Lock()
		_, started := a.running[p.UID]
		a.mu.Unlock()
		if started || a.stillStopping(p.Namespace, p.Name) {
			continue
		}
		if err := a.start(ctx, p); err != nil {
			a.refuse(ctx, p, err)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for uid, pr := range a.running {
		if !alive[uid] {
			_ = pr.cmd.Process.Signal(syscall.SIGTERM)
			delete(a.running, uid)
			a.stopping = append(a.stopping, pr)
		}
	}
}

// start runs the pod's container as a process: mounts become paths, listen addresses the
// pod's own 127.A.B.N.
func (a *agent) start(ctx context.Context, p *corev1.Pod) error {
	ctr := p.Spec.Containers[0]
	podDir := filepath.Join(a.dir, "pods", p.Namespace, p.Name)
	if err := os.MkdirAll(podDir, 0o755); err != nil {
		return err
	}
	// A pod made again under the same name starts without the last one's result, as a
	// kubelet's new container would.
	termLog := filepath.Join(podDir, "termination-log")
	if err := os.Remove(termLog); err != nil && !os.IsNotExist(err) {
		return err
	}
	paths := map[string]string{corev1.TerminationMessagePathDefault: termLog}
	volumes := map[string]corev1.Volume{}
	for _, v := range p.Spec.Volumes {
		volumes[v.Name] = v
	}
	for _, m := range ctr.VolumeMounts {
		host, err := a.mount(ctx, p, volumes[m.Name], podDir)
		if err != nil {
			return err
		}
		paths[m.MountPath] = host
	}
	for _, d := range ctr.VolumeDevices {
		v := volumes[d.Name]
		if v.PersistentVolumeClaim == nil {
			return fmt.Errorf("device %s is not a PVC", d.Name)
		}
		pvc := &corev1.PersistentVolumeClaim{}
		if err := a.c.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: v.PersistentVolumeClaim.ClaimName}, pvc); err != nil {
			return err
		}
		if pvc.Status.Phase != corev1.ClaimBound {
			return errWait
		}
		size := pvc.Status.Capacity[corev1.ResourceStorage]
		dev, err := a.csi.blockDevice(pvc.Spec.VolumeName, size.Value())
		if err != nil {
			return err
		}
		paths[d.DevicePath] = dev
	}
	a.mu.Lock()
	a.nextIP = a.nextIP%250 + 1
	ip := fmt.Sprintf("127.%d.%d.%d", a.subnet[0], a.subnet[1], a.nextIP+1)
	a.mu.Unlock()

	var args []string
	for _, arg := range ctr.Args {
		if listenAddr.MatchString(arg) {
			arg = ip + arg
		}
		for in, host := range paths {
			if arg == in || strings.HasPrefix(arg, in+"/") {
				arg = host + strings.TrimPrefix(arg, in)
				break
			}
		}
		args = append(args, arg)
	}
	bin := filepath.Join(a.bin, filepath.Base(ctr.Command[0]))
	cmd := exec.Command(bin, args...) //nolint:gosec // diskpipe's own binaries
	cmd.Env = os.Environ()
	if tmp, ok := paths["/tmp"]; ok {
		// A volume at /tmp is where the process makes its temporary files, as in the pod.
		cmd.Env = append(cmd.Env, "TMPDIR="+tmp)
	}
	for _, e := range ctr.Env {
		if e.ValueFrom != nil {
			return fmt.Errorf("env %s: only literal values can be given here", e.Name)
		}
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
	logf, err := os.Create(filepath.Join(podDir, "log"))
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %w", bin, err)
	}
	pr := &process{cmd: cmd, namespace: p.Namespace, name: p.Name, exited: make(chan struct{})}
	a.mu.Lock()
	a.running[p.UID] = pr
	a.mu.Unlock()
	fmt.Fprintf(a.log, "agent: pod %s/%s runs %s (pid %d, %s)\n", p.Namespace, p.Name, filepath.Base(bin), cmd.Process.Pid, ip)

	now := metav1.Now()
	p.Status.Phase, p.Status.PodIP, p.Status.StartTime = corev1.PodRunning, ip, &now
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: ctr.Name, Image: ctr.Image, Ready: true,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}
	if err := a.c.Status().Update(ctx, p); err != nil {
		fmt.Fprintf(a.log, "agent: %v\n", err)
	}
	go a.wait(p.DeepCopy(), pr, logf, paths[corev1.TerminationMessagePathDefault])
	return nil
}

// wait reports the process's end as the container's termination.
func (a *agent) wait(p *corev1.Pod, pr *process, logf *os.File, termPath string) {
	err := pr.cmd.Wait()
	close(pr.exited)
	logf.Close()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	}
	msg, _ := os.ReadFile(termPath) //nolint:gosec // the pod's own file
	ctx := context.Background()
	cur := &corev1.Pod{}
	if err := a.c.Get(ctx, client.ObjectKeyFromObject(p), cur); err != nil || cur.UID != p.UID {
		return // deleted
	}
	phase := corev1.PodSucceeded
	if code != 0 {
		phase = corev1.PodFailed
	}
	now := metav1.Now()
	cur.Status.Phase = phase
	cur.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: p.Spec.Containers[0].Name, Image: Image,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: int32(code), //nolint:gosec // an exit code
			Message: string(msg), FinishedAt: now}}}}
	if err := a.c.Status().Update(ctx, cur); err != nil {
		fmt.Fprintf(a.log, "agent: %v\n", err)
	}
	fmt.Fprintf(a.log, "agent: pod %s/%s ended with %d\n", p.Namespace, p.Name, code)
}

// mount is where a volume of the pod is on this machine.
func (a *agent) mount(ctx context.Context, p *corev1.Pod, v corev1.Volume, podDir string) (string, error) {
	switch {
	case v.PersistentVolumeClaim != nil:
		pvc := &corev1.PersistentVolumeClaim{}
		if err := a.c.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: v.PersistentVolumeClaim.ClaimName}, pvc); err != nil {
			return "", err
		}
		if pvc.Status.Phase != corev1.ClaimBound {
			return "", errWait
		}
		return a.csi.volumeDir(pvc.Spec.VolumeName), nil
	case v.Secret != nil:
		sec := &corev1.Secret{}
		if err := a.c.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: v.Secret.SecretName}, sec); err != nil {
			return "", err
		}
		return writeFiles(filepath.Join(podDir, v.Name), sec.Data)
	case v.ConfigMap != nil:
		cm := &corev1.ConfigMap{}
		if err := a.c.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: v.ConfigMap.Name}, cm); err != nil {
			return "", err
		}
		data := map[string][]byte{}
		for k, s := range cm.Data {
			data[k] = []byte(s)
		}
		return writeFiles(filepath.Join(podDir, v.Name), data)
	case v.EmptyDir != nil:
		dir := filepath.Join(podDir, v.Name)
		return dir, os.MkdirAll(dir, 0o700)
	}
	return "", fmt.Errorf("volume %s: only PVCs, Secrets, ConfigMaps and emptyDirs can be mounted here", v.Name)
}

// errWait means the pod cannot start yet (a volume is not bound); it is tried again.
var errWait = errors.New("waiting for a volume")

func writeFiles(dir string, data map[string][]byte) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	for k, b := range data {
		if err := os.WriteFile(filepath.Join(dir, k), b, 0o600); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// refuse fails a pod the agent cannot run, with the reason; one waiting for a volume waits.
func (a *agent) refuse(ctx context.Context, p *corev1.Pod, err error) {
	if errors.Is(err, errWait) {
		return
	}
	p.Status.Phase, p.Status.Reason, p.Status.Message = corev1.PodFailed, "CannotRun", "the local node agent cannot run this pod: "+err.Error()
	if uerr := a.c.Status().Update(ctx, p); uerr != nil {
		fmt.Fprintf(a.log, "agent: %v\n", uerr)
	}
	fmt.Fprintf(a.log, "agent: refused pod %s/%s: %v\n", p.Namespace, p.Name, err)
}

// stop kills every process.
func (a *agent) stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, pr := range a.running {
		_ = pr.cmd.Process.Kill()
	}
	a.csi.detach("")
}
