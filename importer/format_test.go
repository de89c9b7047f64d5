package importer

import (
	"bytes"
	"testing"
)

// TestSniff tells formats and compressions by their magic bytes; an ISO 9660 image is
// imported as raw.
func TestSniff(t *testing.T) {
	iso := make([]byte, sniffLen)
	copy(iso[0x8001:], "CD001")
	vdi := make([]byte, 0x200)
	copy(vdi[0x40:], []byte{0x7f, 0x10, 0xda, 0xbe})
	for _, c := range []struct {
		name   string
		head   []byte
		format Format
		comp   Compression
	}{
		{"qcow2", []byte("QFI\xfb\x00\x00\x00\x03"), FormatQcow2, CompressionNone},
		{"vmdk", []byte("KDMV\x01\x00\x00\x00"), FormatVMDK, CompressionNone},
		{"vmdk descriptor", []byte("# Disk DescriptorFile\nversion=1"), FormatVMDK, CompressionNone},
		{"vhdx", []byte("vhdxfile"), FormatVHDX, CompressionNone},
		{"vpc", []byte("conectix"), FormatVPC, CompressionNone},
		{"vdi", vdi, FormatVDI, CompressionNone},
		{"iso", iso, FormatISO, CompressionNone},
		{"gzip", []byte{0x1f, 0x8b, 8}, FormatRaw, CompressionGzip},
		{"xz", []byte{0xfd, '7', 'z', 'X', 'Z', 0}, FormatRaw, CompressionXz},
		{"zstd", []byte{0x28, 0xb5, 0x2f, 0xfd}, FormatRaw, CompressionZstd},
		{"raw", bytes.Repeat([]byte{0xeb, 0x63, 0x90}, 200), FormatRaw, CompressionNone},
		{"empty", nil, FormatRaw, CompressionNone},
	} {
		if f, comp := sniffFormat(c.head), sniffCompression(c.head); (f != c.format && comp == CompressionNone) || comp != c.comp {
			t.Errorf("%s: format %s compression %q, want %s %q", c.name, f, comp, c.format, c.comp)
		}
	}
}
