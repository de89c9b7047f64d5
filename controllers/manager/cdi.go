package manager

import (
	"context"
	"fmt"

	storagev1 "k8s.io/api/storage/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/diskpipe/diskpipe/controllers/admission"
	"github.com/diskpipe/diskpipe/controllers/cdi"
	"github.com/diskpipe/diskpipe/uploadproxy"
	"github.com/diskpipe/diskpipe/uploadproxy/cdiupload"
)

// extensions are what a compatibility layer gives the engine at its named extension points
// (docs/architecture.md); the zero value gives nothing.
type extensions struct {
	// snapshotClassNamed names the class of the snapshots of a storage class's volumes
	// (storage.SnapshotClasses.Named).
	snapshotClassNamed func(context.Context, *storagev1.StorageClass) (*string, string, error)
	// tokenGroups are further request groups of the upload token API (TokenAPI.Groups).
	tokenGroups []func(*uploadproxy.TokenAPI) uploadproxy.RequestGroup
}

// wireCDI is the whole of CDI's API served by diskpipe (opts.CDICompatibility), wired into
// mgr: the importer's options CDI's CDIConfig overrides (made before the engine's controllers
// read them), the certificate's CDI APIService and mutating webhook, CDI's controllers and
// PVC hook, and the extensions it gives the engine. Off, it does nothing.
func wireCDI(mgr ctrl.Manager, opts *Options, keeper *admission.CertKeeper) (extensions, error) {
	if !opts.CDICompatibility {
		return extensions{}, nil
	}
	// A CDI user's CDIConfig spec.filesystemOverhead sizes every volume, before the chart's
	// values, and its spec.importProxy carries every import, before the chart's importer.proxy.
	opts.Importer.FilesystemOverhead = opts.Importer.FilesystemOverhead.Under(cdi.SpecOverhead(mgr.GetClient()))
	opts.Importer.ProxyFirst = cdi.SpecProxy(mgr.GetClient(), mgr.GetAPIReader(), opts.Namespace)
	ext := extensions{
		// A CDI user's StorageProfile spec.snapshotClass names the class of every snapshot
		// diskpipe takes of that storage class's volumes, as CDI's snapshot clones take it.
		snapshotClassNamed: cdi.ProfileSnapshotClass(mgr.GetClient()),
	}
	o := cdi.Options{FilesystemOverhead: opts.Importer.FilesystemOverhead, Strategies: opts.CloneStrategies}
	if w := opts.Webhook; w != nil {
		o.UploadProxyURL = w.UploadProxyURL
		cdi.RegisterProfileHook(mgr, o.FilesystemOverhead)
		if w.UploadTokenSecret.Name != "" {
			ext.tokenGroups = append(ext.tokenGroups, cdiupload.Tokens)
		}
	}
	if keeper != nil {
		keeper.Mutating = append(keeper.Mutating, cdi.ProfileHookName)
		if opts.Webhook.UploadTokenSecret.Name != "" {
			keeper.APIServices = append(keeper.APIServices, uploadproxy.APIServiceName(cdiupload.GroupVersion))
		}
	}
	if err := cdi.Setup(mgr, o); err != nil {
		return ext, fmt.Errorf("setting up the DataVolume controller: %w", err)
	}
	return ext, nil
}
