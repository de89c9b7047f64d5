package cdi

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"

	"k8s.io/utils/ptr"
	cdiv1 "kubevirt.io/containerized-data-importer-api/pkg/apis/core/v1beta1"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
	hypercloud "github.com/diskpipe/diskpipe/apis/hypercloud/v1alpha1"
)

// A DataVolume with an http, s3, registry or pvc source is imported by diskpipe's image engine:
// a VirtualMachineImage of the DataVolume's namespace, controlled by it, imports the source
// (with its probes, retries, checksums, egress rules and progress), and the DataVolume's
// DiskVolume is cloned from it by the class's clone strategy. Once the disk is whole the image
// is deleted: it was the DataVolume's staging copy, not a golden image anyone else uses.

// SourceImage names the VirtualMachineImage that stages DataVolume name's source: at most 200
// characters, as every image's name here.
func SourceImage(name string) string {
	n := "dv-" + name
	if len(n) <= 200 {
		return n
	}
	sum := sha256.Sum256([]byte(name))
	return n[:180] + "-" + hex.EncodeToString(sum[:])[:10]
}

// imageSource is the VirtualMachineImage source that imports src, or nil for a source that
// is not imported (blank, a snapshot of the DataVolume's namespace); a registry among insecure (the CDIConfig's
// insecureRegistries) is reached over plain HTTP, or TLS unverified.
func imageSource(src *cdiv1.DataVolumeSource, ns string, insecure []string) (*hypercloud.VirtualMachineImageSource, error) {
	switch {
	case src.HTTP != nil:
		h := src.HTTP
		o := &common.HTTPOptions{SecretRef: common.LocalName(h.SecretRef), CertConfigMap: common.LocalName(h.CertConfigMap),
			ExtraHeaders: h.ExtraHeaders, InsecureSkipTLSVerify: ptr.Deref(h.InsecureSkipVerify, false)}
		for _, s := range h.SecretExtraHeaders {
			o.SecretExtraHeaders = append(o.SecretExtraHeaders, common.LocalName(s))
		}
		// The checksum is the image's: the importer verifies it as the bytes stream, and the
		// image's validation refuses one that is not "<algorithm>:<hex digest>".
		return &hypercloud.VirtualMachineImageSource{HTTP: common.HTTPURL(h.URL), HTTPOptions: o, Checksum: common.Checksum(h.Checksum)}, nil
	case src.S3 != nil:
		s3, err := s3Source(src.S3)
		if err != nil {
			return nil, err
		}
		return &hypercloud.VirtualMachineImageSource{S3: s3}, nil
	case src.Registry != nil:
		r := src.Registry
		if r.URL == nil {
			return nil, invalid("spec.source.registry.url is required: diskpipe pulls from a registry, not from an OpenShift image stream")
		}
		reg := &common.RegistrySource{URL: *r.URL, SecretRef: common.LocalName(ptr.Deref(r.SecretRef, "")),
			CertConfigMap: common.LocalName(ptr.Deref(r.CertConfigMap, ""))}
		if r.Platform != nil {
			reg.Architecture = r.Platform.Architecture
		}
		if ptr.Deref(r.PullMethod, cdiv1.RegistryPullPod) == cdiv1.RegistryPullNode {
			// The node pulls it, with its own mirrors, CAs and credentials (secretRef too).
			reg.PullMethod, reg.CertConfigMap, reg.Architecture = common.PullMethodNode, "", ""
			return &hypercloud.VirtualMachineImageSource{Registry: reg}, nil
		}
		reg.InsecureSkipTLSVerify = insecureRegistry(*r.URL, insecure)
		return &hypercloud.VirtualMachineImageSource{Registry: reg}, nil
	case src.Upload != nil:
		// virtctl image-upload: the upload proxy's CDI API takes the bytes for this image.
		return &hypercloud.VirtualMachineImageSource{Upload: &common.UploadSource{}}, nil
	case src.PVC != nil:
		// A PVC of another namespace: admission checked CDI's rule for the DataVolume's user
		// (controllers/admission, checkClone).
		p := &common.PVCSource{Name: common.LocalName(src.PVC.Name)}
		if src.PVC.Namespace != ns {
			p.Namespace = src.PVC.Namespace
		}
		return &hypercloud.VirtualMachineImageSource{PVC: p}, nil
	case src.Snapshot != nil && src.Snapshot.Namespace != "" && src.Snapshot.Namespace != ns:
		// A snapshot of another namespace is restored there for the copy (a volume is restored
		// only in its snapshot's namespace); admission checked CDI's rule as for a PVC. One of
		// the DataVolume's own namespace is restored by its DiskVolume, with nothing staged.
		return &hypercloud.VirtualMachineImageSource{Snapshot: &common.VolumeSnapshotSource{
			Name: common.LocalName(src.Snapshot.Name), Namespace: src.Snapshot.Namespace}}, nil
	}
	return nil, nil
}

// s3Source reads CDI's S3 URL: "s3://bucket/key" for AWS, or "https://endpoint/bucket/key"
// (path style) for any other store.
func s3Source(s *cdiv1.DataVolumeSourceS3) (*common.S3Source, error) {
	u, err := url.Parse(s.URL)
	if err != nil {
		return nil, invalid(fmt.Sprintf("spec.source.s3.url %q is not a URL: %v", s.URL, err))
	}
	out := &common.S3Source{SecretRef: common.LocalName(s.SecretRef), CertConfigMap: common.LocalName(s.CertConfigMap)}
	path := strings.TrimPrefix(u.Path, "/")
	switch u.Scheme {
	case "s3":
		out.Endpoint, out.BucketLookup = "https://s3.amazonaws.com", common.BucketLookupAuto
		out.BucketName, out.ObjectName = common.BucketName(u.Host), common.ObjectName(path)
	case "http", "https":
		bucket, key, _ := strings.Cut(path, "/")
		out.Endpoint, out.BucketLookup = common.HTTPURL(u.Scheme+"://"+u.Host), common.BucketLookupPath
		out.BucketName, out.ObjectName = common.BucketName(bucket), common.ObjectName(key)
	default:
		return nil, invalid(fmt.Sprintf("spec.source.s3.url %q must be s3://bucket/key or http(s)://endpoint/bucket/key", s.URL))
	}
	if out.BucketName == "" || out.ObjectName == "" {
		return nil, invalid(fmt.Sprintf("spec.source.s3.url %q names no bucket and key: s3://bucket/key or http(s)://endpoint/bucket/key", s.URL))
	}
	return out, nil
}

// insecureRegistry says whether the registry of ref (docker://host[:port]/repository:tag, or
// oci-archive...) is one of insecure, as CDI matches them: by host and port.
func insecureRegistry(ref string, insecure []string) bool {
	_, rest, ok := strings.Cut(ref, "://")
	if !ok {
		return false
	}
	host, _, _ := strings.Cut(rest, "/")
	for _, h := range insecure {
		if strings.EqualFold(strings.TrimSpace(h), host) {
			return true
		}
	}
	return false
}
