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
