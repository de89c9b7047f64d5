//go:build !cgo

package importer

import (
	"io"

	"github.com/ulikunitz/xz"
)

// xzDecoder names the .xz decoder: ulikunitz/xz, one thread; builds with cgo use liblzma
// (unxz_liblzma.go), several times as fast.
const xzDecoder = "go"

func newUnxz(r io.Reader) (io.ReadCloser, error) {
	x, err := xz.NewReader(r)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(x), nil
}
