package importer

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"strings"

	"github.com/opencontainers/go-digest"
	"go.podman.io/image/v5/docker"
	"go.podman.io/image/v5/docker/reference"
	"go.podman.io/image/v5/manifest"
	"go.podman.io/image/v5/pkg/blobinfocache/none"
	"go.podman.io/image/v5/types"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// A container disk can be required to carry a cosign signature by a given key (cosign's
// key-based signing: `cosign sign --key cosign.key registry/repo:tag`). cosign stores the
// signature beside the image, as the image <repository>:sha256-<hex of its digest>.sig,
// whose layers are "simple signing" payloads (JSON naming the signed digest), each with its
// signature in the annotation dev.cosignproject.cosign/signature. The importer resolves the
// reference to a digest, requires a payload for that digest whose signature the key verifies,
// and then reads the image by that digest only, so the tag cannot move in between. Nothing is
// written before.
const (
	cosignSignatureAnnotation = "dev.cosignproject.cosign/signature"
	cosignPayloadType         = "cosign container image signature"
	maxSignaturePayload       = 1 << 20
)

// cosignPayload is what of a simple-signing payload is checked.
type cosignPayload struct {
	Critical struct {
		Image struct {
			Digest string `json:"docker-manifest-digest"`
		} `json:"image"`
		Type string `json:"type"`
	} `json:"critical"`
}

// parsePublicKey reads a PEM public key: ECDSA (cosign's default), Ed25519 or RSA.
func parsePublicKey(b []byte) (crypto.PublicKey, error) {
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "the signature's public key is not PEM")
	}
	key, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "the signature's public key: %w", err)
	}
	switch key.(type) {
	case *ecdsa.PublicKey, ed25519.PublicKey, *rsa.PublicKey:
		return key, nil
	}
	return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "the signature's public key is a %T: ECDSA, Ed25519 or RSA are verified", key)
}

// verifySignedBy reports whether sig is key's signature of payload (SHA-256, as cosign signs).
func verifySignedBy(key crypto.PublicKey, payload, sig []byte) bool {
	sum := sha256.Sum256(payload)
	switch k := key.(type) {
	case *ecdsa.PublicKey:
		return ecdsa.VerifyASN1(k, sum[:], sig)
	case ed25519.PublicKey:
		return ed25519.Verify(k, payload, sig)
	case *rsa.PublicKey:
		return rsa.VerifyPKCS1v15(k, crypto.SHA256, sum[:], sig) == nil || rsa.VerifyPSS(k, crypto.SHA256, sum[:], sig, nil) == nil
	}
	return false
}

// verified resolves ref to its manifest digest, checks the digest's signature by key, and
// returns a reference to the image by that digest.
func verified(ctx context.Context, sys *types.SystemContext, ref types.ImageReference, key crypto.PublicKey, url string) (types.ImageReference, error) {
	named := ref.DockerReference()
	if named == nil {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "%s: signatures are verified for docker:// images only", url)
	}
	dgst, err := manifestDigest(ctx, sys, ref, url)
	if err != nil {
		return nil, err
	}
	repo := reference.TrimNamed(named)
	sigTag, err := reference.WithTag(repo, strings.Replace(dgst.String(), ":", "-", 1)+".sig")
	if err != nil {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "%s: %w", url, err)
	}
	payloads, err := signatures(ctx, sys, sigTag, url)
	if err != nil {
		return nil, err
	}
	if len(payloads) == 0 {
		return nil, transfer.Permanent(transfer.ReasonUnsigned, "%s (%s) has no cosign signature (%s): sign it with 'cosign sign --key'", url, dgst, reference.FamiliarString(sigTag))
	}
	var other []string
	for _, p := range payloads {
		if !verifySignedBy(key, p.payload, p.sig) {
			continue
		}
		var pl cosignPayload
		if err := json.Unmarshal(p.payload, &pl); err != nil || pl.Critical.Type != cosignPayloadType {
			continue
		}
		if pl.Critical.Image.Digest == dgst.String() {
			byDigest, err := reference.WithDigest(repo, dgst)
			if err != nil {
				return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "%s: %w", url, err)
			}
			return docker.NewReference(byDigest)
		}
		other = append(other, pl.Critical.Image.Digest)
	}
	if len(other) > 0 {
		return nil, transfer.Permanent(transfer.ReasonSignedDigestMismatch, "%s is %s, but the key's signature stored for it signs %s: the image was changed after it was signed",
			url, dgst, strings.Join(other, ", "))
	}
	return nil, transfer.Permanent(transfer.ReasonSignatureInvalid, "%s (%s) has %d cosign signatures, none by the given key", url, dgst, len(payloads))
}

