//go:build cgo

package importer

/*
#cgo LDFLAGS: -l:liblzma.a -lpthread
#include <lzma.h>
#include <stdlib.h>

// unxz_new makes a threaded .xz decoder: concatenated streams, every integrity check verified.
// It stops with an error rather than exceed memlimit_stop, and runs one thread where more would
// exceed memlimit_threading (a large preset's blocks).
static lzma_ret unxz_new(lzma_stream **out, uint32_t threads, uint64_t threading, uint64_t stop) {
	lzma_stream *s = calloc(1, sizeof(lzma_stream));
	if (s == NULL) return LZMA_MEM_ERROR;
	lzma_mt mt = {0};
	mt.flags = LZMA_CONCATENATED | LZMA_FAIL_FAST;
	mt.threads = threads;
	mt.memlimit_threading = threading;
	mt.memlimit_stop = stop;
	lzma_ret ret = lzma_stream_decoder_mt(s, &mt);
	if (ret != LZMA_OK) {
		free(s);
		return ret;
	}
	*out = s;
	return LZMA_OK;
}

static lzma_ret unxz_code(lzma_stream *s, uint8_t *in, size_t in_len, size_t *in_used,
		uint8_t *out, size_t out_len, size_t *out_used, int finish) {
	s->next_in = in;
	s->avail_in = in_len;
	s->next_out = out;
	s->avail_out = out_len;
	lzma_ret ret = lzma_code(s, finish ? LZMA_FINISH : LZMA_RUN);
	*in_used = in_len - s->avail_in;
	*out_used = out_len - s->avail_out;
	return ret;
}

static void unxz_free(lzma_stream *s) {
	lzma_end(s);
	free(s);
}
*/
import "C"

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"unsafe"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// xzDecoder names the .xz decoder: liblzma (Debian's liblzma-dev, linked statically), which
// decodes the blocks of a stream written by a threaded xz (`xz -T`, the default since xz 5.4)
// on several threads and a single block about seven times as fast as a pure Go decoder does.
// Builds without cgo use ulikunitz/xz (unxz_go.go).
const xzDecoder = "liblzma"

const (
	// xzThreads is the most threads one decoder runs; the importer's CPU limit (GOMAXPROCS)
	// bounds it first.
	xzThreads = 4
	// xzThreadingMemory is what the decoder's threads may hold together (each holds its
	// dictionary and its block's input, about four dictionaries: 33 MiB with xz's default
	// preset); past it the decoder runs fewer threads, down to one that buffers nothing (a
	// -9 stream, or blocks whose headers claim huge sizes). It keeps the importer within
	// the bound docs/security.md gives. xzStopMemory is what that one thread may need (the
	// guard has refused dictionaries over maxXzDict already).
	xzThreadingMemory = 128 << 20
	xzStopMemory      = 2*maxXzDict + 16<<20
	// xzBuffer is the size of the decoder's input and output buffers, in C memory.
	xzBuffer = 1 << 20
)

// unxz decodes the .xz stream r (every stream of a concatenation, each block's check verified)
// through liblzma.
type unxz struct {
	r       io.Reader
	s       *C.lzma_stream
	in, out []byte // views of C memory
	inBuf   unsafe.Pointer
	outBuf  unsafe.Pointer
	pending []byte // decoded bytes of out not yet returned
	inHead  int    // the start of the input not yet decoded
	inLen   int
	eof     bool // r has ended
	err     error
	cleanup runtime.Cleanup // frees the C side of a decoder nobody closed
}

// unxzC is the C side of a decoder.
type unxzC struct {
	s       *C.lzma_stream
	in, out unsafe.Pointer
}

func (c unxzC) free() {
	if c.s != nil {
		C.unxz_free(c.s)
	}
	C.free(c.in)
	C.free(c.out)
}

