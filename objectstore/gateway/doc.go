// Package gateway is the bundled store: versitygw embedded as a library through its embedgw
// package (server.go), with its POSIX backend on a directory (a PVC in the cluster): objects
// are plain files, their metadata extended attributes. It runs as its own command,
// cmd/objectstore, the only importer of this package, for two reasons: versitygw's
// dependencies (fiber, the AWS SDK, LDAP and Vault clients) stay out of the other binaries,
// and its POSIX backend changes the process's working directory to the data directory, which
// nothing else in a process should have to live with.
//
// Every namespace shares it, so what one client may hold of it is bounded: by the front
// (front.go), diskpipe's own HTTP server on the store's port, before versitygw on a loopback
// port (connections, timeouts, body rates), and in the backend (quota.go: bytes, buckets and
// files per account; reserved.go: names only diskpipe may take).
package gateway
