package cluster

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/queen-mq/queen/internal/state"
)

// A retried pop gets its first answer back even when its messages are
// larger than the whole budget for kept results: the index keeps the
// pop's record, and the messages are read back from the store. Once they
// are gone, the retry's outcome is unknown rather than a different answer.
func TestRetriedPopIsAnsweredFromTheStore(t *testing.T) {
	const budget = 256 << 10
	tc := startClusterWith(t, 3, func(_ int, c *Config) { c.DedupBytes = budget })
	l := tc.leader()
	f := tc.follower()
	ctx := ctxT(t, 20*time.Second)

	push := &state.Push{Tenant: "default"}
	pad := strings.Repeat("y", 32<<10)
	for i := 0; i < 24; i++ { // 768 KiB of payload: three times the budget
		push.Items = append(push.Items, state.PushItem{Queue: "big", Partition: fmt.Sprintf("p%d", i%3), TxID: uuid.NewString(), TraceID: fmt.Sprint(i), Payload: []byte(fmt.Sprintf("%q", pad))})
	}
	if v, err := l.Submit(ctx, push, 1<<20); err != nil || v.(*state.PushResult).Err != nil {
		t.Fatalf("push: %v %+v", err, v)
	}
	pop := &state.Pop{Tenant: "default", Queue: "big", Group: "g", SubMode: "all", Batch: 100, Partitions: 10, LeaseSeconds: 60, LeaseID: uuid.NewString()}
	req := &request{id: newReqID(), cmd: pop, size: 64, minIndex: l.CommitIndex()}
	v1, _, err := l.submitLocal(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	first := v1.(*state.PopResult)
	if len(first.Messages) != 24 || first.Claimed != 3 {
		t.Fatalf("pop: %d messages over %d partitions, want 24 over 3", len(first.Messages), first.Claimed)
	}
	l.dedup.mu.Lock()
	kept := l.dedup.bytes
	l.dedup.mu.Unlock()
	if kept > budget {
		t.Fatalf("the index keeps %d bytes, over its budget of %d", kept, budget)
	}

	req.retry = true
	v2, _, err := l.submitLocal(ctx, req)
	if err != nil {
		t.Fatalf("retry on the leader: %v", err)
	}
	if !reflect.DeepEqual(v2, first) {
		t.Fatalf("retry on the leader answered differently:\n got %+v\nwant %+v", v2, first)
	}
	// Forwarded from a follower: the answer crosses the wire.
	v3, _, err := f.forwardSubmit(ctx, l.Address(), req)
	if err != nil {
		t.Fatalf("retry through a follower: %v", err)
	}
	got := v3.(*state.PopResult)
	if got.LeaseID != first.LeaseID || len(got.Messages) != len(first.Messages) {
		t.Fatalf("forwarded retry: lease %q, %d messages; want %q, %d", got.LeaseID, len(got.Messages), first.LeaseID, len(first.Messages))
	}
	for i := range got.Messages {
		g, w := got.Messages[i], first.Messages[i]
		if g.PartitionID != w.PartitionID || g.Offset != w.Offset || g.TxID != w.TxID || g.TraceID != w.TraceID || string(g.Payload) != string(w.Payload) || g.Attempt != w.Attempt {
			t.Fatalf("forwarded retry, message %d: %+v, want %+v", i, g, w)
		}
	}

	if _, err := l.Submit(ctx, &state.DeleteQueue{Tenant: "default", Queue: "big"}, 64); err != nil {
		t.Fatal(err)
	}
	if v, _, err := l.submitLocal(ctx, req); !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("retry after the queue's deletion: %+v, %v; want ErrOutcomeUnknown", v, err)
	}
}

