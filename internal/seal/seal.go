// Package seal carries a secret from a pod to the manager through a place that others read.
//
// A pod tells the manager its result in its termination message, and whoever may get pods in
// the namespace (the `view` role) reads that message. Most results are no secret; a download
// URL the pod signed with the user's keys is a bearer credential for the whole disk. So the
// manager hands the pod a public key (a flag, no secret), the pod seals the URL to it (an
// ephemeral X25519 key, HKDF-SHA256, AES-256-GCM), and only the manager, which holds the
// private key, opens it. The private key is derived from a key the manager already keeps (the
// one it marks its children with), so every replica and restart derives the same one and no
// Secret is added.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
)

// info binds every key this package derives to its use.
const info = "diskpipe seal v1"

// Key derives the manager's private key from secret (32 bytes or more of a key it keeps).
func Key(secret []byte) (*ecdh.PrivateKey, error) {
	if len(secret) < 16 {
		return nil, errors.New("seal: the secret is shorter than 16 bytes")
	}
	b, err := hkdf.Key(sha256.New, secret, nil, info+" private key", 32)
	if err != nil {
		return nil, err
	}
	return ecdh.X25519().NewPrivateKey(b)
}

// Public is the key a pod is given, as text for a flag.
func Public(k *ecdh.PrivateKey) string {
	return base64.RawURLEncoding.EncodeToString(k.PublicKey().Bytes())
}

// Seal seals plaintext to the public key pub (as Public wrote it), for the holder of its
// private key alone, bound to context: Open opens it only with the same context, so a sealed
// secret copied from one pod's result into another's (a tenant reads pods and may make some)
// is refused where the context differs (the object it was made for).
func Seal(pub string, plaintext, context []byte) (string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(pub)
	if err != nil {
		return "", fmt.Errorf("seal: the public key is not base64: %w", err)
	}
	to, err := ecdh.X25519().NewPublicKey(raw)
	if err != nil {
		return "", fmt.Errorf("seal: the public key: %w", err)
	}
	eph, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	shared, err := eph.ECDH(to)
	if err != nil {
		return "", err
	}
	aead, err := aeadOf(shared, eph.PublicKey().Bytes(), raw)
	if err != nil {
		return "", err
	}
	nonce := make([]byte, aead.NonceSize())
	_, _ = rand.Read(nonce)
	out := append(append(eph.PublicKey().Bytes(), nonce...), aead.Seal(nil, nonce, plaintext, context)...)
	return base64.RawURLEncoding.EncodeToString(out), nil
}

// Open opens what Seal sealed to k's public key with context.
func Open(k *ecdh.PrivateKey, sealed string, context []byte) ([]byte, error) {
	raw, err := base64.RawURLEncoding.DecodeString(sealed)
	if err != nil {
		return nil, fmt.Errorf("seal: not base64: %w", err)
	}
	const pubLen = 32
	if len(raw) < pubLen+12+16 {
		return nil, errors.New("seal: too short")
	}
	eph, err := ecdh.X25519().NewPublicKey(raw[:pubLen])
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	shared, err := k.ECDH(eph)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	aead, err := aeadOf(shared, raw[:pubLen], k.PublicKey().Bytes())
	if err != nil {
		return nil, err
	}
	nonce, box := raw[pubLen:pubLen+aead.NonceSize()], raw[pubLen+aead.NonceSize():]
	plain, err := aead.Open(nil, nonce, box, context)
	if err != nil {
		return nil, errors.New("seal: not sealed to this key for this context, or altered")
	}
	return plain, nil
}

// aeadOf is the cipher of one sealing: its key derived from the shared secret and both
// public keys.
func aeadOf(shared, ephPub, toPub []byte) (cipher.AEAD, error) {
	key, err := hkdf.Key(sha256.New, shared, append(append([]byte(nil), ephPub...), toPub...), info, 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}
