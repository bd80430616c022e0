package broker

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// TestAckRuns: an item with a count acknowledges that many messages of its
// partition from its offset on; the next pop delivers what is left, and a
// run partly outside the lease reports the first refusal. A run named by
// transaction id, or longer than MaxBatch in all, is refused; so is one in
// a transaction.
func TestAckRuns(t *testing.T) {
	ctx := context.Background()
	br := openAt(t, t.TempDir(), "")
	defer br.Close()
	var items []PushItem
	for i := 0; i < 30; i++ {
		items = append(items, PushItem{Queue: "q", Partition: fmt.Sprintf("p%d", i%2), Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))})
	}
	if _, err := br.Push(ctx, "default", items); err != nil {
		t.Fatal(err)
	}
	pop := func() *PopResponse {
		r, err := br.Pop(ctx, PopRequest{Tenant: "default", Queue: "q", Group: "g", Batch: 30, Partitions: 2, SubscriptionMode: "all", Deliveries: true})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := pop()
	if len(r.Delivered) != 30 {
		t.Fatalf("popped %d, want 30", len(r.Delivered))
	}
	first := map[uint64]uint64{}
	for _, d := range r.Delivered {
		if _, ok := first[d.PartitionID]; !ok {
			first[d.PartitionID] = d.Offset
		}
	}
	var runs []AckItem
	for pid, off := range first {
		o := off
		runs = append(runs, AckItem{PartitionID: pid, Offset: &o, Count: 10, Group: "g", LeaseID: r.LeaseID, Status: "completed"})
	}
	out, err := br.Ack(ctx, "default", runs)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if !o.Success || o.LeaseReleased {
			t.Fatalf("run %d: %+v, want success with the lease still held", i, o)
		}
	}
	// The rest of each partition (offsets 10..14), then a run past it.
	for pid, off := range first {
		o := off + 10
		out, err := br.Ack(ctx, "default", []AckItem{{PartitionID: pid, Offset: &o, Count: 8, Group: "g", LeaseID: r.LeaseID, Status: "completed"}})
		if err != nil {
			t.Fatal(err)
		}
		if o := out[0]; o.Success || o.Error != "message_not_found" || !o.LeaseReleased {
			t.Fatalf("a run past the partition's end: %+v, want message_not_found and the lease released", o)
		}
	}
	if r := pop(); len(r.Delivered) != 0 {
		t.Fatalf("after the runs a pop delivers %d messages", len(r.Delivered))
	}
	o := uint64(0)
	var be *Error
	for name, bad := range map[string][]AckItem{
		"by transaction id": {{PartitionID: 1, Offset: &o, TxID: "x", Count: 2, Group: "g"}},
		"no offset":         {{PartitionID: 1, Count: 2, Group: "g"}},
		"too long":          {{PartitionID: 1, Offset: &o, Count: MaxBatch + 1, Group: "g"}},
		"too many in all":   {{PartitionID: 1, Offset: &o, Count: MaxBatch, Group: "g"}, {PartitionID: 2, Offset: &o, Group: "g"}},
	} {
		if _, err := br.Ack(ctx, "default", bad); !errors.As(err, &be) || be.Code != "invalid_parameter" {
			t.Errorf("%s: %v, want invalid_parameter", name, err)
		}
	}
	_, err = br.Transaction(ctx, TxnRequest{Tenant: "default", Ops: []TxnOp{{Type: OpAck, Ack: AckItem{PartitionID: 1, Offset: &o, Count: 2, Group: "g"}}}})
	if !errors.As(err, &be) || be.Code != "invalid_parameter" {
		t.Errorf("a run in a transaction: %v, want invalid_parameter", err)
	}
}
