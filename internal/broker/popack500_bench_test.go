package broker

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkPopAck500 is a sink's loop through the broker's Go API on one
// node: pop up to 500 messages over many partitions, ack them all, again;
// the acks name each message by partition, offset and transaction id (as
// the sink did), or by partition and offset alone; deliveries pops with
// Deliveries and acks by offset, as the sink does now.
// Run: go test ./internal/broker -run '^$' -bench PopAck500 -benchtime 3x
func BenchmarkPopAck500(b *testing.B) {
	for _, byTxID := range []bool{true, false} {
		name := "offset"
		if byTxID {
			name = "txid"
		}
		b.Run(name, func(b *testing.B) { benchPopAck500(b, byTxID, false) })
	}
	b.Run("deliveries", func(b *testing.B) { benchPopAck500(b, false, true) })
}

func benchPopAck500(b *testing.B, byTxID, deliveries bool) {
	br := openBroker(b)
	ctx := context.Background()
	const msgs = 100000
	payload := []byte(`{"id":123456,"customer":"c-00042","amount":"19.99","status":"new","region":"eu-west","note":"a note of some length to make the message about two hundred bytes long ....."}`)
	for i := 0; i < msgs/500; i++ {
		items := make([]PushItem, 500)
		for j := range items {
			items[j] = PushItem{Queue: "s", Partition: fmt.Sprintf("p%d", j%16), Payload: payload}
		}
		if _, err := br.Push(ctx, "default", items); err != nil {
			b.Fatal(err)
		}
	}
	var popTime, ackTime time.Duration
	b.ResetTimer()
	cpu0 := cpuNow()
	for it := 0; it < b.N; it++ {
		group := fmt.Sprintf("g%d", it)
		got := 0
		for got < msgs {
			t0 := time.Now()
			r, err := br.Pop(ctx, PopRequest{Tenant: "default", Queue: "s", Group: group, Batch: 500, Partitions: 500, SubscriptionMode: "all", LeaseSeconds: 60, Deliveries: deliveries})
			if err != nil {
				b.Fatal(err)
			}
			if r.Len() == 0 {
				b.Fatalf("the queue ran dry after %d of %d messages", got, msgs)
			}
			popTime += time.Since(t0)
			t1 := time.Now()
			items := make([]AckItem, r.Len())
			for i, m := range r.Messages {
				off := m.Offset
				items[i] = AckItem{PartitionID: m.PartitionID, Offset: &off, Group: group, LeaseID: r.LeaseID}
				if byTxID {
					items[i].TxID = m.TxID
				}
			}
			for i, d := range r.Delivered {
				off := d.Offset
				items[i] = AckItem{PartitionID: d.PartitionID, Offset: &off, Group: group, LeaseID: r.LeaseID}
			}
			if _, err := br.Ack(ctx, "default", items); err != nil {
				b.Fatal(err)
			}
			ackTime += time.Since(t1)
			got += len(items)
		}
	}
	b.ReportMetric(float64(msgs*b.N)/b.Elapsed().Seconds(), "msgs/s")
	// The process's CPU per message, steadier than rates on a shared
	// machine (it includes the flushes of the pushes that filled the queue).
	b.ReportMetric(float64((cpuNow()-cpu0).Nanoseconds())/float64(msgs*b.N), "cpu-ns/msg")
	// Where a message's time goes: its pop, and its ack (with building it).
	b.ReportMetric(float64(popTime.Nanoseconds())/float64(msgs*b.N), "pop-ns/msg")
	b.ReportMetric(float64(ackTime.Nanoseconds())/float64(msgs*b.N), "ack-ns/msg")
}
