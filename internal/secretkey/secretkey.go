// Package secretkey keeps a key of the installation (the one upload tokens are signed with, the
// one children are marked with) in a Secret: the first replica that needs it makes it, the
// others read what was stored.
package secretkey

import (
	"context"
	"crypto/rand"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Field is the Secret's key that holds the key.
const Field = "key"

// Ensure returns the Secret name, making it with 32 random bytes in Field if there is none (a
// replica that loses the race reads the winner's). what names the key in errors.
func Ensure(ctx context.Context, c client.Client, name types.NamespacedName, what string) (*corev1.Secret, error) {
	sec := &corev1.Secret{}
	err := c.Get(ctx, name, sec)
	if apierrors.IsNotFound(err) {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		sec = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name,
			Labels: map[string]string{"app.kubernetes.io/part-of": "diskpipe"}}, Data: map[string][]byte{Field: key}}
		if err = c.Create(ctx, sec); apierrors.IsAlreadyExists(err) { // another replica made it
			err = c.Get(ctx, name, sec)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%s, %s: %w", what, name, err)
	}
	if len(sec.Data[Field]) < 16 {
		return nil, fmt.Errorf("%s: the Secret %s holds no key in %q (16 bytes at least)", what, name, Field)
	}
	return sec, nil
}
