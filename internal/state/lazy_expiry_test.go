package state

import (
	"fmt"
	"testing"
)

// A pop that finds a partition's lease past its time ends the lease itself
// (the tick that would have ended it may not have run yet). When that pop
// is an autoAck pop of the partition by name and leaves messages behind,
// the partition must be ready again: the tick finds no lease left to end,
// so nothing else would put it back, and a group's pops without a
// partition name would never see those messages.
func TestAutoAckPopAfterLapsedLeaseLeavesRestReady(t *testing.T) {
	h := newHarness(t)
	h.push("q", "p", `1`, `2`, `3`)
	r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 1, Partitions: 1, LeaseSeconds: 10})
	if got := offsets(r); fmt.Sprint(got) != "[0]" {
		t.Fatalf("first pop offsets = %v", got)
	}
	h.now += 11e6 // the lease has lapsed; no tick has run
	name := "p"
	r = h.pop(Pop{Queue: "q", Group: "g", Partition: &name, Batch: 1, Partitions: 1, AutoAck: true})
	if got := offsets(r); fmt.Sprint(got) != "[0]" {
		t.Fatalf("autoAck pop by name: offsets = %v, want [0]", got)
	}
	if r.Messages[0].Attempt != 2 {
		t.Fatalf("autoAck pop by name: attempt = %d, want 2", r.Messages[0].Attempt)
	}
	h.apply(&Tick{})
	r = h.pop(Pop{Queue: "q", Group: "g", Batch: 10, Partitions: 1, LeaseSeconds: 10})
	if got := offsets(r); fmt.Sprint(got) != "[1 2]" {
		t.Fatalf("pop without a partition name: offsets = %v, want [1 2]", got)
	}
}

// The same holds when the partition is reopened after the autoAck pop.
func TestAutoAckPopAfterLapsedLeaseSurvivesReopen(t *testing.T) {
	h := newHarness(t)
	h.push("q", "p", `1`, `2`, `3`)
	h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 1, Partitions: 1, LeaseSeconds: 10})
	h.now += 11e6
	name := "p"
	if r := h.pop(Pop{Queue: "q", Group: "g", Partition: &name, Batch: 1, Partitions: 1, AutoAck: true}); len(r.Messages) != 1 {
		t.Fatalf("autoAck pop by name: %d messages, want 1", len(r.Messages))
	}
	h.reopen()
	r := h.pop(Pop{Queue: "q", Group: "g", Batch: 10, Partitions: 1, LeaseSeconds: 10})
	if got := offsets(r); fmt.Sprint(got) != "[1 2]" {
		t.Fatalf("pop after reopen: offsets = %v, want [1 2]", got)
	}
}
