package pgsource

import (
	"encoding/json"
	"testing"
)

// FuzzDecodeChange: any bytes as a pgoutput row change either fail to
// decode or encode into valid JSON events; nothing panics.
func FuzzDecodeChange(f *testing.F) {
	f.Add(insertMsg(16385, tx("3"), tx(`{"a": 1}`), tx("new"), tx("1.5"), tx("2026-10-03 06:15:03+00")))
	f.Add(updateMsg(16385, 'K', []col{tx("2"), null, null, null, null}, tx("3"), unchanged, tx("x"), tx("1"), null))
	f.Add(deleteMsg(16385, 'O', tx("3"), tx("{}"), tx("x"), tx("NaN"), tx("infinity")))
	f.Fuzz(func(t *testing.T, msg []byte) {
		if len(msg) == 0 {
			return
		}
		rel, err := newRelation(16385, "public.orders", "orders",
			[]string{"id", "customer", "status", "total", "created_at"},
			[]uint32{oidInt8, 1007, 25, oidNumeric, oidTimestamptz}, []string{"id"}, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		var c change
		if c.decode(msg) != nil {
			return
		}
		var e encoder
		var b batch
		tr := &txn{epoch: "00000001", commit: 1}
		txnMeta(&tr.meta, 1, 1, []byte(`"2026-10-03T06:15:03.000000Z"`))
		if cols := e.encodeChange(&b, rel, &c, tr, 0, nil, false); cols != nil {
			e.encodeChange(&b, rel, &c, tr, 0, nil, true)
		}
		items, _ := b.pushItems()
		for _, it := range items {
			if !json.Valid(it.Payload) {
				t.Fatalf("invalid JSON %q from %q", it.Payload, msg)
			}
		}
	})
}
