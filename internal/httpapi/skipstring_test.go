package httpapi

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// skipStringBytewise is skipString as it was, one byte at a time: the
// reference the eight-byte scan must agree with.
func skipStringBytewise(b []byte, pos int) (int, bool) {
	pos++
	for pos < len(b) {
		c := b[pos]
		switch {
		case c == '"':
			return pos + 1, true
		case c < 0x20:
			return pos, false
		case c == '\\':
			pos++
			if pos >= len(b) {
				return pos, false
			}
			switch b[pos] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				pos++
			case 'u':
				if len(b)-pos < 5 {
					return pos, false
				}
				for _, h := range b[pos+1 : pos+5] {
					if !isHex(h) {
						return pos, false
					}
				}
				pos += 5
			default:
				return pos, false
			}
		default:
			pos++
		}
	}
	return pos, false
}

// TestSkipStringMatchesBytewise: on random strings, with quotes,
// backslashes, escapes, control characters and non-ASCII bytes at every
// offset from a word boundary, skipString accepts and refuses exactly what
// the byte-at-a-time scan did, and stops where it stopped when it accepts.
func TestSkipStringMatchesBytewise(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	pieces := []string{`a`, `Z`, ` `, `~`, `"`, `\`, `\"`, `\\`, `\n`, `\u00e9`, `\u12`, `\x`, "\x00", "\x1f", "\x7f", "\xc3\xa9", "\xff", `}`}
	for trial := 0; trial < 20000; trial++ {
		var sb strings.Builder
		sb.WriteByte('"')
		for n := r.IntN(40); n > 0; n-- {
			if r.IntN(4) == 0 {
				sb.WriteString(pieces[r.IntN(len(pieces))])
			} else {
				sb.WriteString(strings.Repeat("x", r.IntN(12)))
			}
		}
		if r.IntN(3) != 0 {
			sb.WriteString(`","next":1`)
		}
		b := []byte(sb.String())
		wantPos, wantOK := skipStringBytewise(b, 0)
		s := &scan{b: b}
		gotOK := s.skipString()
		if gotOK != wantOK || (wantOK && s.pos != wantPos) {
			t.Fatalf("trial %d: skipString(%q) = %v at %d, the byte-wise scan %v at %d", trial, b, gotOK, s.pos, wantOK, wantPos)
		}
	}
}

// BenchmarkSkipString1KiB: a payload string of 1 KiB, as the bench's push
// bodies carry.
func BenchmarkSkipString1KiB(b *testing.B) {
	body := []byte(`"` + strings.Repeat("abcdefghijklmnopqrstuvwxyz012345", 32) + `"`)
	b.SetBytes(int64(len(body)))
	for i := 0; i < b.N; i++ {
		s := &scan{b: body}
		if !s.skipString() || s.pos != len(body) {
			b.Fatal("not skipped")
		}
	}
}
