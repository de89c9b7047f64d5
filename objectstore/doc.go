// Package objectstore is both sides of diskpipe's S3: the bundled store users upload images
// to and download exports from, and the client the importer, exporter and upload proxy use to
// reach it or any other S3-compatible store.
//
// The bundled store is the package gateway (objectstore/gateway), which only its command,
// cmd/objectstore, imports: versitygw and its dependencies (fiber, the AWS SDK, LDAP and Vault
// clients) stay out of every other binary. This package holds what both sides agree on (the
// reserved names, reserved.go; the health path) and the client.
//
// The client (client.go) is minio-go. External stores — AWS S3, Ceph RGW, SeaweedFS, a
// user's MinIO — go through the same code, with path-style or virtual-host-style requests,
// a region, a custom CA and credentials from a Secret: that is how users outgrow the bundled
// store.
package objectstore
