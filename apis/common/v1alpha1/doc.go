// Package v1alpha1 holds the types that diskpipe's three API groups share: image sources
// (HTTP, S3-compatible object stores, container registries, PVCs, uploads), checksums,
// clone strategies and the status every golden image and disk reports.
//
// It is not an API group of its own: the types appear only embedded in the kinds of
// hypercloud.tmaxanc.com, virtualmachine.kubesphere.io and diskvolume.kubesphere.io, so one
// validation rule (a checksum's format, a bucket name) reads and fails the same way in each.
//
// The group name below only gives the API reference (docs/api.md, crd-ref-docs) a section
// for these types; no kind is served in it.
//
// +kubebuilder:object:generate=true
// +groupName=shared.diskpipe.io
package v1alpha1
