// Package objectstore is both sides of diskpipe's S3: the bundled store users upload images
// to and download exports from, and the client the importer, exporter and upload proxy use to
// reach it or any other S3-compatible store.
//
// The bundled store (server.go) is versitygw embedded as a library through its embedgw
// package, with its POSIX backend on a directory (a PVC in the cluster): objects are plain
// files, their metadata extended attributes. It runs as its own command, cmd/objectstore,
// for two reasons: versitygw's dependencies (fiber, the AWS SDK, LDAP and Vault clients) stay
// out of the manager's binary, and its POSIX backend changes the process's working directory
// to the data directory, which nothing else in a process should have to live with.
//
// Every namespace shares it, so what one client may hold of it is bounded: by the front
// (front.go), diskpipe's own HTTP server on the store's port, before versitygw on a loopback
// port (connections, timeouts, body rates), and in the backend (quota.go: bytes, buckets and
// files per account; reserved.go: names only diskpipe may take).
//
// The client (client.go) is minio-go. External stores — AWS S3, Ceph RGW, SeaweedFS, a
// user's MinIO — go through the same code, with path-style or virtual-host-style requests,
// a region, a custom CA and credentials from a Secret: that is how users outgrow the bundled
// store.
package objectstore
