// Package seal owns encryption at rest: AES-256-GCM under the key given in
// QUEEN_ENCRYPTION_KEY (64 hex characters). The broker seals message payloads
// of encrypted queues before they enter the log, and connectors seal the
// database passwords they store.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// ErrNoKey is returned when sealed data must be opened on a node that has no
// key configured.
var ErrNoKey = errors.New("QUEEN_ENCRYPTION_KEY is not set on this node")

// version is the first byte of every sealed value.
const version = 1

// Sealer seals and opens values with one key.
type Sealer struct {
	aead cipher.AEAD
}

// New parses a 64-hex-character key. An empty key returns (nil, nil): no
// encryption is available.
func New(hexKey string) (*Sealer, error) {
	hexKey = strings.TrimSpace(hexKey)
	if hexKey == "" {
		return nil, nil
	}
	key, err := hex.DecodeString(hexKey)
	if err != nil || len(key) != 32 {
		return nil, fmt.Errorf("QUEEN_ENCRYPTION_KEY must be 64 hex characters (32 bytes; make one with `openssl rand -hex 32`), got %d characters", len(hexKey))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("encryption key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("encryption key: %w", err)
	}
	return &Sealer{aead: aead}, nil
}

// Seal encrypts plain; the result carries its version and nonce.
func (s *Sealer) Seal(plain []byte) ([]byte, error) {
	if s == nil {
		return nil, ErrNoKey
	}
	out := make([]byte, 1+s.aead.NonceSize(), 1+s.aead.NonceSize()+len(plain)+s.aead.Overhead())
	out[0] = version
	if _, err := rand.Read(out[1:]); err != nil {
		return nil, fmt.Errorf("seal: nonce: %w", err)
	}
	return s.aead.Seal(out, out[1:], plain, nil), nil
}

// Open decrypts a value made by Seal.
func (s *Sealer) Open(sealed []byte) ([]byte, error) {
	if s == nil {
		return nil, ErrNoKey
	}
	n := s.aead.NonceSize()
	if len(sealed) < 1+n+s.aead.Overhead() || sealed[0] != version {
		return nil, errors.New("open sealed value: not a sealed value of this version")
	}
	plain, err := s.aead.Open(nil, sealed[1:1+n], sealed[1+n:], nil)
	if err != nil {
		return nil, fmt.Errorf("open sealed value (wrong QUEEN_ENCRYPTION_KEY?): %w", err)
	}
	return plain, nil
}
