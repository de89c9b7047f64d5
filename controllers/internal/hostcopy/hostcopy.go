// Package hostcopy sets importer pods up to copy another PVC's disk: host-assisted clones of
// golden images into VM disks, and images made from PVCs, images or disks.
//
// Within a namespace the importer mounts the source read-only. A pod cannot mount another
// namespace's PVC, nor a node-local volume of another node, so across namespaces, and from a
// node the writer's node cannot reach, a clone-source pod beside the source (in its namespace,
// on its node) serves the disk over HTTPS (importer --serve), to the bearer of a random token
// that only the two pods receive, through Secrets; the importer reads it like any HTTPS
// source, with ranged, resumable requests, streaming from node to node with no scratch space.
// The copy path crosses the node network, where others may listen: the manager makes, with
// each token, a key and a certificate that only the clone source holds, issued by a CA made
// for that copy alone (whose key is then thrown away), and gives the importer that CA as the
// one root it trusts, so the token and the disk are never
// in the clear and no other pod can pose as the source.
package hostcopy

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/internal/certs"
	"github.com/diskpipe/diskpipe/internal/contract"
	"github.com/diskpipe/diskpipe/internal/transfer"
)

// Source is the PVC whose disk is copied.
type Source struct {
	Namespace, Name string
	Block           bool
	// Remote: the writer's node cannot mount the source (a node-local volume on another
	// node), so it is read through a clone-source pod even within its namespace.
	Remote bool
}

// LabelFor marks a clone source's pod and Secret with the UID of the object it serves.
const LabelFor = "diskpipe.io/clone-for"

// LabelSourceOf marks a clone source's pod with a hash of the PVC it serves (a name may be
// longer than a label's value), so that the pods serving one PVC can be counted.
const LabelSourceOf = "diskpipe.io/clone-source-of"

// MaxServing bounds the clone-source pods that serve one PVC to other namespaces at once: copies
// across namespaces start them in the source's namespace, which is not the copier's, so without
// a bound whoever may copy a public image fills its namespace with pods. A copy over the bound
// waits. MaxServingPerNamespace of them may serve the copies of one namespace, so that one
// copier cannot hold every slot. The namespace's own copies (its replicas, a copy from another
// node) are not bounded by others': they are its own pods.
const (
	MaxServing             = 4
	MaxServingPerNamespace = 2
)

// LabelCopier marks a clone source's pod with the namespace of the copy it serves.
const LabelCopier = "diskpipe.io/clone-for-namespace"

// AnnotationCopy names the copy a clone source's pod serves, "<kind>/<namespace>/<name>", so
// that its pod's changes wake the copy (Wakes) instead of the copy asking again and again.
const AnnotationCopy = "diskpipe.io/clone-for-object"

// ServingPoll is how long a copy whose clone source does not serve yet waits before it looks
// again, in case no change of the pod wakes it (Wakes does). A variable for the tests.
var ServingPoll = 15 * time.Second

// Wakes maps a clone source's pod to the copy of kind it serves: a copy in another namespace
// cannot own its pod, so Owns does not tell it that its source now serves. The pod's making
// and changes wake it, not its deletion: a clone source deleted is made again at the copy's
// next look (ServingPoll), not raced for. What wakes is not trusted: the copy's pass checks
// that the pod is the one diskpipe made for it, and a pod made to look like one wakes that
// pass to refuse it.
func Wakes(kind string) handler.EventHandler {
	wake := func(o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		k, rest, _ := strings.Cut(o.GetAnnotations()[AnnotationCopy], "/")
		ns, name, _ := strings.Cut(rest, "/")
		if k == kind && ns != "" && name != "" && o.GetDeletionTimestamp().IsZero() {
			q.Add(reconcile.Request{NamespacedName: client.ObjectKey{Namespace: ns, Name: name}})
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			wake(e.Object, q)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			// Only what a copy waits for: the pod running, or given its address. Another
			// change (a tenant writing its own pod's annotations again and again) wakes nothing.
			was, ok1 := e.ObjectOld.(*corev1.Pod)
			is, ok2 := e.ObjectNew.(*corev1.Pod)
			if ok1 && ok2 && (was.Status.Phase != is.Status.Phase || was.Status.PodIP != is.Status.PodIP) {
				wake(is, q)
			}
		},
	}
}

