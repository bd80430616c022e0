package pgsink

import (
	"context"
	"testing"

	"github.com/queen-mq/queen/internal/broker"
	"github.com/queen-mq/queen/internal/connector"
)

// BenchmarkDecodeBatch maps a batch of 500 of the sink benchmark's
// messages onto their ops and COPY lines, as a worker does before writing
// it (append mode, every column copyable).
func BenchmarkDecodeBatch(b *testing.B) {
	w := benchDecodeWorker()
	msgs := make([]broker.Delivery, 500)
	for i := range msgs {
		msgs[i] = broker.Delivery{PartitionID: uint64(i%16 + 1), Offset: uint64(i), Payload: []byte(benchRow(i))}
	}
	b.ReportAllocs()
	for b.Loop() {
		items, parts := w.group(msgs)
		if err := w.decode(context.Background(), items, parts); err != nil {
			b.Fatal(err)
		}
		if items[0].ops[0].copy == nil {
			b.Fatal("not on the COPY path")
		}
	}
}

// benchDecodeWorker is a worker of an append sink whose six text columns
// (the sink benchmark's) are all copyable, for the decode benchmarks.
func benchDecodeWorker() *worker {
	cols := []string{"id", "customer", "amount", "status", "region", "note"}
	p := &plan{writable: map[string]bool{}, copy: &copyPlan{conv: map[string]conv{}}}
	for _, c := range cols {
		p.writable[c], p.copy.conv[c] = true, convText
	}
	return &worker{s: &sink{spec: connector.SinkSpec{Mode: "append"}}, plan: p}
}
