package state

import (
	"fmt"
	"strings"
	"testing"
)

// A small batch is in Pebble, and the applied index has moved, when
// ApplyBatch returns: its commit is not handed to a goroutine, whose start
// and wake cost more than the insert. With the hand-off, the index lags
// the return in most of these trials.
func TestSmallBatchIsCommittedOnReturn(t *testing.T) {
	h := newHarness(t)
	for i := range 300 {
		r := h.push("q", "p", fmt.Sprintf(`{"i":%d}`, i))
		if r.Items[0].Offset != uint64(i) {
			t.Fatalf("push %d: offset %d", i, r.Items[0].Offset)
		}
		if got := h.s.AppliedIndex(); got != h.index {
			t.Fatalf("push %d: applied index %d on return, want %d", i, got, h.index)
		}
		p := h.s.pending.Load()
		if p == nil {
			t.Fatalf("push %d: no commit recorded", i)
		}
		select {
		case <-p.done:
		default:
			t.Fatalf("push %d: the batch's commit was still running on return", i)
		}
	}
}

// A batch at or above inlineCommitBytes is committed on its own goroutine;
// a reader and the next batch still see all of it.
func TestLargeBatchIsReadAfterItsCommit(t *testing.T) {
	h := newHarness(t)
	payload := `"` + strings.Repeat("x", 500) + `"`
	const n = 1000 // about 600 KB of batch
	var ps []string
	for range n {
		ps = append(ps, payload)
	}
	for round := range 3 {
		r := h.push("q", "p", ps...)
		if len(r.Items) != n {
			t.Fatalf("round %d: %d results", round, len(r.Items))
		}
		if got := h.queueInfo("q").Total; got != int64((round+1)*n) {
			t.Fatalf("round %d: reader sees %d messages, want %d", round, got, (round+1)*n)
		}
		res := h.pop(Pop{Queue: "q", Group: "g", Batch: n, SubMode: "all"})
		if len(res.Messages) != n {
			t.Fatalf("round %d: pop got %d messages, want %d", round, len(res.Messages), n)
		}
		if res.Messages[0].Offset != uint64(round*n) {
			t.Fatalf("round %d: pop starts at %d", round, res.Messages[0].Offset)
		}
		var items []AckItem
		for _, m := range res.Messages {
			items = append(items, AckItem{PartitionID: m.PartitionID, TxID: m.TxID, Status: AckCompleted, Group: "g", LeaseID: res.LeaseID})
		}
		for i, ir := range h.ack(items...).Items {
			if !ir.Success {
				t.Fatalf("round %d: ack %d: %s", round, i, ir.Error)
			}
		}
	}
	if h.s.WriteStats().BatchBytes < 3*inlineCommitBytes {
		t.Fatalf("batches of %d bytes in all: below the hand-off size; the test does not test it", h.s.WriteStats().BatchBytes)
	}
}