// BusyError says a copy waits: for one of the clone sources of its PVC to end, or for its own
// volume, which must be able to take the copy before a clone source is started for it.
type BusyError struct{ Message string }

func (e *BusyError) Error() string { return e.Message }

// sourceLabel is LabelSourceOf's value for src.
func sourceLabel(src Source) string {
	sum := sha256.Sum256([]byte(src.Name))
	return hex.EncodeToString(sum[:])[:40]
}

const tokenDir = "/var/run/diskpipe/clone"

// Prepare completes s, the spec of owner's importer pod, to copy src into the PVC s.PVC. It
// returns false while the clone-source pod of a copy across namespaces is not yet serving, and
// a *BusyError while s.PVC cannot take the copy yet, or while others hold the clone sources
// src may have (MaxServing, MaxServingPerNamespace). What serves is counted with live, the
// apiserver's word, not a cache a burst of copies would all pass.
func Prepare(ctx context.Context, c client.Client, live client.Reader, cfg importpod.Config, owner client.Object, src Source, s *importpod.Spec) (bool, error) {
	if src.Namespace == owner.GetNamespace() && !src.Remote {
		s.SourcePVC, s.SourceBlock = src.Name, src.Block
		s.Import.Source, s.Import.Path = "file", s.SourcePath()
		return true, nil
	}
	// An importer that ended (it read the whole disk, then wrote on) has its result read
	// whatever became of its clone source meanwhile (ended idle while it finished writing).
	importer := &corev1.Pod{}
	if s.Name != "" {
		switch err := c.Get(ctx, client.ObjectKey{Namespace: owner.GetNamespace(), Name: s.Name}, importer); {
		case err == nil && ended(importer) && importpod.Made(importer, owner.GetUID()):
			return true, nil
		case err != nil && !apierrors.IsNotFound(err):
			return false, err
		}
	}
	if err := canTake(ctx, live, owner.GetNamespace(), s.PVC); err != nil {
		return false, err
	}
	// One pass at a time for src in this manager, so that two copies do not both take its
	// last slot between a count and a create.
	unlock := lockSource(src)
	defer unlock()
	if err := bounded(ctx, live, owner, src); err != nil {
		return false, err
	}
	if err := ensureToken(ctx, c, owner, src.Namespace); err != nil {
		return false, err
	}
	name := sourceName(owner)
	serve := importpod.Spec{Name: name, Namespace: src.Namespace, SourcePVC: src.Name, SourceBlock: src.Block, ServePort: importpod.ServePort,
		Labels: map[string]string{LabelFor: string(owner.GetUID()), LabelSourceOf: sourceLabel(src), LabelCopier: owner.GetNamespace(), "diskpipe.io/role": "clone-source"},
		Mounts: []importpod.Mount{{Secret: serveSecretName(owner), Path: tokenDir}}}
	serve.Import = contract.Import{Serve: ":" + strconv.Itoa(importpod.ServePort), Path: serve.SourcePath(), TokenFile: tokenDir + "/token",
		TLSCertFile: tokenDir + "/tls.crt", TLSKeyFile: tokenDir + "/tls.key", IdleTimeout: IdleTimeout, StallTimeout: StallTimeout, ServeMinRate: ServeMinRate}
	gvk, err := apiutil.GVKForObject(owner, c.Scheme())
	if err != nil {
		return false, err
	}
	pod := importpod.Build(cfg, serve)
	pod.Annotations = maps.Clone(pod.Annotations)
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[AnnotationCopy] = gvk.Kind + "/" + owner.GetNamespace() + "/" + owner.GetName()
	// In another namespace it can have no owner: its mark names the object it serves. In the
	// owner's own (a remote source), the owner controls it, so that it goes with the owner.
	owned.Stamp("Pod", pod, owner.GetUID())
	if src.Namespace == owner.GetNamespace() {
		if err := controllerutil.SetControllerReference(owner, pod, c.Scheme()); err != nil {
			return false, err
		}
	}
	if err := importpod.Create(ctx, c, cfg, pod); err != nil {
		return false, fmt.Errorf("creating the clone source: %w", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	switch {
	case pod.DeletionTimestamp != nil:
		// Stopping (deleted when a copy ended, evicted, an earlier owner's of the name): a copy
		// begun now would be cut short; the next pass makes it again once it is gone.
		return false, nil
	case !importpod.Made(pod, owner.GetUID()):
		// Made by someone else under its name: its address is not one to send a token to.
		return false, &owned.ErrNotOwned{Kind: "Pod", Name: src.Namespace + "/" + pod.Name}
	case ended(pod):
		if wait := coolingDown(pod, time.Now()); wait > 0 {
			// An importer that has not started yet would read the address of the source that
			// ended: it is made again with the next one (its attempt not counted).
			if importer.Name != "" && importer.Status.Phase == corev1.PodPending && importer.DeletionTimestamp.IsZero() && importpod.Made(importer, owner.GetUID()) {
				if err := c.Delete(ctx, importer, client.Preconditions{UID: &importer.UID}); client.IgnoreNotFound(err) != nil {
					return false, err
				}
			}
			return false, &BusyError{fmt.Sprintf("the clone source of this copy in %s was not read for %s (the copy's importer did not run, or stopped reading) and gave its slot up to other copies; it starts again in %s",
				src.Namespace, IdleTimeout, wait.Round(time.Second))}
		}
		// It should serve until deleted: start it again.
		return false, client.IgnoreNotFound(c.Delete(ctx, pod))
	case !servesTLS(pod):
		// Made by a diskpipe whose clone sources served plain HTTP, with Secrets that hold no
		// certificate: both are made again.
		return false, dropPlain(ctx, c, owner, src.Namespace)
	case pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "":
		return false, nil
	}
	s.Import.Source, s.Import.Format = "http", "raw"
	base := "https://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(importpod.ServePort))
	s.Import.URL, s.Import.ExtentsURL = base+"/disk", base+"/extents"
	s.Import.CAFile, s.Import.ServerName = tokenDir+"/ca.crt", ServerName
	s.Import.HeaderFile = append(s.Import.HeaderFile, tokenDir+"/header")
	s.Import.AllowDestination = append(s.Import.AllowDestination, pod.Status.PodIP)
	s.Mounts = append(s.Mounts, importpod.Mount{Secret: tokenSecretName(owner), Path: tokenDir})
	return true, nil
}

// Serving is the PVC that owner's clone-source pod in namespace serves, "" when it has none:
// a copy that began goes on from the volume it began from.
func Serving(ctx context.Context, c client.Client, owner client.Object, namespace string) (string, error) {
	pod := &corev1.Pod{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: sourceName(owner)}, pod); err != nil || !importpod.Made(pod, owner.GetUID()) {
		return "", client.IgnoreNotFound(err)
	}
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			return v.PersistentVolumeClaim.ClaimName, nil
		}
	}
	return "", nil
}

