package state

import (
	"fmt"
	"testing"

	"github.com/google/uuid"
)

// TestBackfillReadsCursorsWithOneScan: a group that reads a queue from the
// start finds the partitions that existed before it by scanning them
// (backfill). It takes their records from the scan and reads its cursors of
// those partitions with one iterator beside it, not with point reads (which,
// for a group new to a queue of a million partitions, were most of a pop's
// time), and still
// honours the cursors that exist: a partition whose only message the group
// acknowledged is not delivered again, and one it holds a lease on is not
// delivered while the lease holds.
func TestBackfillReadsCursorsWithOneScan(t *testing.T) {
	h := newHarness(t)
	const n = 1500
	c := &Push{Tenant: "default"}
	for i := range n {
		c.Items = append(c.Items, PushItem{Queue: "q", Partition: fmt.Sprintf("p%04d", i), Payload: []byte(`1`)})
	}
	if r := h.apply(c)[0].(*PushResult); r.Err != nil {
		t.Fatal(r.Err)
	}
	acked, leased := "p0100", "p0200"
	r := h.pop(Pop{Queue: "q", Partition: &acked, Group: "g", SubMode: "all", Batch: 1, Partitions: 1, LeaseSeconds: 60})
	if len(r.Messages) != 1 {
		t.Fatalf("pop of %s: %d messages", acked, len(r.Messages))
	}
	if a := h.ack(AckItem{PartitionID: r.Messages[0].PartitionID, TxID: r.Messages[0].TxID, Status: AckCompleted, Group: "g", LeaseID: r.LeaseID}); !a.Items[0].Success {
		t.Fatalf("ack: %+v", a.Items[0])
	}
	if r := h.pop(Pop{Queue: "q", Partition: &leased, Group: "g", Batch: 1, Partitions: 1, LeaseSeconds: 60}); len(r.Messages) != 1 {
		t.Fatalf("pop of %s: %d messages", leased, len(r.Messages))
	}
	// Without the record caches every cursor the pops need is in Pebble.
	h.reopen()
	before := h.s.pointReads
	got := map[string]int{}
	for pops := 0; ; pops++ {
		if pops > n {
			t.Fatal("the pops do not end")
		}
		r := h.pop(Pop{Queue: "q", Group: "g", Batch: 100, Partitions: 100, LeaseSeconds: 60})
		if len(r.Messages) == 0 {
			break
		}
		for _, m := range r.Messages {
			got[m.Partition]++
		}
	}
	reads := h.s.pointReads - before
	t.Logf("%d point reads for %d partitions", reads, n)
	if len(got) != n-2 || got[acked] != 0 || got[leased] != 0 {
		t.Fatalf("delivered %d partitions (%s: %d, %s: %d); want every one but %s and %s", len(got), acked, got[acked], leased, got[leased], acked, leased)
	}
	for p, k := range got {
		if k != 1 {
			t.Fatalf("%s delivered %d times", p, k)
		}
	}
	if reads > n/10 {
		t.Fatalf("%d point reads to serve %d partitions: the records or cursors were read one by one", reads, n)
	}
}

