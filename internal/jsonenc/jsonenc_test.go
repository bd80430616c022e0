package jsonenc

import (
	"encoding/json"
	"testing"
	"unicode/utf8"
)

func TestAppendString(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", `""`},
		{"plain", `"plain"`},
		{"a\"b\\c", `"a\"b\\c"`},
		{"\n\r\t\x01", `"\n\r\t\u0001"`},
		{"é€😀", `"é€😀"`},
		{"p\xff", `"p\ufffd"`},
		{"\u2028\u2029", `"\u2028\u2029"`},
	} {
		for _, got := range []string{string(AppendString(nil, c.in)), string(AppendString(nil, []byte(c.in)))} {
			if got != c.want {
				t.Errorf("AppendString(%q) = %s, want %s", c.in, got, c.want)
			}
			var back string
			if err := json.Unmarshal([]byte(got), &back); err != nil {
				t.Errorf("AppendString(%q) = %s: not JSON: %v", c.in, got, err)
			}
			if utf8.ValidString(c.in) && back != c.in {
				t.Errorf("AppendString(%q) reads back as %q", c.in, back)
			}
		}
	}
}

func FuzzAppendString(f *testing.F) {
	f.Add("a\"\\\x00\xff\u2028")
	f.Fuzz(func(t *testing.T, s string) {
		out := AppendString(nil, s)
		var back string
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("%q encodes to %s, not JSON: %v", s, out, err)
		}
		if utf8.ValidString(s) && back != s {
			t.Fatalf("%q reads back as %q", s, back)
		}
	})
}