// bounded returns a *BusyError when owner has no clone-source pod for src yet and MaxServing
// others serve it.
func bounded(ctx context.Context, live client.Reader, owner client.Object, src Source) error {
	pods := &corev1.PodList{}
	if err := live.List(ctx, pods, client.InNamespace(src.Namespace), client.MatchingLabels{LabelSourceOf: sourceLabel(src)}); err != nil {
		return err
	}
	if owner.GetNamespace() == src.Namespace {
		return nil // the namespace's own copies (its replicas): its pods, in its namespace
	}
	serving, theirs := 0, 0
	for _, p := range pods.Items {
		if p.Name == sourceName(owner) && p.DeletionTimestamp.IsZero() && !ended(&p) {
			return nil // its own, serving: it goes on
		}
		if p.DeletionTimestamp.IsZero() && !ended(&p) && p.Labels[LabelCopier] != src.Namespace {
			serving++
			if p.Labels[LabelCopier] == owner.GetNamespace() {
				theirs++
			}
		}
	}
	switch {
	case theirs >= MaxServingPerNamespace:
		return &BusyError{fmt.Sprintf("%d copies of %s/%s are being served to namespace %s, as many as one namespace may have at once; this one starts when one of them ends",
			theirs, src.Namespace, src.Name, owner.GetNamespace())}
	case serving >= MaxServing:
		return &BusyError{fmt.Sprintf("%d copies of %s/%s are being served from its namespace to others, as many as may be at once; this one starts when one of them ends",
			serving, src.Namespace, src.Name)}
	}
	return nil
}

