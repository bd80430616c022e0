package state

import "testing"

// BenchmarkPopOneOfBatch is a long-polling consumer's cycle at a low rate:
// one message pushed, a pop that asks for 100 and gets it, its ack; each
// command its own batch, as when requests do not overlap. Its
// allocations per cycle are the figure to watch (-benchmem).
func BenchmarkPopOneOfBatch(b *testing.B) {
	h := newHarness(b)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := 0; i < b.N; i++ {
		h.push("q", "p", `{"k":"0123456789012345678901"}`)
		r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 100, Partitions: 1, LeaseSeconds: 300})
		if len(r.Messages) != 1 {
			b.Fatalf("cycle %d: popped %d messages, want 1", i, len(r.Messages))
		}
		off := r.Messages[0].Offset
		if a := h.ack(AckItem{PartitionID: r.Messages[0].PartitionID, Offset: &off, Status: AckCompleted, Group: "g", LeaseID: r.LeaseID}); !a.Items[0].Success {
			b.Fatalf("cycle %d: ack %+v", i, a.Items[0])
		}
	}
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/cycle")
}