// manifestDigest resolves ref (a tag) to the digest of its manifest, or of its manifest list
// for a multi-architecture image.
func manifestDigest(ctx context.Context, sys *types.SystemContext, ref types.ImageReference, url string) (digest.Digest, error) {
	src, err := ref.NewImageSource(ctx, sys)
	if err != nil {
		return "", registryError(err, url)
	}
	raw, _, err := src.GetManifest(ctx, nil)
	src.Close()
	if err != nil {
		return "", registryError(err, url)
	}
	dgst, err := manifest.Digest(raw)
	if err != nil {
		return "", transfer.Permanent(transfer.ReasonMalformedImage, "%s: the manifest: %w", url, err)
	}
	return dgst, nil
}

type signedPayload struct{ payload, sig []byte }

// signatures reads the payloads and signatures of cosign's signature image; none when it does
// not exist.
func signatures(ctx context.Context, sys *types.SystemContext, sigTag reference.Named, url string) ([]signedPayload, error) {
	ref, err := docker.NewReference(sigTag)
	if err != nil {
		return nil, transfer.Permanent(transfer.ReasonInvalidArgument, "%s: %w", url, err)
	}
	notFound := func(err error) ([]signedPayload, error) {
		if err = registryError(err, url); transfer.ReasonOf(err) == transfer.ReasonSourceNotFound {
			return nil, nil // no signature image
		}
		return nil, err
	}
	src, err := ref.NewImageSource(ctx, sys)
	if err != nil {
		return notFound(err)
	}
	defer src.Close()
	raw, mime, err := src.GetManifest(ctx, nil)
	if err != nil {
		return notFound(err)
	}
	m, err := manifest.FromBlob(raw, manifest.NormalizedMIMEType(mime))
	if err != nil {
		return nil, transfer.Permanent(transfer.ReasonSignatureInvalid, "%s: the signature image's manifest: %w", url, err)
	}
	var out []signedPayload
	for _, l := range m.LayerInfos() {
		sig, err := base64.StdEncoding.DecodeString(l.Annotations[cosignSignatureAnnotation])
		if err != nil || len(sig) == 0 || l.Size > maxSignaturePayload {
			continue
		}
		payload, err := readBlob(ctx, src, l.BlobInfo)
		if err != nil {
			return nil, err
		}
		out = append(out, signedPayload{payload: payload, sig: sig})
	}
	return out, nil
}

// readBlob reads a small blob whole and checks its digest.
func readBlob(ctx context.Context, src types.ImageSource, info types.BlobInfo) ([]byte, error) {
	r, _, err := src.GetBlob(ctx, info, none.NoCache)
	if err != nil {
		return nil, registryError(err, info.Digest.String())
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, maxSignaturePayload+1))
	if err != nil {
		return nil, classifyNetError(fmt.Errorf("signature payload %s: %w", info.Digest, err), "registry")
	}
	if digest.FromBytes(b) != info.Digest || len(b) > maxSignaturePayload {
		return nil, transfer.Permanent(transfer.ReasonSignatureInvalid, "signature payload %s does not match its digest", info.Digest)
	}
	return b, nil
}