// IdleTimeout ends a clone source its copy does not read (its importer cannot be made, is not
// scheduled, or stopped), and StallTimeout an answer its importer stopped taking: a clone
// source holds one of the MaxServing slots of its PVC. One that ended idle waits as long again
// before it is started again, leaving its slot to the copies waiting for one.
// A copy that reads, but no faster on average than ServeMinRate, ends as an idle one does
// once it has had an hour more than the whole disk takes at that rate: its reader (who may
// read the token in the copier's namespace) cannot keep the slot forever by reading a little
// now and then.
var (
	IdleTimeout  = 10 * time.Minute
	StallTimeout = time.Minute
	ServeMinRate = int64(1 << 20)
)

// ended says whether a pod (a clone source, an importer) has stopped.
func ended(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// coolingDown is how much longer a clone source that ended idle waits before it is started
// again; 0 for one that ended otherwise, or long enough ago.
func coolingDown(pod *corev1.Pod, now time.Time) time.Duration {
	if importpod.Result(pod).Reason != transfer.ReasonIdle {
		return 0
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			// FinishedAt is the node's clock: a node ahead of the manager's waits no longer.
			return min(IdleTimeout, max(0, t.FinishedAt.Add(IdleTimeout).Sub(now)))
		}
	}
	return 0
}

// sourceLocks serialises the passes that count and start the clone sources of one PVC; a
// lock is kept only while a pass holds or waits for it.
var (
	sourceLocksMu sync.Mutex
	sourceLocks   = map[string]*sourceLock{}
)

type sourceLock struct {
	sync.Mutex
	users int // passes holding or waiting for it
}

func lockSource(src Source) (unlock func()) {
	key := src.Namespace + "/" + src.Name
	sourceLocksMu.Lock()
	l := sourceLocks[key]
	if l == nil {
		l = &sourceLock{}
		sourceLocks[key] = l
	}
	l.users++
	sourceLocksMu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		sourceLocksMu.Lock()
		if l.users--; l.users == 0 {
			delete(sourceLocks, key)
		}
		sourceLocksMu.Unlock()
	}
}

