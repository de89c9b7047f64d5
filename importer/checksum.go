package importer

import (
	"crypto/md5"  //nolint:gosec // md5 is offered for checksums users publish, not for security
	"crypto/sha1" //nolint:gosec // likewise
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"hash"
	"strings"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// checksum is an expected digest and the hash that computes it.
type checksum struct {
	algorithm string
	want      string
	h         hash.Hash
}

var hashes = map[string]func() hash.Hash{
	"sha256": sha256.New, "sha512": sha512.New, "sha1": sha1.New, "md5": md5.New,
}

// parseChecksum reads "<algorithm>:<hex>"; empty means no checksum, and sha256 is computed
// anyway so the result always names the digest of what was imported.
func parseChecksum(spec string) (*checksum, error) {
	if spec == "" {
		return &checksum{algorithm: "sha256", h: sha256.New()}, nil
	}
	alg, want, ok := strings.Cut(spec, ":")
	newHash, known := hashes[alg]
	if !ok || !known {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "checksum %q must be <algorithm>:<hex> with sha256, sha512, sha1 or md5", spec)
	}
	h := newHash()
	if b, err := hex.DecodeString(want); err != nil || len(b) != h.Size() {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "checksum %q: %s takes %d hex digits", spec, alg, 2*h.Size())
	}
	return &checksum{algorithm: alg, want: strings.ToLower(want), h: h}, nil
}

// digest is "<algorithm>:<hex>" of what was hashed.
func (c *checksum) digest() string { return c.algorithm + ":" + hex.EncodeToString(c.h.Sum(nil)) }

// verify compares the digest with the expected one.
func (c *checksum) verify() error {
	if c.want == "" {
		return nil
	}
	if got := hex.EncodeToString(c.h.Sum(nil)); got != c.want {
		return transfer.Permanent(transfer.ReasonChecksumMismatch, "checksum mismatch: the source's %s is %s, the spec expects %s", c.algorithm, got, c.want)
	}
	return nil
}
