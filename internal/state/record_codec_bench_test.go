package state

import (
	"encoding/json"
	"testing"
)

// popCursor is the cursor a pop of n messages from one partition leaves.
func popCursor(n int) *cursorRec {
	c := &cursorRec{Epoch: 1, Cursor: 1_000_000, LeaseExpires: 1_800_000_000_000_000, LeaseID: [16]byte{1}}
	for o := uint64(1_000_000); o < 1_000_000+uint64(n); o++ {
		c.Ex = append(c.Ex, exception{Off: o, Attempt: 1})
		c.LeaseOffs = append(c.LeaseOffs, o)
	}
	return c
}

// BenchmarkRecordCodec: the cursor and subscription records a pop and an
// ack write, in the old encodings and the new (bytes as a metric).
func BenchmarkRecordCodec(b *testing.B) {
	for _, n := range []int{1, 31, 500} {
		c := popCursor(n)
		b.Run("cursor-v1/"+itoa(n), func(b *testing.B) {
			var out []byte
			for i := 0; i < b.N; i++ {
				out = appendCursorV1To(out[:0], c)
			}
			b.ReportMetric(float64(len(out)), "bytes")
		})
		b.Run("cursor-v2/"+itoa(n), func(b *testing.B) {
			var out []byte
			for i := 0; i < b.N; i++ {
				out = c.appendTo(out[:0])
			}
			b.ReportMetric(float64(len(out)), "bytes")
		})
		v1, v2 := appendCursorV1(c), c.encode()
		b.Run("decode-v1/"+itoa(n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if _, err := decodeCursor(v1); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("decode-v2/"+itoa(n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				if _, err := decodeCursor(v2); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	s := &subRec{ID: 7, Group: "pgsink-orders", CreatedAt: 1_800_000_000_000_000, Epoch: 1, Rule: StartAll,
		Pending: 123_456, Consumed: 9_876_543, ScanPos: 1234}
	b.Run("sub-json", func(b *testing.B) {
		var out []byte
		for i := 0; i < b.N; i++ {
			out, _ = json.Marshal(s)
		}
		b.ReportMetric(float64(len(out)), "bytes")
	})
	b.Run("sub-binary", func(b *testing.B) {
		var out []byte
		for i := 0; i < b.N; i++ {
			out = s.appendTo(out[:0])
		}
		b.ReportMetric(float64(len(out)), "bytes")
	})
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}
