package connector

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzParseDocument: any body is refused with a coded error or accepted,
// never a panic; and an accepted document, shown as a read shows it and
// sent back, is accepted again unchanged (a read can be written back).
func FuzzParseDocument(f *testing.F) {
	for _, d := range []map[string]any{sourceDoc(), sinkDoc()} {
		b, _ := json.Marshal(d)
		f.Add(b)
	}
	f.Add([]byte(`{"kind":"sink","connection":{"url":"postgres://u:p@h:1/d?sslmode=verify-full"},"sink":{"queue":"q","table":"a.b","mode":"sql","statement":"x","params":["$.a[0].b","@offset"]}}`))
	f.Add([]byte(`{"kind":"source","connection":{"host":"h","database":"d","user":"u"},"source":{"tables":[{"table":"a.b","queue":"q","partitionBy":["x","y"]}],"onTruncate":"emit"}}`))
	f.Add([]byte(`{"kind":"sink","connection":{"host":"h","database":"d","user":"u","port":1e3},"sink":{"queue":"q","table":"a.b","mode":"append","metadata":{"offset":"o"}}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		in, err := ParseDocument("tenant-x", "c", body)
		if err != nil {
			return
		}
		view := in.Doc
		view.Connection.PasswordSet = in.Password != nil && *in.Password != ""
		b, err := json.Marshal(view)
		if err != nil {
			t.Fatalf("encode an accepted document: %v", err)
		}
		again, err := ParseDocument("tenant-x", "c", b)
		if err != nil {
			t.Fatalf("a read written back is refused: %v\nread: %s", err, b)
		}
		again.Doc.Connection.PasswordSet = view.Connection.PasswordSet
		b2, _ := json.Marshal(again.Doc)
		if !bytes.Equal(b, b2) {
			t.Fatalf("a read written back changed:\n%s\n%s", b, b2)
		}
	})
}
