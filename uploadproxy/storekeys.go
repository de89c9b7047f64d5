package uploadproxy

import (
	"context"
	"fmt"
	"net/http"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	uploadapi "github.com/diskpipe/diskpipe/apis/upload/v1alpha1"
	"github.com/diskpipe/diskpipe/internal/authz"
)

// DefaultKeysSecret is the Secret an ObjectStoreKeysRequest writes by default.
const DefaultKeysSecret = "diskpipe-objectstore-keys"

// LabelStoreKeys marks the Secrets the API wrote, the only ones it updates.
const LabelStoreKeys = "diskpipe.io/objectstore-keys"

// storeKeys answers an ObjectStoreKeysRequest: the namespace's keys, written to a Secret the
// user may write.
func (a *TokenAPI) storeKeys(ctx context.Context, ns string, req *uploadapi.ObjectStoreKeysRequest, user authenticationv1.UserInfo) error {
	if a.Store == nil {
		return Fail(http.StatusNotFound, "this installation has no bundled object store: there are no keys to give")
	}
	name := req.Spec.SecretName
	if name == "" {
		name = DefaultKeysSecret
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return Fail(http.StatusBadRequest, "invalid ObjectStoreKeysRequest: spec.secretName %q: %s", name, errs[0])
	}
	// The manager may read only the Secrets of the default name (its RBAC names it): one of
	// another name is written only if it does not exist yet.
	sec := &corev1.Secret{}
	exists := false
	if name == DefaultKeysSecret {
		err := a.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, sec)
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		exists = err == nil
		if exists && sec.Labels[LabelStoreKeys] != "true" {
			return Fail(http.StatusConflict, "the Secret %s/%s exists and diskpipe did not make it: name another in spec.secretName", ns, name)
		}
	}
	// The manager writes the Secret for the user: only for one who may write it themselves.
	verb := "create"
	if exists {
		verb = "update"
	}
	if err := review(ctx, a.Client, user, &authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Resource: "secrets", Name: name},
		fmt.Sprintf("%s may not %s the Secret %s/%s the keys are written to: it needs %s on secrets", user.Username, verb, ns, name, verb)); err != nil {
		return err
	}
	sec.Name, sec.Namespace = name, ns
	access, err := a.fillStoreKeys(ctx, sec)
	if err != nil {
		return err
	}
	if exists {
		err = a.Client.Update(ctx, sec)
	} else if err = a.Client.Create(ctx, sec); apierrors.IsAlreadyExists(err) {
		return Fail(http.StatusConflict, "the Secret %s/%s exists: diskpipe rewrites only %s; delete it to have it written again, or name another", ns, name, DefaultKeysSecret)
	}
	if err != nil {
		return fmt.Errorf("writing the Secret %s/%s: %w", ns, name, err)
	}
	req.Status = uploadapi.ObjectStoreKeysRequestStatus{SecretName: name, Endpoint: a.StoreEndpoint, AccessKeyID: access}
	return nil
}

// fillStoreKeys writes the keys of sec's namespace into sec, and returns its access key.
func (a *TokenAPI) fillStoreKeys(ctx context.Context, sec *corev1.Secret) (string, error) {
	tenant, err := a.Store.Tenant(ctx, sec.Namespace)
	if err != nil {
		return "", err
	}
	access, secret := tenant.Keys()
	if sec.Labels == nil {
		sec.Labels = map[string]string{}
	}
	sec.Labels[LabelStoreKeys], sec.Labels["app.kubernetes.io/part-of"] = "true", "diskpipe"
	sec.Data = map[string][]byte{"accessKeyId": []byte(access), "secretAccessKey": []byte(secret), "endpoint": []byte(a.StoreEndpoint)}
	return access, nil
}

// RenewStoreKeys rewrites the keys Secret of the default name that diskpipe wrote in namespace
// ns, if there is one and it holds other keys than the namespace's (its account moved); a
// Secret of another name, which the manager may not read, is asked for again by its user.
func (a *TokenAPI) RenewStoreKeys(ctx context.Context, ns string) error {
	sec := &corev1.Secret{}
	if err := a.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: DefaultKeysSecret}, sec); err != nil {
		return client.IgnoreNotFound(err)
	}
	if sec.Labels[LabelStoreKeys] != "true" {
		return nil
	}
	old := string(sec.Data["accessKeyId"])
	access, err := a.fillStoreKeys(ctx, sec)
	if err != nil || access == old {
		return err
	}
	return a.Client.Update(ctx, sec)
}

// review asks the apiserver whether user may do what attrs say; a refusal is a *httpError
// (403) with the message refusal.
func review(ctx context.Context, c client.Client, user authenticationv1.UserInfo, attrs *authorizationv1.ResourceAttributes, refusal string) error {
	allowed, err := authz.Allowed(ctx, c, user, *attrs)
	if err != nil {
		return err
	}
	if !allowed {
		return Fail(http.StatusForbidden, "%s", refusal)
	}
	return nil
}
