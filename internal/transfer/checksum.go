package transfer

import (
	"crypto/md5"  //nolint:gosec // md5 is offered for checksums users publish, not for security
	"crypto/sha1" //nolint:gosec // likewise
	"crypto/sha256"
	"crypto/sha512"
	"encoding"
	"encoding/hex"
	"fmt"
	"hash"
	"strings"
)

// Checksum is an expected digest and the hash that computes it: the importer verifies the
// bytes it reads, the upload proxy the bytes it stores.
type Checksum struct {
	algorithm string
	// Want is the expected hex digest; empty when none was given.
	Want string
	// Hash is written the bytes to check.
	Hash hash.Hash
}

var hashes = map[string]func() hash.Hash{
	"sha256": sha256.New, "sha512": sha512.New, "sha1": sha1.New, "md5": md5.New,
}

// ParseChecksum reads "<algorithm>:<hex>"; empty means no checksum, and sha256 is computed
// anyway so the result always names the digest of what was imported.
func ParseChecksum(spec string) (*Checksum, error) {
	if spec == "" {
		return &Checksum{algorithm: "sha256", Hash: sha256.New()}, nil
	}
	alg, want, ok := strings.Cut(spec, ":")
	newHash, known := hashes[alg]
	if !ok || !known {
		return nil, Permanent(ReasonInvalidArgument, "checksum %q must be <algorithm>:<hex> with sha256, sha512, sha1 or md5", spec)
	}
	h := newHash()
	if b, err := hex.DecodeString(want); err != nil || len(b) != h.Size() {
		return nil, Permanent(ReasonInvalidArgument, "checksum %q: %s takes %d hex digits", spec, alg, 2*h.Size())
	}
	return &Checksum{algorithm: alg, Want: strings.ToLower(want), Hash: h}, nil
}

// Digest is "<algorithm>:<hex>" of what was hashed.
func (c *Checksum) Digest() string { return c.algorithm + ":" + hex.EncodeToString(c.Hash.Sum(nil)) }

// Verify compares the digest with the expected one.
func (c *Checksum) Verify() error {
	if c.Want == "" {
		return nil
	}
	if got := hex.EncodeToString(c.Hash.Sum(nil)); got != c.Want {
		return Permanent(ReasonChecksumMismatch, "checksum mismatch: the source's %s is %s, the spec expects %s", c.algorithm, got, c.Want)
	}
	return nil
}

// State is the hash's state after the bytes written so far (Go's hashes marshal it), so that
// hashing can go on in another process: the upload proxy keeps it with a resumable upload.
func (c *Checksum) State() ([]byte, error) {
	m, ok := c.Hash.(encoding.BinaryMarshaler)
	if !ok {
		return nil, fmt.Errorf("the %s hash cannot save its state", c.algorithm)
	}
	return m.MarshalBinary()
}

// Restore continues from a State.
func (c *Checksum) Restore(state []byte) error {
	u, ok := c.Hash.(encoding.BinaryUnmarshaler)
	if !ok {
		return fmt.Errorf("the %s hash cannot restore its state", c.algorithm)
	}
	return u.UnmarshalBinary(state)
}
