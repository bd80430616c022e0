package broker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// ackReply collects what a pop's AckDone reports.
type ackReply struct {
	out []AckOutcome
	err error
}

func ackInto(ch chan ackReply) func([]AckOutcome, error) {
	return func(out []AckOutcome, err error) { ch <- ackReply{out, err} }
}

func offsetAcks(r *PopResponse, group string) []AckItem {
	items := make([]AckItem, len(r.Messages))
	for i, m := range r.Messages {
		off := m.Offset
		items[i] = AckItem{PartitionID: m.PartitionID, Offset: &off, Group: group, LeaseID: r.LeaseID}
	}
	return items
}

// TestPopCarriesAckFirst: the acks a pop carries are applied before it
// leases. The queue has one partition, which the first pop leases; the
// next pop, carrying that pop's ack, can only find messages if the ack
// released the partition first, and must never hand out an acked message
// again.
func TestPopCarriesAckFirst(t *testing.T) {
	br := openBroker(t)
	ctx := context.Background()
	const batches, batch = 6, 10
	items := make([]PushItem, batches*batch)
	for i := range items {
		items[i] = PushItem{Queue: "q", Partition: "p", Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))}
	}
	if _, err := br.Push(ctx, "default", items); err != nil {
		t.Fatal(err)
	}
	pop := func(acks []AckItem, done func([]AckOutcome, error)) *PopResponse {
		t.Helper()
		r, err := br.Pop(ctx, PopRequest{Tenant: "default", Queue: "q", Group: "g", Batch: batch, SubscriptionMode: "all", LeaseSeconds: 60, Acks: acks, AckDone: done})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := pop(nil, nil)
	if len(r.Messages) != batch {
		t.Fatalf("first pop: %d messages", len(r.Messages))
	}
	seen := map[uint64]bool{}
	entries := 0
	for k := 1; ; k++ {
		for _, m := range r.Messages {
			if seen[m.Offset] {
				t.Fatalf("offset %d delivered again after its ack", m.Offset)
			}
			seen[m.Offset] = true
		}
		replies := make(chan ackReply, 2)
		acked := len(r.Messages)
		i0 := br.Node().CommitIndex()
		r = pop(offsetAcks(r, "g"), ackInto(replies))
		entries += int(br.Node().CommitIndex() - i0)
		rep := <-replies
		if rep.err != nil {
			t.Fatalf("pop %d: its ack failed: %v", k, rep.err)
		}
		if len(rep.out) != acked {
			t.Fatalf("pop %d: %d ack outcomes for %d items", k, len(rep.out), acked)
		}
		for i, o := range rep.out {
			if !o.Success || !o.LeaseReleased && i == acked-1 {
				t.Fatalf("pop %d: ack %d: %+v", k, i, o)
			}
		}
		if k < batches && len(r.Messages) != batch {
			t.Fatalf("pop %d carrying the ack of the batch before found %d messages: the ack did not release the partition before it", k, len(r.Messages))
		}
		if k == batches {
			if len(r.Messages) != 0 {
				t.Fatalf("a pop after every message was acked got %d", len(r.Messages))
			}
			break
		}
		select {
		case extra := <-replies:
			t.Fatalf("AckDone called twice: %+v", extra)
		default:
		}
	}
	if len(seen) != batches*batch {
		t.Fatalf("delivered %d distinct messages, want %d", len(seen), batches*batch)
	}
	t.Logf("%d pops carrying acks took %d log entries", batches, entries)
}

// TestPopCarriedAckNotSent: a pop refused before anything is proposed
// reports its acks as not sent (ErrAckNotSent) and applies nothing: the
// same acks sent alone afterwards succeed. A pop with acks and no AckDone
// is refused the same way.
func TestPopCarriedAckNotSent(t *testing.T) {
	br := openBroker(t)
	ctx := context.Background()
	if _, err := br.Push(ctx, "default", []PushItem{{Queue: "q", Partition: "p", Payload: []byte(`1`)}, {Queue: "q", Partition: "p", Payload: []byte(`2`)}}); err != nil {
		t.Fatal(err)
	}
	r, err := br.Pop(ctx, PopRequest{Tenant: "default", Queue: "q", Group: "g", Batch: 2, SubscriptionMode: "all", LeaseSeconds: 60})
	if err != nil || len(r.Messages) != 2 {
		t.Fatalf("pop: %v, %d messages", err, len(r.Messages))
	}
	acks := offsetAcks(r, "g")
	replies := make(chan ackReply, 2)
	_, err = br.Pop(ctx, PopRequest{Tenant: "default", Queue: "bad name!", Group: "g", Batch: 2, Acks: acks, AckDone: ackInto(replies)})
	if AsError(err).Code != "invalid_parameter" {
		t.Fatalf("pop of a bad queue name: %v", err)
	}
	select {
	case rep := <-replies:
		if !errors.Is(rep.err, ErrAckNotSent) {
			t.Fatalf("AckDone: %v, want ErrAckNotSent", rep.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("AckDone was not called")
	}
	if _, err := br.Pop(ctx, PopRequest{Tenant: "default", Queue: "q", Group: "g", Batch: 2, Acks: acks}); AsError(err).Code != "invalid_parameter" {
		t.Fatalf("pop with acks and no AckDone: %v", err)
	}
	// Nothing was acked: the partition is still leased, and the acks
	// alone release it.
	if r, err := br.Pop(ctx, PopRequest{Tenant: "default", Queue: "q", Group: "g", Batch: 2}); err != nil || len(r.Messages) != 0 {
		t.Fatalf("pop of a leased partition: %v, %d messages", err, len(r.Messages))
	}
	out, err := br.Ack(ctx, "default", acks)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if !o.Success {
			t.Fatalf("ack %d after the refused pop: %+v", i, o)
		}
	}
	select {
	case rep := <-replies:
		t.Fatalf("AckDone called again: %+v", rep)
	default:
	}
}
