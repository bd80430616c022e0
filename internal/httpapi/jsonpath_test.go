package httpapi

import (
	"strings"
	"testing"
)

// TestJSONPathAt names values at byte offsets, keys and nesting included.
func TestJSONPathAt(t *testing.T) {
	doc := `{"items":[{"queue":"q","payload":{"a":[1,"xy"]}},{"queue":5}],"n":null}`
	for _, tc := range []struct {
		at    string // the value ends at the end of its first occurrence
		path  string
		inKey bool
	}{
		{`"q"`, "items[0].queue", false},
		{`"xy"`, "items[0].payload.a[1]", false},
		{`5`, "items[1].queue", false},
		{`null`, "n", false},
		{`"payload"`, "items[0]", true},
	} {
		off := strings.Index(doc, tc.at) + len(tc.at)
		path, inKey, ok := jsonPathAt([]byte(doc), off)
		if !ok || path != tc.path || inKey != tc.inKey {
			t.Errorf("at %s: %q %v %v, want %q %v", tc.at, path, inKey, ok, tc.path, tc.inKey)
		}
	}
	if _, _, ok := jsonPathAt([]byte(`{"a":[1,}`), 8); ok {
		t.Errorf("invalid JSON named a path")
	}
}

func FuzzCheckBodyUTF8(f *testing.F) {
	for _, s := range []string{"{\"items\":[{\"partition\":\"p\xff\"}]}", "{\"k\xfe\":1}", "[\"\xc3\"", "\xff", `{"a":"b"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if e := checkBodyUTF8(b); e != nil && (statusOf(e) != 400 || !strings.Contains(e.Message, "UTF-8")) {
			t.Fatalf("bad error %+v", e)
		}
	})
}
