package state

import (
	"fmt"
	"testing"

	"github.com/google/uuid"
)

// BenchmarkStatePopAck measures the state machine alone (no raft, no
// HTTP) popping 100 messages and acknowledging them, over a queue of 100
// partitions, where a pop takes them from one partition, and over one of
// 1,000,000 holding one message each, where a pop takes one from each of
// 100 partitions. Run with -benchtime Nx (N ≤ 10000).
func BenchmarkStatePopAck(b *testing.B) {
	for _, parts := range []int{100, 1_000_000} {
		b.Run(fmt.Sprintf("partitions=%d", parts), func(b *testing.B) {
			if b.N*100 > 1_000_000 {
				b.Fatalf("at most 10000 iterations")
			}
			h := newHarness(b)
			per := 1
			if parts == 100 {
				per = b.N + 1
			}
			prefillScale(h, parts, per)
			stop := benchProfile(b)
			defer stop()
			b.ResetTimer()
			popAckLoop(b, h)
		})
	}
}

// prefillScale pushes per messages into each of parts partitions of queue
// q (named p0000000, p0000001, ...), in pushes of 10,000.
func prefillScale(h *harness, parts, per int) {
	const chunk = 10000
	p := &Push{Tenant: "default"}
	for i := 0; i < parts; i++ {
		for j := 0; j < per; j++ {
			p.Items = append(p.Items, PushItem{Queue: "q", Partition: fmt.Sprintf("p%07d", i), TxID: uuid.NewString(), Generated: true, Payload: []byte(`{"k":1}`)})
			if len(p.Items) == chunk {
				h.apply(p)
				p = &Push{Tenant: "default"}
			}
		}
	}
	if len(p.Items) > 0 {
		h.apply(p)
	}
}

// popAckLoop pops 100 partitions of queue q for group g and acks them, b.N
// times, and reports wall and CPU time per message; it returns the
// messages it moved.
func popAckLoop(b *testing.B, h *harness) int {
	b.Helper()
	cpu0 := cpuTime()
	n := 0
	for i := 0; i < b.N; i++ {
		r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 100, Partitions: 100, LeaseSeconds: 300})
		if len(r.Messages) == 0 {
			b.Fatalf("nothing to pop after %d messages", n)
		}
		items := make([]AckItem, len(r.Messages))
		for j, m := range r.Messages {
			items[j] = AckItem{PartitionID: m.PartitionID, TxID: m.TxID, Status: AckCompleted, Group: "g", LeaseID: r.LeaseID}
		}
		h.ack(items...)
		n += len(r.Messages)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/msg")
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(n), "cpu-ns/msg")
	return n
}
