package broker

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// BenchmarkPopLatency measures one consumer's pop and its ack, each on its
// own, through the broker's Go API on one node: the pop's latency is its
// log write (and fsync, where it has one) plus the apply. It reports the
// p50 and p99 of each.
// Run: go test ./internal/broker -run '^$' -bench PopLatency -benchtime 1x
func BenchmarkPopLatency(b *testing.B) {
	br := openBroker(b)
	ctx := context.Background()
	const msgs = 20000
	for i := 0; i < msgs/100; i++ {
		items := make([]PushItem, 100)
		for j := range items {
			items[j] = PushItem{Queue: "l", Partition: fmt.Sprintf("p%d", j%10), Payload: []byte(`{"x":"abcdefghijklmnopqrstuvwx"}`)}
		}
		if _, err := br.Push(ctx, "default", items); err != nil {
			b.Fatal(err)
		}
	}
	var pops, acks []time.Duration
	n := 0
	for n < msgs {
		t0 := time.Now()
		r, err := br.Pop(ctx, PopRequest{Tenant: "default", Queue: "l", Group: "g", SubscriptionMode: "all", Batch: 10, Partitions: 1})
		if err != nil {
			b.Fatal(err)
		}
		if len(r.Messages) == 0 {
			b.Fatalf("the queue ran dry after %d of %d messages", n, msgs)
		}
		t1 := time.Now()
		items := make([]AckItem, len(r.Messages))
		for j, m := range r.Messages {
			items[j] = AckItem{TxID: m.TxID, PartitionID: m.PartitionID, Group: "g", LeaseID: r.LeaseID}
		}
		if _, err := br.Ack(ctx, "default", items); err != nil {
			b.Fatal(err)
		}
		pops, acks = append(pops, t1.Sub(t0)), append(acks, time.Since(t1))
		n += len(r.Messages)
	}
	q := func(d []time.Duration, p float64) float64 {
		slices.Sort(d)
		return float64(d[int(p*float64(len(d)-1))].Microseconds())
	}
	b.ReportMetric(q(pops, 0.5), "pop-p50-µs")
	b.ReportMetric(q(pops, 0.99), "pop-p99-µs")
	b.ReportMetric(q(acks, 0.5), "ack-p50-µs")
	b.ReportMetric(q(acks, 0.99), "ack-p99-µs")
}
