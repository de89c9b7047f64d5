package tenancy_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/objectstore"
	"github.com/diskpipe/diskpipe/objectstore/objectstoretest"
	"github.com/diskpipe/diskpipe/objectstore/tenancy"
	"github.com/diskpipe/diskpipe/test/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { testenv.RunTests(m, &env) }

// TestSweeper, on a real apiserver: a namespace's account is named after the UID the apiserver
// gives it, also while it is being deleted; the sweep keeps the accounts of namespaces that
// exist. (What the sweep does with the others: objectstore's TestNamespaceMadeAgain.)
func TestSweeper(t *testing.T) {
	ctx := t.Context()
	store := objectstoretest.Start(t)
	root := store.ClientOf(env.Client)
	ns, err := env.CreateNamespace(ctx, "tenancy")
	if err != nil {
		t.Fatal(err)
	}
	obj := &corev1.Namespace{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: ns}, obj); err != nil {
		t.Fatal(err)
	}
	tenant, err := root.Tenant(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if access, _ := tenant.Keys(); access != objectstore.TenantAccess(string(obj.UID)) {
		t.Fatalf("namespace %s's account is %s, want the one of its UID %s", ns, access, obj.UID)
	}
	s := &tenancy.Sweeper{Store: root, Reader: env.Client}
	if err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	// The namespace's account is still there: its keys work.
	access, secret := tenant.Keys()
	if out, err := store.AWSAs(ctx, access, secret, "s3", "ls"); err != nil {
		t.Errorf("namespace %s's keys after the sweep: %v\n%s", ns, err, out)
	}

	gone, err := env.CreateNamespace(ctx, "tenancy-gone")
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: gone}}); err != nil {
		t.Fatal(err)
	}
	// A namespace being deleted is still itself (its finalizers clean up with its account).
	goneObj := &corev1.Namespace{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: gone}, goneObj); err != nil || goneObj.DeletionTimestamp == nil {
		t.Fatalf("namespace %s is not being deleted: %v", gone, err)
	}
	if tenant, err := root.Tenant(ctx, gone); err != nil {
		t.Errorf("the account of a namespace being deleted: %v", err)
	} else if access, _ := tenant.Keys(); access != objectstore.TenantAccess(string(goneObj.UID)) {
		t.Errorf("the account of a namespace being deleted is %s, not its UID's", access)
	}
}
