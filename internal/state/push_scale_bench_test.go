package state

import (
	"fmt"
	"testing"

	"github.com/google/uuid"
)

// BenchmarkStatePushScale measures the state machine alone pushing 100
// messages to partitions spread over the queue, as `make bench-scale`'s
// push phase does, over a queue of 100 partitions and one of 1,000,000
// (each prefilled with one message per partition). QUEEN_BENCH_CPUPROFILE
// profiles the measured loop.
func BenchmarkStatePushScale(b *testing.B) {
	for _, parts := range []int{100, 1_000_000} {
		b.Run(fmt.Sprintf("partitions=%d", parts), func(b *testing.B) {
			h := newHarness(b)
			prefillScale(h, parts, 1)
			stop := benchProfile(b)
			defer stop()
			w0 := h.s.WriteStats()
			b.ResetTimer()
			cpu0 := cpuTime()
			for i := 0; i < b.N; i++ {
				c := &Push{Tenant: "default", Items: make([]PushItem, 100)}
				for j := range c.Items {
					c.Items[j] = PushItem{Queue: "q", Partition: fmt.Sprintf("p%07d", (i*100+j*7919)%parts), TxID: uuid.NewString(), Generated: true, Payload: []byte(`{"k":2}`)}
				}
				h.now += 1000
				h.apply(c)
			}
			n := b.N * 100
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/msg")
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(n), "cpu-ns/msg")
			reportWrites(b, w0, h.s.WriteStats(), n)
		})
	}
}

// reportWrites reports what Pebble wrote per message between w0 and w1:
// the applied batches, the flushes and the compactions (tables and blob
// files), and the compactions run.
func reportWrites(b *testing.B, w0, w1 WriteStats, n int) {
	per := func(v uint64) float64 { return float64(v) / float64(n) }
	b.ReportMetric(per(w1.BatchBytes-w0.BatchBytes), "batch-B/msg")
	b.ReportMetric(per(w1.FlushedTableBytes+w1.FlushedBlobBytes-w0.FlushedTableBytes-w0.FlushedBlobBytes), "flush-B/msg")
	b.ReportMetric(per(w1.CompactedTableBytes+w1.CompactedBlobBytes-w0.CompactedTableBytes-w0.CompactedBlobBytes), "compact-B/msg")
	b.ReportMetric(float64(w1.Compactions-w0.Compactions), "compactions")
}
