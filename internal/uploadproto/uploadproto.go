// Package uploadproto is what the upload proxy and its clients (kubectl diskpipe, the console)
// agree on: the headers of the resumable protocol and the resources uploads are for. It
// imports nothing, so that a client links none of the proxy.
package uploadproto

// Headers of the resumable protocol.
const (
	HeaderOffset   = "Upload-Offset"
	HeaderComplete = "Upload-Complete"
)

// Resources are the images' resources by kind.
var Resources = map[string]string{"VirtualMachineImage": "virtualmachineimages", "ImageTemplate": "imagetemplates"}
