package state

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
)

// BenchmarkStatePopAckPushed is BenchmarkStatePopAck's million partitions
// after `make bench-scale`'s push phase: one message in each partition,
// then 5,000 pushes of 100 spread over the queue, so that about two in five
// partitions hold two messages or more (and a dedup key after the second).
// A pop of 100 then takes them from about 70 partitions in id order. The
// compactions of what the setup wrote run before the measured pops.
func BenchmarkStatePopAckPushed(b *testing.B) {
	const parts = 1_000_000
	if b.N*100 > parts {
		b.Fatalf("at most 10000 iterations")
	}
	h := newHarness(b)
	prefillScale(h, parts, 1)
	for i := 0; i < 5000; i++ {
		c := &Push{Tenant: "default", Items: make([]PushItem, 100)}
		for j := range c.Items {
			c.Items[j] = PushItem{Queue: "q", Partition: fmt.Sprintf("p%07d", (i*100+j*7919)%parts), TxID: uuid.NewString(), Generated: true, Payload: []byte(`{"k":2}`)}
		}
		h.now += 1000
		h.apply(c)
	}
	// What the prefill and the pushes wrote is flushed and its compactions
	// are waited for, so that the pops do not pay for them.
	if err := h.s.db.Flush(); err != nil {
		b.Fatal(err)
	}
	// (Done once no compaction has run for half a second.)
	for idle, deadline := 0, time.Now().Add(2*time.Minute); idle < 25; {
		if h.s.db.Metrics().Compact.NumInProgress == 0 {
			idle++
		} else {
			idle = 0
		}
		if time.Now().After(deadline) {
			b.Fatal("compactions still running after 2 minutes")
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop := benchProfile(b)
	defer stop()
	w0 := h.s.WriteStats()
	b.ResetTimer()
	n := popAckLoop(b, h)
	reportWrites(b, w0, h.s.WriteStats(), n)
}