func newUnxz(r io.Reader) (io.ReadCloser, error) {
	threads := min(runtime.GOMAXPROCS(0), xzThreads)
	var s *C.lzma_stream
	//nolint:gocritic // the "identical operands" are in the pointer check cgo writes around &s
	ret := C.unxz_new(&s, C.uint32_t(threads), C.uint64_t(xzThreadingMemory), C.uint64_t(xzStopMemory))
	if ret != C.LZMA_OK {
		return nil, xzError(ret)
	}
	c := unxzC{s: s, in: C.malloc(xzBuffer), out: C.malloc(xzBuffer)}
	if c.in == nil || c.out == nil {
		c.free()
		return nil, errors.New("no memory for the xz decoder's buffers")
	}
	u := &unxz{r: r, s: s, inBuf: c.in, outBuf: c.out}
	u.cleanup = runtime.AddCleanup(u, unxzC.free, c)
	u.in = unsafe.Slice((*byte)(u.inBuf), xzBuffer)
	u.out = unsafe.Slice((*byte)(u.outBuf), xzBuffer)
	return u, nil
}

func (u *unxz) Read(p []byte) (int, error) {
	for len(u.pending) == 0 {
		if u.err != nil {
			return 0, u.err
		}
		u.step()
	}
	n := copy(p, u.pending)
	u.pending = u.pending[n:]
	return n, nil
}

// step reads input when the decoder has used what it had, then decodes once into out.
func (u *unxz) step() {
	if u.s == nil {
		u.err = errors.New("read of a closed xz decoder")
		return
	}
	if u.inHead == u.inLen && !u.eof {
		n, err := u.r.Read(u.in)
		u.inHead, u.inLen = 0, n
		switch {
		case errors.Is(err, io.EOF):
			u.eof = true
		case err != nil:
			u.err = err
			return
		case n == 0:
			return
		}
	}
	var inUsed, outUsed C.size_t
	finish := C.int(0)
	if u.eof {
		finish = 1
	}
	var in *C.uint8_t
	if u.inLen > u.inHead {
		in = (*C.uint8_t)(unsafe.Add(u.inBuf, u.inHead))
	}
	ret := C.unxz_code(u.s, in, C.size_t(u.inLen-u.inHead), &inUsed, (*C.uint8_t)(u.outBuf), xzBuffer, &outUsed, finish)
	u.inHead += int(inUsed)
	u.pending = u.out[:outUsed]
	switch {
	case ret == C.LZMA_STREAM_END:
		u.err = io.EOF // returned once pending is read
	case ret == C.LZMA_OK:
		// Threads still decoding (or input needed): the loop calls again.
	case ret == C.LZMA_BUF_ERROR && u.eof:
		u.err = transfer.Permanent(transfer.ReasonMalformedImage, "the xz stream is truncated: it ends inside a block or before its index: %w", io.ErrUnexpectedEOF)
	default:
		u.err = xzError(ret)
	}
}

// xzError names what liblzma refused.
func xzError(ret C.lzma_ret) error {
	switch ret {
	case C.LZMA_FORMAT_ERROR:
		return transfer.Permanent(transfer.ReasonMalformedImage, "not an xz stream (no .xz header where one begins)")
	case C.LZMA_OPTIONS_ERROR:
		return transfer.Permanent(transfer.ReasonMalformedImage, "the xz stream uses a filter or option liblzma does not decode")
	case C.LZMA_DATA_ERROR:
		return transfer.Permanent(transfer.ReasonMalformedImage, "the xz stream is corrupt (bad compressed data, header or index)")
	case C.LZMA_BUF_ERROR:
		return transfer.Permanent(transfer.ReasonMalformedImage, "the xz stream is corrupt: the decoder could make no progress")
	case C.LZMA_MEMLIMIT_ERROR:
		return transfer.Permanent(transfer.ReasonMalformedImage, "the xz stream needs more than the %d MiB diskpipe gives its decoder: recompress it with a smaller dictionary", xzStopMemory>>20)
	case C.LZMA_MEM_ERROR:
		return errors.New("no memory for the xz decoder")
	case C.LZMA_UNSUPPORTED_CHECK:
		return transfer.Permanent(transfer.ReasonMalformedImage, "the xz stream's integrity check is of a kind liblzma does not know")
	}
	return fmt.Errorf("liblzma failed (lzma_ret %d)", int(ret))
}

func (u *unxz) Close() error {
	if u.s == nil {
		return nil
	}
	u.cleanup.Stop()
	unxzC{s: u.s, in: u.inBuf, out: u.outBuf}.free()
	u.s, u.inBuf, u.outBuf, u.in, u.out, u.pending = nil, nil, nil, nil, nil, nil
	return nil
}
