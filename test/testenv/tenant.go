package testenv

import (
	"context"
	"fmt"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// tenantRoles are what the built-in `edit` role holds once Kubernetes has aggregated it
// (envtest runs no controller that aggregates roles): Kubernetes' own parts of it and
// diskpipe's user role (the chart's RBAC, ApplyChartRBAC, must be applied).
var tenantRoles = []string{"system:aggregate-to-edit", "system:aggregate-to-view", ChartRelease + "-user"}

// Tenant returns a client acting as user name, who may do in namespace ns what `edit` allows
// there and nothing anywhere else: a namespace's owner, or a hostile tenant in the tests of
// the boundary between namespaces.
func (e *Env) Tenant(ctx context.Context, ns, name string) (client.Client, error) {
	for _, role := range tenantRoles {
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name + "-" + role, Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: name}}}
		if err := e.Client.Create(ctx, rb); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("binding %s to %s in %s: %w", role, name, ns, err)
		}
	}
	return e.User(name)
}