// canTake says, with a *BusyError, when the claim ns/name of a copy cannot take it yet (read
// from c, the apiserver: the claim was made a moment ago, the cache may not have it): a
// clone source started before would hold a slot of its source for a copy that cannot run
// (a claim of a storage class that does not exist never binds). A claim that is bound can,
// and so can one whose class binds it when its writer is scheduled (WaitForFirstConsumer).
func canTake(ctx context.Context, c client.Reader, ns, name string) error {
	if name == "" {
		return nil
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pvc); apierrors.IsNotFound(err) {
		return &BusyError{fmt.Sprintf("the copy's volume %s is not made yet: its clone source starts when it can take the copy", name)}
	} else if err != nil {
		return err
	}
	if pvc.Status.Phase == corev1.ClaimBound {
		return nil
	}
	class := ptr.Deref(pvc.Spec.StorageClassName, "")
	if class == "" {
		return &BusyError{fmt.Sprintf("the copy's volume %s is not bound yet, and names no storage class: its clone source starts when it is bound", name)}
	}
	sc, missing, err := classOf(ctx, c, class)
	switch {
	case err != nil:
		return err
	case missing != "":
		return &BusyError{fmt.Sprintf("the copy's volume %s %s: its clone source starts when the volume can be made", name, missing)}
	case ptr.Deref(sc.VolumeBindingMode, storagev1.VolumeBindingImmediate) == storagev1.VolumeBindingWaitForFirstConsumer:
		return nil
	}
	return &BusyError{fmt.Sprintf("the copy's volume %s (storage class %s) is not bound yet: its clone source starts when it is", name, class)}
}

// classOf reads the storage class a copy's volume is (to be) made in; when it does not exist,
// missing says so as a phrase of a message. A class not named ("") is taken as one that
// exists.
func classOf(ctx context.Context, c client.Reader, class string) (sc *storagev1.StorageClass, missing string, err error) {
	sc = &storagev1.StorageClass{}
	if class == "" {
		return sc, "", nil
	}
	err = c.Get(ctx, client.ObjectKey{Name: class}, sc)
	if apierrors.IsNotFound(err) {
		return nil, "is of storage class " + class + ", which does not exist", nil
	}
	return sc, "", err
}

// ensureToken makes the token Secrets: one owned by owner in its namespace holding the
// header the importer sends, one in the source's namespace holding the token the server
// expects. Neither is read back (the manager may not read Secrets): a pair that exists was
// made together with one token; when only one of them did (a pass cut short), it is made
// again with the other's new token.
func ensureToken(ctx context.Context, c client.Client, owner client.Object, srcNamespace string) error {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	token := hex.EncodeToString(b)
	ca, crt, key, err := servingPair()
	if err != nil {
		return err
	}
	theirs := func() *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: serveSecretName(owner), Namespace: srcNamespace,
			Labels: map[string]string{LabelFor: string(owner.GetUID())}},
			StringData: map[string]string{"token": token, "tls.crt": string(crt), "tls.key": string(key)}}
		if srcNamespace == owner.GetNamespace() {
			_ = controllerutil.SetControllerReference(owner, s, c.Scheme())
		}
		return s
	}
	mine := func() (*corev1.Secret, error) {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: tokenSecretName(owner), Namespace: owner.GetNamespace()},
			StringData: map[string]string{"token": token, "header": "Authorization: Bearer " + token, "ca.crt": string(ca)}}
		return s, controllerutil.SetControllerReference(owner, s, c.Scheme())
	}
	made := func(s *corev1.Secret) (bool, error) {
		err := c.Create(ctx, s)
		if apierrors.IsAlreadyExists(err) {
			return false, nil
		}
		return err == nil, err
	}
	replace := func(s *corev1.Secret) error {
		if err := c.Delete(ctx, s); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		s.ResourceVersion = ""
		return c.Create(ctx, s)
	}
	t := theirs()
	newTheirs, err := made(t)
	if err != nil {
		return fmt.Errorf("creating the clone source's token: %w", err)
	}
	m, err := mine()
	if err != nil {
		return err
	}
	newMine, err := made(m)
	switch {
	case err != nil:
		return fmt.Errorf("creating the clone's token: %w", err)
	case newTheirs && !newMine:
		return replace(m)
	case newMine && !newTheirs:
		if err := replace(t); err != nil {
			return err
		}
		// A clone source serving the old token starts again with the new one.
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: sourceName(owner), Namespace: srcNamespace}}
		return client.IgnoreNotFound(c.Delete(ctx, pod))
	}
	return nil
}

