package image

import (
	"fmt"
	"strings"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	"github.com/diskpipe/diskpipe/controllers/internal/importpod"
	"github.com/diskpipe/diskpipe/internal/contract"
)

// source is a golden image's source as importer arguments and the Secrets and ConfigMaps the
// pod mounts for them, all from the image's namespace. Sources that need the API to resolve
// (the bundled object store, copies of other volumes) are resolved at reconcile time.
type source struct {
	kind   string          // for status.sourceType
	imp    contract.Import // the importer's flags for the source
	mounts []importpod.Mount
	// objectStore is an object of the bundled store, read through a presigned URL; with
	// chain, the backup index whose point's layers are presigned too.
	objectStore *common.ObjectStoreSource
	chain       bool
	// copyOf is a PVC, image or disk whose disk is copied.
	copyOf *copyRef
	// upload names the image's resource for an upload source: the upload proxy stores the
	// image in the bundled store, and it is then read like an objectStore source.
	upload string
	// scratch gives the pod a writable /tmp (importpod.Spec.Scratch).
	scratch bool
	// nodePull is a container disk the node pulls for the import and the probe (a registry
	// source with pullMethod Node; its checks for revisions read the registry as imp says),
	// with pullSecret as an image pull secret.
	nodePull, pullSecret string
}

// copyRef names what a copy reads.
type copyRef struct {
	what            copyKind
	namespace, name string
}

type copyKind string

const (
	copyOfPVC      copyKind = "pvc"
	copyOfSnapshot copyKind = "snapshot"
	copyOfImage    copyKind = "clone"
	copyOfDisk     copyKind = "disk"
)

func copySource(what copyKind, ns, name string) source {
	return source{kind: string(what), copyOf: &copyRef{what: what, namespace: ns, name: name}}
}

const (
	authDir     = "/var/run/diskpipe/auth"
	caDir       = "/var/run/diskpipe/ca"
	keyDir      = "/var/run/diskpipe/signature"
	headersBase = "/var/run/diskpipe/headers"
	urlDir      = "/var/run/diskpipe/url"
)

func httpSource(url string, o *common.HTTPOptions) source {
	s := source{kind: "http", imp: contract.Import{Source: "http", URL: url}}
	if o == nil {
		return s
	}
	if o.SecretRef != "" {
		s.imp.AuthDir = authDir
		s.mounts = append(s.mounts, importpod.Mount{Secret: string(o.SecretRef), Path: authDir})
	}
	s.addCA(o.CertConfigMap)
	s.imp.Insecure, s.imp.Header, s.imp.UserAgent = o.InsecureSkipTLSVerify, o.ExtraHeaders, o.UserAgent
	for i, sec := range o.SecretExtraHeaders {
		dir := fmt.Sprintf("%s/%d", headersBase, i)
		s.mounts = append(s.mounts, importpod.Mount{Secret: string(sec), Path: dir})
		s.imp.HeaderFile = append(s.imp.HeaderFile, dir)
	}
	return s
}

func s3Source(s3 *common.S3Source) source {
	lookup := s3.BucketLookup
	if lookup == "" {
		lookup = common.BucketLookupAuto
	}
	s := source{kind: "s3", imp: contract.Import{Source: "s3", S3: contract.S3{Endpoint: string(s3.Endpoint), Region: s3.Region,
		BucketLookup: string(lookup), Bucket: string(s3.BucketName), Object: string(s3.ObjectName)}}}
	if s3.SecretRef != "" {
		s.imp.CredentialsDir = authDir
		s.mounts = append(s.mounts, importpod.Mount{Secret: string(s3.SecretRef), Path: authDir, Optional: true})
	}
	s.addCA(s3.CertConfigMap)
	return s
}

// chainSource restores a point of backups through their index (importer/chain.go): an s3 or
// http index is read by the importer, which reads the layers beside it; the bundled store's
// is read here, and each layer presigned for the pod (presign).
func chainSource(c *common.ChainSource) source {
	var s source
	switch {
	case c.S3 != nil:
		s = s3Source(c.S3)
		s.imp.ChainIndex = string(c.S3.ObjectName)
	case c.HTTP != nil:
		s = httpSource(string(c.HTTP.URL), &c.HTTP.HTTPOptions)
		s.imp.ChainIndex = string(c.HTTP.URL)
	default:
		s = source{objectStore: c.ObjectStore}
	}
	s.kind, s.chain, s.imp.ChainPoint = "chain", true, c.Point
	return s
}

func registrySource(r *common.RegistrySource) source {
	// The registry client reads CAs (the source's, the proxy's) from a directory it is given,
	// which the importer writes.
	s := source{kind: "registry", imp: contract.Import{Source: "registry", URL: r.URL, Architecture: r.Architecture, Disk: r.Disk, Insecure: r.InsecureSkipTLSVerify}, scratch: true}
	if r.SecretRef != "" {
		s.imp.AuthDir = authDir
		s.mounts = append(s.mounts, importpod.Mount{Secret: string(r.SecretRef), Path: authDir})
	}
	s.addCA(r.CertConfigMap)
	if r.Signature != nil {
		s.imp.RegistryPublicKeyFile = keyDir + "/cosign.pub"
		s.mounts = append(s.mounts, importpod.Mount{Secret: string(r.Signature.PublicKeySecretRef), Path: keyDir})
	}
	if r.PullMethod == common.PullMethodNode {
		s.nodePull, s.pullSecret = strings.TrimPrefix(r.URL, "docker://"), string(r.SecretRef)
	}
	return s
}

// pulledByNode turns s, the spec of an import or probe of g, into one that reads the container
// disk the node pulls (the kubelet resolves the reference as it resolves any image's).
func (g *goldenImage) pulledByNode(s *importpod.Spec) {
	if g.source.nodePull == "" || s.Import.Check {
		return
	}
	s.NodePull = g.source.nodePull
	if g.source.pullSecret != "" {
		s.PullSecrets = []string{g.source.pullSecret}
	}
	s.Import.Source, s.Import.Path, s.Import.URL, s.Import.AuthDir, s.Import.Architecture = "containerdisk", importpod.ContainerDiskDir, "", "", ""
}

func (s *source) addCA(cm common.LocalName) {
	if cm != "" {
		s.imp.CAFile = caDir
		s.mounts = append(s.mounts, importpod.Mount{ConfigMap: string(cm), Path: caDir})
	}
}
