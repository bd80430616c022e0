package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/queen-mq/queen/internal/state"
)

// TestAckByOffsetNamesTheTransaction: an ack naming messages by partition
// and offset alone answers with each message's transaction id, whether the
// lease's deliveries are remembered (the same node, right after the pop)
// or the message has to be read (a second group acking a delivery it does
// not remember: its pop was of other messages).
func TestAckByOffsetNamesTheTransaction(t *testing.T) {
	br := openBroker(t)
	ctx := context.Background()
	var items []PushItem
	for i := 0; i < 40; i++ {
		items = append(items, PushItem{Queue: "q", Partition: fmt.Sprintf("p%d", i%4), TxID: fmt.Sprintf("tx-%02d", i), Payload: []byte(`{"i":1}`)})
	}
	if _, err := br.Push(ctx, "default", items); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	got := 0
	for got < 40 {
		r, err := br.Pop(ctx, PopRequest{Tenant: "default", Queue: "q", Group: "g", Batch: 7, Partitions: 2, SubscriptionMode: "all"})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Messages) == 0 {
			t.Fatalf("the queue ran dry after %d of 40", got)
		}
		acks := make([]AckItem, len(r.Messages))
		for i, m := range r.Messages {
			off := m.Offset
			acks[i] = AckItem{PartitionID: m.PartitionID, Offset: &off, Group: "g", LeaseID: r.LeaseID}
		}
		// Acked in reverse, so the remembered deliveries are searched from
		// an arbitrary place.
		for i, j := 0, len(acks)-1; i < j; i, j = i+1, j-1 {
			acks[i], acks[j] = acks[j], acks[i]
		}
		out, err := br.Ack(ctx, "default", acks)
		if err != nil {
			t.Fatal(err)
		}
		for i, o := range out {
			m := r.Messages[len(r.Messages)-1-i]
			if !o.Success || o.TxID != m.TxID {
				t.Fatalf("ack of partition %d offset %d: success %v txid %q, want %q", m.PartitionID, m.Offset, o.Success, o.TxID, m.TxID)
			}
			if want[o.TxID] {
				t.Fatalf("%s acknowledged twice", o.TxID)
			}
			want[o.TxID] = true
		}
		got += len(out)
	}
	// A message acked again by offset, outside any lease: read from the store.
	r, err := br.Pop(ctx, PopRequest{Tenant: "default", Queue: "q", Group: "h", Batch: 1, SubscriptionMode: "all"})
	if err != nil || len(r.Messages) != 1 {
		t.Fatalf("pop of group h: %v, %+v", err, r)
	}
	m := r.Messages[0]
	var other uint64
	for o := uint64(0); o < 20; o++ {
		if o != m.Offset {
			other = o
			break
		}
	}
	out, err := br.Ack(ctx, "default", []AckItem{{PartitionID: m.PartitionID, Offset: &other, Group: "g"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 1 || !out[0].Success || out[0].TxID == "" || !want[out[0].TxID] {
		t.Fatalf("re-ack of an acknowledged offset: %+v, want success naming one of the pushed transactions", out)
	}
}

// TestAckByOffsetAndTxIDAnswersTheGivenTxID: an ack naming a message by
// offset and transaction id (as the sink does) is logged without the id,
// and the reply still carries the id the caller gave, even one that is not
// the message's; the message is the one at the offset.
func TestAckByOffsetAndTxIDAnswersTheGivenTxID(t *testing.T) {
	br := openBroker(t)
	ctx := context.Background()
	if _, err := br.Push(ctx, "default", []PushItem{{Queue: "q", Partition: "p", TxID: "a", Payload: []byte(`1`)}, {Queue: "q", Partition: "p", TxID: "b", Payload: []byte(`2`)}}); err != nil {
		t.Fatal(err)
	}
	r, err := br.Pop(ctx, PopRequest{Tenant: "default", Queue: "q", Group: "g", Batch: 2, SubscriptionMode: "all"})
	if err != nil || len(r.Messages) != 2 {
		t.Fatalf("pop: %v, %d messages", err, len(r.Messages))
	}
	o0, o1 := r.Messages[0].Offset, r.Messages[1].Offset
	out, err := br.Ack(ctx, "default", []AckItem{
		{PartitionID: r.Messages[0].PartitionID, Offset: &o0, TxID: "a", Group: "g", LeaseID: r.LeaseID},
		{PartitionID: r.Messages[1].PartitionID, Offset: &o1, TxID: "not-b", Group: "g", LeaseID: r.LeaseID},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !out[0].Success || out[0].TxID != "a" || !out[1].Success || out[1].TxID != "not-b" || !out[1].LeaseReleased {
		t.Fatalf("acks answered %+v; want both successful, with the ids given, the second releasing the lease", out)
	}
	// Both messages are finished: the group has nothing more.
	r, err = br.Pop(ctx, PopRequest{Tenant: "default", Queue: "q", Group: "g", Batch: 2, SubscriptionMode: "all"})
	if err != nil || len(r.Messages) != 0 {
		t.Fatalf("after the acks a pop gave %v, %d messages; want none", err, len(r.Messages))
	}
}

// TestPopNoIDs: a pop with NoIDs delivers the same messages, with every
// field but the id, as one with ids, whose ids are the state's for each
// partition and offset.
func TestPopNoIDs(t *testing.T) {
	br := openBroker(t)
	ctx := context.Background()
	var items []PushItem
	for i := 0; i < 20; i++ {
		items = append(items, PushItem{Queue: "q", Partition: fmt.Sprintf("p%d", i%3), TxID: fmt.Sprintf("tx-%02d", i), Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))})
	}
	if _, err := br.Push(ctx, "default", items); err != nil {
		t.Fatal(err)
	}
	pop := func(group string, noIDs bool) []Message {
		r, err := br.Pop(ctx, PopRequest{Tenant: "default", Queue: "q", Group: group, Batch: 20, Partitions: 3, SubscriptionMode: "all", NoIDs: noIDs})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Messages) != 20 {
			t.Fatalf("group %s: %d messages, want 20", group, len(r.Messages))
		}
		return r.Messages
	}
	with, without := pop("a", false), pop("b", true)
	for i := range with {
		w, n := with[i], without[i]
		if w.ID != state.MessageID(w.PartitionID, w.Offset) {
			t.Fatalf("message %d: id %q, want %q", i, w.ID, state.MessageID(w.PartitionID, w.Offset))
		}
		if n.ID != "" {
			t.Fatalf("message %d: id %q with NoIDs", i, n.ID)
		}
		n.ID, w.LeaseID, n.LeaseID, w.Group, n.Group = w.ID, "", "", "", ""
		if fmt.Sprint(w) != fmt.Sprint(n) {
			t.Fatalf("message %d:\n with ids    %+v\n without ids %+v", i, w, n)
		}
	}
}

// TestPopDeliveries: a pop with Deliveries hands out the same messages as
// one with Messages, field for field, in Delivered and not in Messages, and
// an encrypted queue's payloads opened; a node without the key refuses
// such a pop as it refuses the other.
func TestPopDeliveries(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	br := openAt(t, dir, testKey)
	on := json.RawMessage("true")
	if _, err := br.Configure(ctx, ConfigureRequest{Tenant: "default", Queue: "sealed", Options: map[string]json.RawMessage{"encryptionEnabled": on}}); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"q", "sealed"} {
		var items []PushItem
		for i := 0; i < 20; i++ {
			items = append(items, PushItem{Queue: q, Partition: fmt.Sprintf("p%d", i%3), TxID: fmt.Sprintf("tx-%02d", i), Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))})
		}
		if _, err := br.Push(ctx, "default", items); err != nil {
			t.Fatal(err)
		}
		msgs, err := br.Pop(ctx, PopRequest{Tenant: "default", Queue: q, Group: "a", Batch: 20, Partitions: 3, SubscriptionMode: "all"})
		if err != nil {
			t.Fatal(err)
		}
		dels, err := br.Pop(ctx, PopRequest{Tenant: "default", Queue: q, Group: "b", Batch: 20, Partitions: 3, SubscriptionMode: "all", Deliveries: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs.Messages) != 20 || len(dels.Delivered) != 20 || len(dels.Messages) != 0 || dels.Len() != 20 || msgs.Len() != 20 {
			t.Fatalf("%s: %d messages, %d deliveries and %d messages with Deliveries; want 20, 20, 0", q, len(msgs.Messages), len(dels.Delivered), len(dels.Messages))
		}
		if dels.LeaseID == "" || dels.LeaseID == msgs.LeaseID {
			t.Fatalf("%s: lease %q with Deliveries, %q without", q, dels.LeaseID, msgs.LeaseID)
		}
		seen := map[string]bool{}
		for i, m := range msgs.Messages {
			d := dels.Delivered[i]
			if d.Sealed || d.PartitionID != m.PartitionID || d.Partition != m.Partition || d.Offset != m.Offset || d.TxID != m.TxID ||
				d.TraceID != m.TraceID || d.CreatedAt != m.CreatedAt.UnixMicro() || !bytes.Equal(d.Payload, m.Data) || d.Attempt != m.Attempt || d.Retries != m.Retries {
				t.Fatalf("%s message %d:\n message  %+v\n delivery %+v", q, i, m, d)
			}
			seen[string(d.Payload)] = true
		}
		if len(seen) != 20 {
			t.Fatalf("%s: %d distinct payloads of 20", q, len(seen))
		}
		if _, err := br.Ack(ctx, "default", []AckItem{{PartitionID: dels.Delivered[0].PartitionID, Offset: &dels.Delivered[0].Offset, Group: "b", LeaseID: dels.LeaseID}}); err != nil {
			t.Fatalf("%s: ack of a delivery: %v", q, err)
		}
	}
	br.Close()
	nb := openAt(t, dir, "")
	defer nb.Close()
	var be *Error
	if _, err := nb.Pop(ctx, PopRequest{Tenant: "default", Queue: "sealed", Group: "c", SubscriptionMode: "all", Batch: 10, Deliveries: true}); !errors.As(err, &be) || be.Code != "encryption_key_missing" {
		t.Fatalf("pop of deliveries without the key = %v, want encryption_key_missing", err)
	}
}