// Cleanup removes the clone-source pod and Secret that serve owner from srcNamespace (also
// its own: a remote source in the namespace is served alike), and the claim restored for it
// from a snapshot (Restore), when it bears owner's mark.
func Cleanup(ctx context.Context, c client.Client, owner client.Object, srcNamespace string) error {
	return CleanupReading(ctx, c, c, owner, srcNamespace)
}

// CleanupReading is Cleanup, looking for the restored claim with r: the apiserver itself
// where a claim made a moment ago may not be in the cache yet (an image deleted just after
// its copy began), which would leave it, owned by nothing, in the source's namespace.
func CleanupReading(ctx context.Context, c client.Client, r client.Reader, owner client.Object, srcNamespace string) error {
	meta := metav1.ObjectMeta{Name: sourceName(owner), Namespace: srcNamespace}
	serve := metav1.ObjectMeta{Name: serveSecretName(owner), Namespace: srcNamespace}
	// The Secret of the pod's name is an older diskpipe's (a plain-HTTP clone source's).
	for _, obj := range []client.Object{&corev1.Pod{ObjectMeta: meta}, &corev1.Secret{ObjectMeta: serve}, &corev1.Secret{ObjectMeta: meta}} {
		if err := c.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if err := r.Get(ctx, client.ObjectKeyFromObject(&corev1.PersistentVolumeClaim{ObjectMeta: meta}), pvc); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !owned.Marked("PersistentVolumeClaim", pvc, owner.GetUID()) {
		return nil // someone else's, under the name: not diskpipe's to delete
	}
	return client.IgnoreNotFound(c.Delete(ctx, pvc, client.Preconditions{UID: &pvc.UID}))
}

// dropPlain deletes a clone source that an older diskpipe made to serve plain HTTP, and its
// token Secrets (of other names, holding no certificate): the next pass serves over TLS.
func dropPlain(ctx context.Context, c client.Client, owner client.Object, srcNamespace string) error {
	for _, obj := range []client.Object{
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: sourceName(owner), Namespace: srcNamespace}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: sourceName(owner), Namespace: srcNamespace}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "clone-token-" + string(owner.GetUID()), Namespace: owner.GetNamespace()}},
	} {
		if err := c.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// ServerName is the name a clone source's certificate is made for and verified against: each
// copy's certificate is its own root, so the name need not be unique.
const ServerName = "clone-source.diskpipe.invalid"

// servesTLS says whether pod serves over TLS (made by this diskpipe).
func servesTLS(pod *corev1.Pod) bool {
	for _, c := range pod.Spec.Containers {
		if slices.Contains(c.Args, "--tls-cert-file") {
			return true
		}
	}
	return false
}

// servingPair is a clone source's certificate and key, for one copy, and the CA that issued
// it, as PEM. The CA's key is thrown away once it signed: no other certificate verifies as
// the source.
func servingPair() (caPEM, certPEM, keyPEM []byte, err error) {
	now := time.Now()
	ca, caKey, err := certs.Issue(nil, nil, "diskpipe clone source CA", nil, now, certLifetime)
	if err != nil {
		return nil, nil, nil, err
	}
	cert, key, err := certs.Issue(ca, caKey, "", []string{ServerName}, now, certLifetime)
	if err != nil {
		return nil, nil, nil, err
	}
	return certs.PEMCert(ca), certs.PEMCert(cert), certs.PEMKey(key), nil
}

// certLifetime bounds a clone source's certificate: longer than any copy runs (a copy that
// outlives it fails its next request and is made again with a new pair).
const certLifetime = 90 * 24 * time.Hour

// sourceName names a clone source's pod; serveSecretName its Secret (token, key and
// certificate) in the source's namespace; tokenSecretName the importer's (the header it sends
// and the certificate it trusts) in the owner's.
func sourceName(owner client.Object) string      { return "clone-source-" + string(owner.GetUID()) }
func serveSecretName(owner client.Object) string { return "clone-serve-" + string(owner.GetUID()) }
func tokenSecretName(owner client.Object) string { return "clone-trust-" + string(owner.GetUID()) }
