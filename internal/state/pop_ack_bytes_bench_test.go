package state

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
)

// BenchmarkStatePopAckBytes is BenchmarkStatePopAck500's loop measured in
// what it writes: the bytes the pop and ack batches put into Pebble's
// memtables per message (the fills left out), and the CPU per message. It
// pops batch messages from parts partitions (one: the sink's pop from a
// partition that has a batch's worth), acks them all by offset, and again.
// Run with -benchtime Nx.
func BenchmarkStatePopAckBytes(b *testing.B) {
	for _, c := range []struct{ parts, batch int }{{1, 500}, {16, 500}, {16, 50}} {
		b.Run(fmt.Sprintf("parts=%d/batch=%d", c.parts, c.batch), func(b *testing.B) {
			benchPopAckBytes(b, c.parts, c.batch)
		})
	}
}

func benchPopAckBytes(b *testing.B, parts, batch int) {
	h := newHarness(b)
	payload := []byte(`{"id":123456,"customer":"c-00042","amount":"19.99","status":"new","region":"eu-west","note":"a note of some length to make the message about two hundred bytes long ....."}`)
	const round = 50_000
	var cpu time.Duration
	fill := func() {
		b.StopTimer()
		cpu += cpuTime()
		for i := 0; i < round; i += 500 {
			p := &Push{Tenant: "default"}
			for j := 0; j < 500; j++ {
				p.Items = append(p.Items, PushItem{Queue: "q", Partition: fmt.Sprintf("p%d", j%parts), TxID: uuid.NewString(), Generated: true, Payload: payload})
			}
			h.apply(p)
		}
		cpu -= cpuTime()
		b.StartTimer()
	}
	b.ResetTimer()
	cpu -= cpuTime()
	var written uint64
	n, left := 0, 0
	for i := 0; i < b.N; i++ {
		if left < batch {
			fill()
			left += round
		}
		w0 := h.s.WriteStats().BatchBytes
		got := popAckAll(b, h, batch, parts, n)
		written += h.s.WriteStats().BatchBytes - w0
		n += got
		left -= got
	}
	b.StopTimer()
	cpu += cpuTime()
	b.ReportMetric(float64(written)/float64(n), "batch-B/msg")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "cpu-ns/msg")
}
