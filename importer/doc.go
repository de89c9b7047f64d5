// Package importer is the data plane of an import: it copies a disk image from a source into
// a volume, and is what an importer pod runs (cmd/importer, flags in Main).
//
// # No scratch space
//
// CDI downloads a qcow2 image to a scratch volume and converts it from there. diskpipe does
// not: random access comes from the source itself. An HTTP server that honours Range, or any
// S3 store, is read through a block cache (cache.go) that turns the qcow2 reader's small
// cluster reads into 2 MiB ranged requests, several in flight, with read-ahead; only the
// clusters the image has allocated are fetched, and memory stays at the cache's 96 MiB however
// large the image. go-qcow2reader's convert package walks the image and writes its non-zero
// data to the target. A raw image (or ISO) from such a source, and every copy of a disk between
// volumes, runs on the copy engine (copy.go): its data in 1 MiB chunks, each fetched by one
// ranged request, eight in flight, and written as it comes; the holes a clone source or a local
// disk lists are skipped unread.
//
// Streams that cannot be read at random — a server without Range, a gzip, xz or zstd
// wrapper — are imported front to back: raw images (and ISOs) stream straight to the target;
// a qcow2 behind such a stream is refused with ReasonNeedsRandomAccess, because converting it
// would need the scratch copy diskpipe does not keep.
//
// # Nothing half-done
//
// Every request is retried with backoff on transient failures (resets, 5xx, timeouts, a
// response that stalls), and resumes at the first byte it lacks (reader.go). Permanent
// failures (404, 403, TLS, checksum, format) end the import at once and leave the target
// empty — the file removed, the device zeroed — so a half-written disk never looks valid; on
// success it is flushed to stable storage first.
//
// # Resuming in another pod
//
// Every 256 MiB of disk the importer flushes and records a checkpoint beside the disk
// (checkpoint.go). A pod that is killed, evicted or fails transiently leaves the disk and the
// checkpoint; the next pod goes on from there when the source is the same and unchanged,
// and starts over otherwise.
//
// # Checksums
//
// A stream is hashed as it arrives. A qcow2 read at random is hashed by a second reader that
// walks the whole file in order through the same block cache, so the bytes the converter
// needs are mostly fetched once.
//
// # Sparse output
//
// Zeros are never written: disk.img on a filesystem volume gets holes, a block device is
// zeroed up front with BLKZEROOUT (plain zero writes only where the device lacks it) and then
// receives only non-zero data.
package importer
