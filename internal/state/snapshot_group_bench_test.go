package state

import (
	"fmt"
	"strconv"
	"testing"
)

// BenchmarkSnapshotGrouped is BenchmarkSnapshotRows with several bundles
// applied per ApplyBatch (one Pebble batch), and with a memtable small
// enough that such a batch passes Pebble's large-batch threshold (half the
// memtable), which queues it as its own flushable instead of copying it
// into the memtable. It asks whether grouping a snapshot's bundles pays.
// Run: go test ./internal/state -run '^$' -bench BenchmarkSnapshotGrouped -benchtime 600x
func BenchmarkSnapshotGrouped(b *testing.B) {
	payload := []byte(`{"op":"c","table":"public.b","key":{"id":1},"after":{"id":1,"name":"c4ca4238a0b923820dcc509a6f75849bc4ca4238a0b923820dcc509a6f75849bc4ca4238a0b923820dcc509a6f75849b","n":1},"before":null,"lsn":"0/1","xid":1,"ts":"2026-10-03T06:15:03.000000Z","seq":0}`)
	const batch = 1000
	for _, tc := range []struct {
		group int
		mem   int64
	}{{1, 64 << 20}, {8, 64 << 20}, {8, 8 << 20}, {32, 64 << 20}, {32, 16 << 20}} {
		b.Run(fmt.Sprintf("group=%d/mem=%dMiB", tc.group, tc.mem>>20), func(b *testing.B) {
			dir := b.TempDir()
			s, err := Open(dir, Options{MemTableBytes: tc.mem})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			h := &harness{t: b, dir: dir, s: s, now: 1_700_000_000_000_000}
			h.push("b", "p0", `0`)
			n := 0
			b.ResetTimer()
			cpu0 := cpuTime()
			for i := 0; i < b.N; i += tc.group {
				var les []LogEntry
				for g := 0; g < tc.group && i+g < b.N; g++ {
					c := &Push{Tenant: "default", Items: make([]PushItem, batch)}
					for j := range c.Items {
						c.Items[j] = PushItem{Queue: "b", Partition: strconv.Itoa(n), TxID: fmt.Sprintf("pg:00000001:%016X:%d", i+g, j), Payload: payload}
						n++
					}
					h.index++
					data, err := EncodeEntry(&Entry{Time: h.now, Cmds: []Command{c}})
					if err != nil {
						b.Fatal(err)
					}
					les = append(les, LogEntry{Index: h.index, Data: data})
					h.now += 1000
				}
				if _, err := s.ApplyBatch(les); err != nil {
					b.Fatal(err)
				}
			}
			w := flushAndReport(b, s, cpu0, n)
			b.ReportMetric(float64(w.Flushes), "flushes")
			b.ReportMetric(float64(w.Compactions), "compactions")
		})
	}
}
