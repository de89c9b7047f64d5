package importer

import (
	"bytes"
	"encoding/binary"
)

// Format is a disk image format.
type Format string

// Formats diskpipe recognises.
const (
	FormatRaw   Format = "raw"
	FormatQcow2 Format = "qcow2"
	FormatVMDK  Format = "vmdk"
	FormatVHDX  Format = "vhdx"
	FormatVPC   Format = "vpc"
	FormatVDI   Format = "vdi"
	FormatISO   Format = "iso"
	// FormatOVA is an appliance: a tar archive holding an OVF descriptor, then its disks.
	FormatOVA Format = "ova"
)

// Compression is a stream compression wrapping an image.
type Compression string

// Compressions diskpipe unwraps while streaming.
const (
	CompressionNone Compression = ""
	CompressionGzip Compression = "gzip"
	CompressionXz   Compression = "xz"
	CompressionZstd Compression = "zstd"
)

// sniffLen is how many leading bytes detection wants (an ISO's volume descriptor is at
// 32 KiB); shorter input is judged on what there is.
const sniffLen = 0x8006

// sniffCompression tells a compressed stream by its magic bytes.
func sniffCompression(head []byte) Compression {
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		return CompressionGzip
	case bytes.HasPrefix(head, []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}):
		return CompressionXz
	case bytes.HasPrefix(head, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return CompressionZstd
	}
	return CompressionNone
}

// sniffFormat tells an image format by its magic bytes; anything else is raw.
func sniffFormat(head []byte) Format {
	switch {
	case bytes.HasPrefix(head, []byte("QFI\xfb")):
		return FormatQcow2
	case bytes.HasPrefix(head, []byte("KDMV")), bytes.HasPrefix(head, []byte("COWD")),
		bytes.HasPrefix(head, []byte("# Disk DescriptorFile")):
		return FormatVMDK
	case bytes.HasPrefix(head, []byte("vhdxfile")):
		return FormatVHDX
	case bytes.HasPrefix(head, []byte("conectix")):
		return FormatVPC
	case len(head) >= 0x44 && binary.LittleEndian.Uint32(head[0x40:]) == 0xbeda107f:
		return FormatVDI
	case len(head) >= 512 && bytes.Equal(head[257:262], []byte("ustar")):
		return FormatOVA // a tar archive: importOVA refuses one that holds no OVF descriptor first
	case len(head) >= 0x8006 && bytes.Equal(head[0x8001:0x8006], []byte("CD001")):
		return FormatISO
	}
	return FormatRaw
}
