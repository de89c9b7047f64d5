// Package authz asks the apiserver what a user may do: the one SubjectAccessReview the
// webhooks and the upload token API make on a user's behalf.
package authz

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Allowed reviews whether user (as the apiserver authenticated them: name, groups, UID and
// extras) may do what attrs say.
func Allowed(ctx context.Context, c client.Client, user authenticationv1.UserInfo, attrs authorizationv1.ResourceAttributes) (bool, error) {
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range user.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: user.Username, Groups: user.Groups, UID: user.UID, Extra: extra, ResourceAttributes: &attrs}}
	if err := c.Create(ctx, sar); err != nil {
		return false, fmt.Errorf("reviewing access: %w", err)
	}
	return sar.Status.Allowed, nil
}
