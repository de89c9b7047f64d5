package image

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/controllers/internal/owned"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore"
)

// TestObjectStoreCA: with an external store in place of the bundled one, whose CA is not
// publicly trusted, the importer of an objectStore source gets that CA beside its presigned
// URL, where the installation has a single tenant; else the source is refused, since the URL
// would be signed with the installation's keys (one step, with a fake client; the image suite
// imports from a real store).
func TestObjectStoreCA(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := objectstore.ClientConfig{Endpoint: "https://s3.internal.example", Region: "eu-west-1", AccessKey: "AK", SecretKey: "SK"}
	shared, err := objectstore.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.SingleTenant = true
	store, err := objectstore.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !owned.HasKey() { // a manager of this suite's may run beside: its key stays
		owned.UseKey([]byte("storeca test"), time.Time{})
	}
	scheme := runtime.NewScheme()
	if err := errors.Join(clientgoscheme.AddToScheme(scheme), hypercloud.AddToScheme(scheme)); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	var pods importpod.Config
	pods.Defaults()
	r := &Reconciler{Client: c, ObjectStore: shared, ObjectStoreCA: ca, Pods: &importpod.Tracker{Client: c, Config: pods}}
	vmi := &hypercloud.VirtualMachineImage{ObjectMeta: metav1.ObjectMeta{Name: "img", Namespace: "vms", UID: "u"}}
	g := &goldenImage{obj: vmi, status: &vmi.Status,
		source: source{kind: "objectStore", objectStore: &common.ObjectStoreSource{BucketName: "vmimage", ObjectName: "disk.qcow2"}}}
	if _, err := r.ensurePod(t.Context(), g, importpod.Spec{Name: "img-import-0"}, r.work(g, "Import")); transfer.ReasonOf(err) != transfer.ReasonSourceForbidden ||
		!strings.Contains(err.Error(), "objectStore.external.singleTenant") {
		t.Fatalf("an objectStore source on an external store shared by every namespace: %v", err)
	}
	r.ObjectStore = store
	pod, err := r.ensurePod(t.Context(), g, importpod.Spec{Name: "img-import-0"}, r.work(g, "Import"))
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Join(pod.Spec.Containers[0].Args, " ")
	if !strings.Contains(args, "--url-file "+urlDir+"/url") || !strings.Contains(args, "--ca-file "+urlDir+"/ca.crt") {
		t.Errorf("the importer is not given the URL and the store's CA: %s", args)
	}
	sec := &corev1.Secret{}
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: "vms", Name: "img-import-0"}, sec); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sec.StringData["ca.crt"], "BEGIN CERTIFICATE") || !strings.HasPrefix(sec.StringData["url"], "https://s3.internal.example/") {
		t.Errorf("the Secret lacks the CA or the presigned URL: %v", sec.StringData)
	}
}
