// Package uploadproto is what the upload proxy and its clients (kubectl diskpipe, the console)
// agree on: the headers of the resumable protocol and the resources uploads are for. It
// imports nothing, so that a client links none of the proxy.
package uploadproto

// Headers of the resumable protocol.
const (
	HeaderOffset   = "Upload-Offset"
	HeaderComplete = "Upload-Complete"
	// HeaderPartSize is the proxy's part size: a request that stops before the upload's end
	// stops at a multiple of it.
	HeaderPartSize = "Upload-Part-Size"
	// HeaderLength, on a HEAD, is the upload's size, once a request has said it.
	HeaderLength = "Upload-Length"
	// HeaderDigest, on the request that sends the last byte, is the client's digest of the
	// whole upload ("sha256:<hex>", or the algorithm of the image's checksum): the proxy
	// completes the upload only if its own digest of what it stored is the same.
	HeaderDigest = "Upload-Digest"
)

// Resources are the images' resources by kind.
var Resources = map[string]string{"VirtualMachineImage": "virtualmachineimages", "ImageTemplate": "imagetemplates"}