// TestBackfillPopsWritePerPartition: pops of 100 partitions, each with one
// message, over a new group's backfill of 1,000 partitions, and their acks,
// write per partition the cursor twice and a share of the lease records:
// a backfill round stops at what its pop can claim, so no partition gets a
// ready key from one pop's scan only for the next pop to delete it.
func TestBackfillPopsWritePerPartition(t *testing.T) {
	h := newHarness(t)
	const parts = 1000
	p := &Push{Tenant: "default"}
	for i := 0; i < parts; i++ {
		p.Items = append(p.Items, PushItem{Queue: "q", Partition: fmt.Sprintf("p%04d", i), TxID: uuid.NewString(), Generated: true, Payload: []byte(`1`)})
	}
	h.apply(p)
	h.s.DB() // waits for the push's batch to be committed and counted
	before := h.s.WriteStats().BatchBytes
	got := 0
	for got < parts {
		r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 100, Partitions: 100, LeaseSeconds: 10})
		if len(r.Messages) == 0 {
			t.Fatalf("nothing to pop after %d of %d messages", got, parts)
		}
		var items []AckItem
		for _, m := range r.Messages {
			items = append(items, AckItem{PartitionID: m.PartitionID, TxID: m.TxID, Status: AckCompleted, Group: "g", LeaseID: r.LeaseID})
		}
		for i, it := range h.ack(items...).Items {
			if !it.Success {
				t.Fatalf("ack %d: %s", i, it.Error)
			}
		}
		got += len(r.Messages)
	}
	if r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 100, Partitions: 100, LeaseSeconds: 10}); len(r.Messages) != 0 {
		t.Fatalf("a pop after every message was acked got %d", len(r.Messages))
	}
	h.s.DB()
	per := float64(h.s.WriteStats().BatchBytes-before) / parts
	t.Logf("pops and acks wrote %.0f bytes per partition", per)
	// The ack's cursor record and the pop's share of its lease record (the
	// overlay) come to about 45 bytes (TestPopAckWritesPerPartition); a
	// ready key set by a scan and deleted by the next pop added about 50.
	if per > 70 {
		t.Fatalf("pops and acks wrote %.0f bytes per partition; want at most 70", per)
	}
	// The push made every partition ready for the queue-mode group; the
	// group that read them all has none left.
	if n := h.countKeys(tReady); n != parts {
		t.Fatalf("%d ready keys left; want %d (the queue-mode group's)", n, parts)
	}
}

// TestBackfillCachedAndStoredRecords: the backfill takes a partition's
// record from the record cache when it holds it and from Pebble otherwise.
// Over a queue whose partition ids are interleaved with another queue's,
// after a reopen (nothing cached) and pushes into every third partition
// (those cached again), a group reading from the start is delivered every
// message of its queue exactly once, none of the other queue's (whose
// partitions have the same names and other counts), and not the message it
// acknowledged before the reopen.
func TestBackfillCachedAndStoredRecords(t *testing.T) {
	h := newHarness(t)
	const n = 300
	for i := range n {
		h.push("q", fmt.Sprintf("p%03d", i), `1`)
		h.push("r", fmt.Sprintf("p%03d", i), `1`)
	}
	acked := "p007"
	r := h.pop(Pop{Queue: "q", Partition: &acked, Group: "g", SubMode: "all", Batch: 1, Partitions: 1, LeaseSeconds: 60})
	if len(r.Messages) != 1 {
		t.Fatalf("pop of %s: %d messages", acked, len(r.Messages))
	}
	if a := h.ack(AckItem{PartitionID: r.Messages[0].PartitionID, TxID: r.Messages[0].TxID, Status: AckCompleted, Group: "g", LeaseID: r.LeaseID}); !a.Items[0].Success {
		t.Fatalf("ack: %+v", a.Items[0])
	}
	h.reopen()
	want := map[string]int{}
	for i := range n {
		p := fmt.Sprintf("p%03d", i)
		want[p]++
		if i%3 == 0 {
			h.push("q", p, `2`)
			want[p]++
		}
		if i%5 == 0 {
			h.push("r", p, `2`)
		}
	}
	want[acked]--
	got := map[string]int{}
	for pops := 0; ; pops++ {
		if pops > 2*n {
			t.Fatal("the pops do not end")
		}
		r := h.pop(Pop{Queue: "q", Group: "g", Batch: 10, Partitions: 7, LeaseSeconds: 60})
		if len(r.Messages) == 0 {
			break
		}
		items := make([]AckItem, 0, len(r.Messages))
		for _, m := range r.Messages {
			got[m.Partition]++
			items = append(items, AckItem{PartitionID: m.PartitionID, TxID: m.TxID, Status: AckCompleted, Group: "g", LeaseID: r.LeaseID})
		}
		h.ack(items...)
	}
	for p, k := range want {
		if got[p] != k {
			t.Errorf("%s: delivered %d messages, want %d", p, got[p], k)
		}
	}
	if len(got) > len(want) {
		t.Errorf("delivered from %d partitions, want %d", len(got), len(want))
	}
}
