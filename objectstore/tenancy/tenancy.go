// Package tenancy ties the bundled object store's accounts to the cluster's namespaces: a
// namespace is known to the store by its UID, so a namespace made again under a name that was
// used before is a new tenant, and the accounts of namespaces that are gone stop working.
package tenancy

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/diskpipe/diskpipe/objectstore"
	"github.com/diskpipe/diskpipe/objectstore/uploads"
)

// UIDs answers namespaces' UIDs from r, which should read the apiserver rather than a cache:
// a cache that has not seen a namespace deleted and made again would name the old one.
func UIDs(r client.Reader) objectstore.NamespaceUIDs {
	return func(ctx context.Context, ns string) (string, error) {
		obj := &metav1.PartialObjectMetadata{}
		obj.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
		// A namespace being deleted is still itself: its finalizers (an export's) clean up
		// with its account, which the sweep removes once the namespace is gone.
		if err := r.Get(ctx, client.ObjectKey{Name: ns}, obj); err != nil {
			return "", err
		}
		return string(obj.UID), nil
	}
}

// Live lists the namespaces that exist, UID → name.
func Live(ctx context.Context, r client.Reader) (map[string]string, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("NamespaceList"))
	if err := r.List(ctx, list); err != nil {
		return nil, fmt.Errorf("listing namespaces: %w", err)
	}
	live := make(map[string]string, len(list.Items))
	for _, ns := range list.Items {
		live[string(ns.UID)] = ns.Name
	}
	return live, nil
}

// SweepEvery is how often Sweeper settles the store's accounts.
const SweepEvery = 10 * time.Minute

// Sweeper is the manager's runnable (on the leader) that settles the store's accounts with the
// namespaces that exist, at start and every SweepEvery (objectstore.Client.SweepTenants), and
// gives namespaces whose account moved their new keys in the Secret diskpipe wrote for them.
// It also removes the uploads of images that are gone (uploads.Sweep), so that no namespace
// carries, or inherits under a reused name, bytes nobody owns.
type Sweeper struct {
	Store  *objectstore.Client
	Reader client.Reader
	// Keys rewrites a namespace's keys Secret after its account moved (nil: nothing to do).
	Keys func(ctx context.Context, ns string) error
	// Every is how often to sweep; 0: SweepEvery.
	Every time.Duration

	// renew are the namespaces whose keys Secret is still to be written again.
	renew map[string]bool
}

// NeedLeaderElection is true: only the leader edits the store's accounts.
func (s *Sweeper) NeedLeaderElection() bool { return true }

// Start sweeps until ctx ends; a failed sweep is logged and tried again at the next.
func (s *Sweeper) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("tenancy")
	every := s.Every
	if every == 0 {
		every = SweepEvery
	}
	for {
		if err := s.Sweep(ctx); err != nil {
			log.Error(err, "settling the object store's accounts with the namespaces")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(every):
		}
	}
}

// Sweep settles the accounts once.
func (s *Sweeper) Sweep(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("tenancy")
	done, err := s.Store.SweepTenants(ctx, func(ctx context.Context) (map[string]string, error) { return Live(ctx, s.Reader) })
	if s.renew == nil {
		s.renew = map[string]bool{}
	}
	for ns, access := range done.Moved {
		log.Info("moved a namespace's store account to the one keyed by its UID", "namespace", ns, "access", access)
		s.renew[ns] = true
	}
	for ns := range s.renew {
		if s.Keys == nil {
			break
		}
		if kerr := s.Keys(ctx, ns); kerr != nil {
			log.Error(kerr, "rewriting the namespace's store keys; trying again at the next sweep", "namespace", ns)
			continue
		}
		delete(s.renew, ns)
	}
	for bucket, why := range done.Stuck {
		log.Error(why, "a bucket could not be moved to its namespace's account; make its policy one diskpipe reads (JSON of the AWS form)", "bucket", bucket)
	}
	for access, buckets := range done.Disabled {
		log.Info("the namespace of a store account is gone: its keys no longer work; it keeps its buckets for an administrator to move or delete",
			"access", access, "buckets", buckets)
	}
	for _, access := range done.Removed {
		log.Info("removed the store account of a namespace that is gone", "access", access)
	}
	gone, uerr := uploads.Sweep(ctx, s.Store, s.Reader)
	for _, key := range gone {
		log.Info("removed the upload of an image that is gone", "key", key)
	}
	return errors.Join(err, uerr)
}
