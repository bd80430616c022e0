package pgsink

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
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

// TestStringStop checks stringStop against a byte-by-byte look: every byte
// value in every place of strings of up to 24 bytes, after a run of plain
// bytes with or without a byte above 0x7f among them.
func TestStringStop(t *testing.T) {
	for l := 0; l <= 24; l++ {
		for at := 0; at < l; at++ {
			for _, hiAt := range []int{-1, 0, at / 2, at - 1, at + 1} {
				for c := 0; c < 256; c++ {
					b := bytes.Repeat([]byte{'a'}, l)
					if hiAt >= 0 && hiAt < l {
						b[hiAt] = 0xc3
					}
					b[at] = byte(c)
					want, wantHi := len(b), false
					for j, x := range b {
						if x == '"' || x == '\\' || x < 0x20 {
							want = j
							break
						}
						wantHi = wantHi || x >= 0x80
					}
					if got, hi := stringStop(b, 0); got != want || hi != wantHi {
						t.Fatalf("%q: stop %d high %v, want %d %v", b, got, hi, want, wantHi)
					}
				}
			}
		}
	}
}

// TestFastRowOpUTF8: fastRowOp checks UTF-8 only inside strings (the rest
// of a message must be ASCII for its grammar); it takes no message that is
// not valid UTF-8, wherever the bad bytes are (keys, plain and escaped
// strings, nested values, between tokens), and still takes valid
// multi-byte text.
func TestFastRowOpUTF8(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	s := &sink{spec: connector.SinkSpec{Mode: "append"}}
	cols := []string{"id", "t", "j", "é"}
	p := &plan{writable: map[string]bool{}, copy: &copyPlan{conv: map[string]conv{}}}
	for _, c := range cols {
		p.writable[c], p.copy.conv[c] = true, convText
	}
	p.copy.conv["j"] = convJSONB
	base := []string{
		`{"id":1,"t":"héllo wörld, ünïcode ☃ 𝄞","é":"x"}`,
		`{"id":2,"t":"esc\"aped ☃ \\ \u00e9","j":{"a":["ü",1]}}`,
		`{"id":3, "t" : "plain ascii only" , "j":[1,"☃"]}`,
	}
	bad := [][]byte{{0xff}, {0x80}, {0xc3}, {0xe2, 0x98}, {0xed, 0xa0, 0x80}, {0xc0, 0xaf}}
	sc := &rowScratch{arena: make([]byte, 0, 1<<16)}
	for _, msg := range base {
		for _, scr := range []*rowScratch{nil, sc} {
			if _, ok := s.fastRowOp(p, &broker.Delivery{Payload: []byte(msg)}, scr); !ok {
				t.Fatalf("%s: not taken", msg)
			}
		}
	}
	for n := 0; n < 20_000; n++ {
		msg := []byte(base[r.IntN(len(base))])
		at := r.IntN(len(msg) + 1)
		b := bad[r.IntN(len(bad))]
		m := append(append(append([]byte{}, msg[:at]...), b...), msg[at:]...)
		if utf8.Valid(m) {
			continue
		}
		for _, scr := range []*rowScratch{nil, sc} {
			if o, ok := s.fastRowOp(p, &broker.Delivery{Payload: m}, scr); ok {
				t.Fatalf("%q (bad bytes at %d) taken: %q", m, at, o.copy)
			}
		}
	}
}
