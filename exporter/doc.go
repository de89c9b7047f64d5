// Package exporter is the data plane of an export: it turns a PVC's disk into a qcow2 (or raw)
// image and streams it into an S3 multipart upload, with no scratch file and no second copy.
// It is what an exporter pod runs (cmd/exporter, flags in Main).
//
// # Two passes, one stream
//
// A qcow2 header at offset 0 points to tables that describe where every cluster lies, yet the
// object is uploaded front to back and its sha256 computed as it goes. So the exporter reads
// the disk twice. The plan pass (planPass) finds the non-zero clusters — holes are skipped
// with SEEK_DATA/SEEK_HOLE, allocated zeros found by scanning — and, when compressing, each
// cluster's compressed size. From the plan, layout (qcow2.go) places everything: header, L1
// table, refcount table and blocks, L2 tables, then the data clusters in guest order. The
// emit pass (emitPass) writes the metadata, then reads and compresses the clusters again on
// several workers and writes their bytes in order. The second read mostly comes from the page
// cache; the price of compressing twice buys a stream that never needs to seek back.
//
// A cluster that differs between the passes means the disk is being written: the export fails
// rather than upload an image inconsistent with its own tables. The controller exports disks
// in use from a VolumeSnapshot.
//
// # Compatibility
//
// Images are qcow2 version 3 with 64 KiB clusters and 16-bit refcounts, checked with
// qemu-img check. Deflate-compressed clusters use a 4 KiB window, because qemu inflates them
// with one; zstd clusters set the compression-type header field. A virtual size that is not a
// whole number of 512-byte sectors is rounded up, as qemu-img convert does.
//
// # Upload
//
// MultipartSink (upload.go) cuts the stream into parts and uploads several at once, so memory
// holds a few parts whatever the disk's size. Part sizes grow with the disk to stay within
// S3's part limit. A failed export aborts its upload; an upload a crashed export left behind
// is aborted by the next attempt at the same object. The object carries its format as
// metadata and its sha256 as the tag diskpipe-sha256.
package exporter
