package uploadproxy_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/diskpipe/diskpipe/objectstore/objectstoretest"
	"github.com/diskpipe/diskpipe/uploadproxy"
)

// TestRenewStoreKeys: after a namespace's account moved, the keys Secret diskpipe wrote for
// it is written again with the namespace's keys; a Secret of that name that diskpipe did not
// write is left alone.
func TestRenewStoreKeys(t *testing.T) {
	ctx := t.Context()
	store := objectstoretest.Start(t)
	api := &uploadproxy.TokenAPI{Client: env.Client, Store: store.ClientOf(env.Client), StoreEndpoint: store.Endpoint}
	for _, c := range []struct {
		labels  map[string]string
		renewed bool
	}{{map[string]string{uploadproxy.LabelStoreKeys: "true"}, true}, {nil, false}} {
		ns, err := env.CreateNamespace(ctx, "keys")
		if err != nil {
			t.Fatal(err)
		}
		stale := map[string][]byte{"accessKeyId": []byte("dpn-the-account-before"), "secretAccessKey": []byte("stale")}
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: uploadproxy.DefaultKeysSecret, Labels: c.labels}, Data: stale}
		if err := env.Client.Create(ctx, sec); err != nil {
			t.Fatal(err)
		}
		if err := api.RenewStoreKeys(ctx, ns); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(sec), sec); err != nil {
			t.Fatal(err)
		}
		tenant, err := api.Store.Tenant(ctx, ns)
		if err != nil {
			t.Fatal(err)
		}
		access, secret := tenant.Keys()
		got := string(sec.Data["accessKeyId"]) == access && string(sec.Data["secretAccessKey"]) == secret
		if got != c.renewed || !c.renewed && string(sec.Data["accessKeyId"]) != "dpn-the-account-before" {
			t.Errorf("Secret labelled %v: keys %s, renewed %v, want %v", c.labels, sec.Data["accessKeyId"], got, c.renewed)
		}
	}
	if err := api.RenewStoreKeys(ctx, "no-such-namespace-has-keys"); err != nil {
		t.Errorf("no Secret to renew: %v", err)
	}
}
