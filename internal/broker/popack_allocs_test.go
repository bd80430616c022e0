package broker

import (
	"context"
	"fmt"
	"testing"
)

// TestPopAckAllocationsPerMessage: a sink's loop (pop 500 over 16
// partitions, ack them by offset) allocates under one object per
// message in the whole process: the pop's messages share one arena and
// their ids one string, the ack's items decode into one string and one
// slice, and the ack settles each cursor once.
func TestPopAckAllocationsPerMessage(t *testing.T) {
	br := openBroker(t)
	ctx := context.Background()
	const runs, batch = 10, 500
	payload := []byte(`{"id":123456,"customer":"c-00042","amount":"19.99","status":"new"}`)
	for i := 0; i < runs+2; i++ {
		items := make([]PushItem, batch)
		for j := range items {
			items[j] = PushItem{Queue: "s", Partition: fmt.Sprintf("p%d", j%16), Payload: payload}
		}
		if _, err := br.Push(ctx, "default", items); err != nil {
			t.Fatal(err)
		}
	}
	acks := make([]AckItem, batch)
	offs := make([]uint64, batch)
	var failed error
	n := testing.AllocsPerRun(runs, func() {
		r, err := br.Pop(ctx, PopRequest{Tenant: "default", Queue: "s", Group: "sink", Batch: batch, Partitions: 16, SubscriptionMode: "all", LeaseSeconds: 60})
		if err != nil || len(r.Messages) != batch {
			failed = fmt.Errorf("pop: %v, %d messages", err, len(r.Messages))
			return
		}
		for i, m := range r.Messages {
			offs[i] = m.Offset
			acks[i] = AckItem{PartitionID: m.PartitionID, Offset: &offs[i], Group: "sink", LeaseID: r.LeaseID}
		}
		out, err := br.Ack(ctx, "default", acks)
		if err != nil {
			failed = err
			return
		}
		for i, o := range out {
			if !o.Success {
				failed = fmt.Errorf("ack %d: %s", i, o.Error)
				return
			}
		}
	})
	if failed != nil {
		t.Fatal(failed)
	}
	limit := 1.0 // some per partition and per command, none per message
	if raceDetector {
		// The detector adds its own (about 0.6 a message); one more per
		// message still fails here, since make test runs with -race.
		limit = 2
	}
	if per := n / batch; per > limit {
		t.Fatalf("a pop and ack of %d messages took %.0f allocations, %.2f per message; want at most %.0f", batch, n, per, limit)
	}
	t.Logf("%.0f allocations per pop+ack of %d, %.3f per message", n, batch, n/batch)
}
