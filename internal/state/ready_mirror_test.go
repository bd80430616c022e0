package state

import (
	"fmt"
	"testing"
)

// TestPushLoadsReadyMirror: pushes into many existing partitions whose
// cursors are not cached each need to know whether the group's ready index
// holds the partition. Past a bound they load the group's mirror instead of
// reading one ready key per partition, and the ready index stays exact.
func TestPushLoadsReadyMirror(t *testing.T) {
	h := newHarness(t)
	const n = 4096
	name := func(i int) string { return fmt.Sprintf("p%05d", i) }
	c := &Push{Tenant: "default"}
	for i := range n {
		c.Items = append(c.Items, PushItem{Queue: "q", Partition: name(i), Payload: []byte(`1`)})
	}
	if r := h.apply(c)[0].(*PushResult); r.Err != nil {
		t.Fatal(r.Err)
	}
	// The queue-mode group takes one partition, so one ready key is gone.
	taken := name(7)
	r := h.pop(Pop{Queue: "q", Partition: &taken, Batch: 1, Partitions: 1, LeaseSeconds: 60})
	if len(r.Messages) != 1 {
		t.Fatalf("pop of %s: %d messages", taken, len(r.Messages))
	}
	// A reopened store has no cursors cached and no mirror loaded.
	h.reopen()
	before := h.s.pointReads
	for i := range n {
		if r := h.push("q", name(i), "2"); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	reads := h.s.pointReads - before
	t.Logf("%d point reads for pushes into %d partitions", reads, n)
	// Without the record cache each push reads the partition's name, its
	// record and its last dedup entry; the ready keys must not add one more
	// read per push.
	if reads > 3*n+n/4 {
		t.Fatalf("%d point reads for pushes into %d partitions: the ready keys were read one by one", reads, n)
	}
	// Every partition is ready but the leased one: each pop takes a
	// different partition and never the leased one.
	got := map[string]bool{}
	for range n - 1 {
		r := h.pop(Pop{Queue: "q", Batch: 10, Partitions: 1, LeaseSeconds: 60})
		if len(r.Messages) == 0 {
			break
		}
		p := r.Messages[0].Partition
		if got[p] || p == taken {
			t.Fatalf("pop delivered %s again", p)
		}
		got[p] = true
	}
	if len(got) != n-1 {
		t.Fatalf("pops delivered %d partitions, want %d", len(got), n-1)
	}
	if r := h.pop(Pop{Queue: "q", Batch: 10, Partitions: 1, LeaseSeconds: 60}); len(r.Messages) != 0 {
		t.Fatalf("a pop after every ready partition delivered %d messages from %s", len(r.Messages), r.Messages[0].Partition)
	}
}

// TestNewGroupMirrorComplete: the ready mirror of a group this store
// created is complete from the start, so pushes into the partitions of a
// queue it created read no ready key (the queue-mode group, which nothing
// pops here), and pops over that mirror find every ready partition.
func TestNewGroupMirrorComplete(t *testing.T) {
	h := newHarness(t)
	const n = 4096
	name := func(i int) string { return fmt.Sprintf("p%05d", i) }
	c := &Push{Tenant: "default"}
	for i := range n {
		c.Items = append(c.Items, PushItem{Queue: "q", Partition: name(i), TxID: fmt.Sprintf("a%d", i), Generated: true, Payload: []byte(`1`)})
	}
	if r := h.apply(c)[0].(*PushResult); r.Err != nil {
		t.Fatal(r.Err)
	}
	before := h.s.pointReads
	for i := range n {
		if r := h.push("q", name(i), "2"); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if reads := h.s.pointReads - before; reads != 0 {
		t.Fatalf("%d point reads for pushes into %d cached partitions of a queue this store created", reads, n)
	}
	got := map[string]int{}
	for {
		r := h.pop(Pop{Queue: "q", Batch: 10, Partitions: 1, AutoAck: true})
		if len(r.Messages) == 0 {
			break
		}
		for _, m := range r.Messages {
			got[m.Partition]++
		}
	}
	if len(got) != n {
		t.Fatalf("pops delivered %d partitions, want %d", len(got), n)
	}
	for p, k := range got {
		if k != 2 {
			t.Fatalf("partition %s: %d messages delivered, want 2", p, k)
		}
	}
}