// A retried push or ack is answered with its first result long after
// results of its size would have left a small index: the index keeps
// records of them (their ids and queues come from the retried command),
// so fifty later pushes and acks of a hundred messages do not push them
// out of 64 KiB. Without the records, the push would be answered as a
// duplicate of itself and the ack with an unknown outcome.
func TestRetriedPushAndAckAreAnsweredLongAfter(t *testing.T) {
	const budget = 64 << 10
	tc := startClusterWith(t, 3, func(_ int, c *Config) { c.DedupBytes = budget })
	l := tc.leader()
	f := tc.follower()
	ctx := ctxT(t, 30*time.Second)

	hundred := func(part string) *state.Push {
		p := &state.Push{Tenant: "default"}
		for i := 0; i < 100; i++ {
			p.Items = append(p.Items, state.PushItem{Queue: "q", Partition: part, TxID: uuid.NewString(), Generated: true, Payload: []byte(`{"n":1}`)})
		}
		return p
	}
	pushReq := &request{id: newReqID(), cmd: hundred("first"), size: 8 << 10, minIndex: l.CommitIndex()}
	v, _, err := l.submitLocal(ctx, pushReq)
	if err != nil {
		t.Fatal(err)
	}
	firstPush := v.(*state.PushResult)
	pop := &state.Pop{Tenant: "default", Queue: "q", Group: "g", SubMode: "all", Partition: ptrStr("first"), Batch: 100, Partitions: 1, LeaseSeconds: 60, LeaseID: uuid.NewString()}
	v, err = l.Submit(ctx, pop, 64)
	if err != nil {
		t.Fatal(err)
	}
	popped := v.(*state.PopResult)
	if len(popped.Messages) != 100 {
		t.Fatalf("popped %d messages, want 100", len(popped.Messages))
	}
	ack := &state.Ack{Tenant: "default"}
	for i, m := range popped.Messages {
		it := state.AckItem{PartitionID: m.PartitionID, TxID: m.TxID, Status: state.AckCompleted, Group: "g", LeaseID: popped.LeaseID}
		if i%2 == 1 { // by offset: the apply looks the id up
			off := m.Offset
			it.TxID, it.Offset = "", &off
		}
		ack.Items = append(ack.Items, it)
	}
	ackReq := &request{id: newReqID(), cmd: ack, size: 8 << 10, minIndex: l.CommitIndex()}
	v, _, err = l.submitLocal(ctx, ackReq)
	if err != nil {
		t.Fatal(err)
	}
	firstAck := v.(*state.AckResult)
	for _, it := range firstAck.Items {
		if !it.Success || it.TxID == "" {
			t.Fatalf("ack: %+v", it)
		}
	}

	for i := 0; i < 50; i++ {
		part := fmt.Sprintf("later-%d", i)
		if v, err := l.Submit(ctx, hundred(part), 8<<10); err != nil || v.(*state.PushResult).Err != nil {
			t.Fatalf("push %d: %v %+v", i, err, v)
		}
		p := &state.Pop{Tenant: "default", Queue: "q", Group: "g", SubMode: "all", Partition: ptrStr(part), Batch: 100, Partitions: 1, LeaseSeconds: 60, LeaseID: uuid.NewString()}
		v, err := l.Submit(ctx, p, 64)
		if err != nil {
			t.Fatal(err)
		}
		a := &state.Ack{Tenant: "default"}
		for _, m := range v.(*state.PopResult).Messages {
			a.Items = append(a.Items, state.AckItem{PartitionID: m.PartitionID, TxID: m.TxID, Status: state.AckCompleted, Group: "g", LeaseID: p.LeaseID})
		}
		if _, err := l.Submit(ctx, a, 8<<10); err != nil {
			t.Fatal(err)
		}
	}
	l.dedup.mu.Lock()
	kept := l.dedup.bytes
	l.dedup.mu.Unlock()
	if kept > budget {
		t.Fatalf("the index keeps %d bytes, over its budget of %d", kept, budget)
	}

	for _, tr := range []struct {
		name  string
		req   *request
		first any
	}{{"push", pushReq, firstPush}, {"ack", ackReq, firstAck}} {
		tr.req.retry = true
		got, _, err := l.submitLocal(ctx, tr.req)
		if err != nil {
			t.Fatalf("%s retried on the leader: %v", tr.name, err)
		}
		if !reflect.DeepEqual(got, tr.first) {
			t.Fatalf("%s retried on the leader answered differently:\n got %+v\nwant %+v", tr.name, got, tr.first)
		}
		// Forwarded from a follower: the answer crosses the wire.
		got, _, err = f.forwardSubmit(ctx, l.Address(), tr.req)
		if err != nil {
			t.Fatalf("%s retried through a follower: %v", tr.name, err)
		}
		switch w := tr.first.(type) {
		case *state.PushResult:
			g := got.(*state.PushResult)
			if len(g.Items) != len(w.Items) {
				t.Fatalf("forwarded push retry: %d items, want %d", len(g.Items), len(w.Items))
			}
			for i := range g.Items {
				if g.Items[i] != w.Items[i] {
					t.Fatalf("forwarded push retry, item %d: %+v, want %+v", i, g.Items[i], w.Items[i])
				}
			}
		case *state.AckResult:
			g := got.(*state.AckResult)
			if len(g.Items) != len(w.Items) {
				t.Fatalf("forwarded ack retry: %d items, want %d", len(g.Items), len(w.Items))
			}
			for i := range g.Items {
				gi, wi := g.Items[i], w.Items[i]
				if gi.TxID != wi.TxID || gi.Success != wi.Success || gi.Error != wi.Error || gi.LeaseReleased != wi.LeaseReleased || gi.DLQ != wi.DLQ {
					t.Fatalf("forwarded ack retry, item %d: %+v, want %+v", i, gi, wi)
				}
			}
		}
	}
}

func ptrStr(s string) *string { return &s }
