//go:build cgo

package importer

/*
#cgo LDFLAGS: -l:libdeflate.a
#include <libdeflate.h>
*/
import "C"

import (
	"sync"
	"unsafe"
)

// inflater names the deflate decoder compressed qcow2 clusters go through: libdeflate (Debian's
// libdeflate-dev, linked statically), which decodes a whole buffer at once about three times
// as fast as a streaming Go decoder. Builds without cgo use klauspost's (inflate_go.go).
const inflater = "libdeflate"

// libdeflate decompressors hold no state between calls; a free list keeps one per worker.
var (
	decompressorsMu sync.Mutex
	decompressors   []*C.struct_libdeflate_decompressor
)

// inflateInto decodes the raw deflate stream in (trailing bytes after its final block are
// ignored) into out and returns the decoded length; ok is false when the stream is not one
// libdeflate decodes into out whole (corrupt, or longer than out), and the caller falls back
// to the streaming decoder, which reports such streams as qemu does.
func inflateInto(in, out []byte) (n int, ok bool) {
	if len(in) == 0 || len(out) == 0 {
		return 0, false
	}
	decompressorsMu.Lock()
	var d *C.struct_libdeflate_decompressor
	if k := len(decompressors); k > 0 {
		d, decompressors = decompressors[k-1], decompressors[:k-1]
	}
	decompressorsMu.Unlock()
	if d == nil {
		if d = C.libdeflate_alloc_decompressor(); d == nil {
			return 0, false
		}
	}
	var got C.size_t
	res := C.libdeflate_deflate_decompress(d, unsafe.Pointer(&in[0]), C.size_t(len(in)),
		unsafe.Pointer(&out[0]), C.size_t(len(out)), &got)
	decompressorsMu.Lock()
	decompressors = append(decompressors, d)
	decompressorsMu.Unlock()
	return int(got), res == C.LIBDEFLATE_SUCCESS
}
