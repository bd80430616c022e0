package seal

import (
	"bytes"
	"strings"
	"testing"
)

const key = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"

func TestSealOpen(t *testing.T) {
	s, err := New(key)
	if err != nil {
		t.Fatal(err)
	}
	plain := []byte(`{"secret":"hunter2"}`)
	a, _ := s.Seal(plain)
	b, _ := s.Seal(plain)
	if bytes.Equal(a, b) {
		t.Fatal("two seals of one value are equal: nonce reuse")
	}
	if bytes.Contains(a, []byte("hunter2")) {
		t.Fatal("sealed value contains the plaintext")
	}
	got, err := s.Open(a)
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("open = %q, %v", got, err)
	}
	a[len(a)-1] ^= 1
	if _, err := s.Open(a); err == nil {
		t.Fatal("tampered value opened")
	}
	other, _ := New(strings.Repeat("ab", 32))
	if _, err := other.Open(b); err == nil {
		t.Fatal("opened with the wrong key")
	}
	var none *Sealer
	if _, err := none.Open(b); err != ErrNoKey {
		t.Fatalf("nil sealer: %v", err)
	}
}

func TestBadKeys(t *testing.T) {
	for _, k := range []string{"abc", strings.Repeat("z", 64), strings.Repeat("a", 62)} {
		if _, err := New(k); err == nil {
			t.Errorf("key %q accepted", k)
		}
	}
	if s, err := New(""); s != nil || err != nil {
		t.Fatal("empty key must mean no encryption")
	}
}
