package pgsink

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"
)

// TestPlainStringMatchesCheckString checks plainString against checkString
// on random strings of quotes, backslashes, control characters, UTF-8 and
// plain bytes: where it says plainOK or plainBad, checkString agrees (and
// on the end), and plainEscaped comes only with a backslash in the body.
func TestPlainStringMatchesCheckString(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	alphabet := []byte{'a', 'Z', '0', ' ', '"', '\\', 'n', 'u', '\x00', '\x1f', '\t', 0x20, 0x7f, 0x80, 0xc3, 0xa9, 0xff}
	for n := 0; n < 200_000; n++ {
		b := []byte{'"'}
		for l := r.IntN(40); l > 0; l-- {
			b = append(b, alphabet[r.IntN(len(alphabet))])
		}
		if r.IntN(2) == 0 {
			b = append(b, '"')
		}
		end, st := plainString(b, 0)
		cend, cok := checkString(b, 0)
		switch st {
		case plainOK:
			if !cok || cend != end {
				t.Fatalf("%q: plainString ok at %d, checkString %v at %d", b, end, cok, cend)
			}
			if bytes.IndexByte(b[1:end-1], '\\') >= 0 {
				t.Fatalf("%q: plainOK with a backslash", b)
			}
		case plainBad:
			if cok {
				t.Fatalf("%q: plainString bad, checkString ok at %d", b, cend)
			}
		case plainEscaped:
			q := bytes.IndexByte(b[1:], '"')
			if q < 0 || bytes.IndexByte(b[1:1+q], '\\') < 0 {
				t.Fatalf("%q: plainEscaped without a backslash before the first quote", b)
			}
		}
	}
}

// TestHasControl checks hasControl against a byte-by-byte look at every
// byte value in every place of strings of up to 24 bytes.
func TestHasControl(t *testing.T) {
	for l := 0; l <= 24; l++ {
		for at := 0; at < l; at++ {
			for c := 0; c < 256; c++ {
				b := bytes.Repeat([]byte{0x20}, l)
				b[at] = byte(c)
				if got, want := hasControl(b), c < 0x20; got != want {
					t.Fatalf("len %d, byte %#x at %d: %v", l, c, at, got)
				}
			}
		}
	}
	if !hasControl([]byte("\xff\xff\xff\xff\xff\xff\xff\x00")) || hasControl([]byte("\xff\x80\x20\x7f\xc3\xa9 abcdef")) {
		t.Fatal("high bytes")
	}
}
