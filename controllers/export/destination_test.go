package export

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
	"github.com/diskpipe/diskpipe/internal/contract"
	"github.com/diskpipe/diskpipe/internal/transfer"
	"github.com/diskpipe/diskpipe/objectstore"
)

// TestInstallationStoreSettings: when the chart replaces the bundled store with an external
// one, whose keys reach every namespace's objects, namespaces may not export to it unless the
// installation says it has a single tenant; then exporter pods reach it with the
// installation's region, bucket lookup and CA (one step, with a fake client; the export suite
// runs exports against a real store).
func TestInstallationStoreSettings(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(ca, []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := &objectstore.ClientConfig{Endpoint: "https://s3.eu-west-1.amazonaws.com", Region: "eu-west-1",
		BucketLookup: "VirtualHost", AccessKey: "AK", SecretKey: "SK", CAFile: ca}
	shared, err := objectstore.NewClient(objectstore.ClientConfig{Endpoint: cfg.Endpoint, Region: cfg.Region})
	if err != nil {
		t.Fatal(err)
	}
	store, err := objectstore.NewClient(objectstore.ClientConfig{Endpoint: cfg.Endpoint, Region: cfg.Region, SingleTenant: true})
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := errors.Join(clientgoscheme.AddToScheme(scheme), hypercloud.AddToScheme(scheme)); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	r := &Reconciler{Client: c, Options: Options{Store: shared, StoreConfig: cfg}}
	ex := &hypercloud.VirtualMachineVolumeExport{ObjectMeta: metav1.ObjectMeta{Name: "e", Namespace: "vms", UID: "u"},
		Spec: hypercloud.VirtualMachineVolumeExportSpec{ObjectStore: &common.ObjectStoreSource{BucketName: "exports", ObjectName: "disk.qcow2"}}}
	if _, err := r.destination(t.Context(), ex, true); err == nil || transfer.IsTransient(err) || transfer.ReasonOf(err) != transfer.ReasonTargetForbidden ||
		!strings.Contains(err.Error(), "objectStore.external.singleTenant") {
		t.Fatalf("an export to an external store shared by every namespace: %v", err)
	}
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: "vms", Name: "e-export-store"}, &corev1.Secret{}); err == nil {
		t.Fatal("the installation's keys were written into the namespace")
	}
	r.Store = store
	d, err := r.destination(t.Context(), ex, true)
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Join(contract.Args(d.exp), " ")
	for _, want := range []string{"--endpoint https://s3.eu-west-1.amazonaws.com", "--region eu-west-1", "--bucket-lookup VirtualHost",
		"--ca-file " + authDir + "/ca.crt"} {
		if !strings.Contains(args, want) {
			t.Errorf("the exporter's arguments lack %q: %s", want, args)
		}
	}
	if err := r.prepareStore(t.Context(), ex, d); err != nil { // an external store: no account, the installation's keys
		t.Fatal(err)
	}
	sec := &corev1.Secret{}
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: "vms", Name: "e-export-store"}, sec); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sec.StringData["ca.crt"]+string(sec.Data["ca.crt"]), "BEGIN CERTIFICATE") {
		t.Errorf("the exporter's Secret lacks the store's CA: %v", sec)
	}
}
