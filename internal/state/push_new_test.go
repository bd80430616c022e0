package state

import (
	"fmt"
	"math/rand"
	"testing"
	"time"
)

// TestPushNewPartitionsReadsNothing: a push whose items each go to a
// partition that does not exist yet (one partition per row key) reads
// almost no key from Pebble: no partition name (the queue's name filter rules it
// out), no cursor (a partition created in the batch has none). It also
// checks that the answers are those of a store that reads: repeated ids are
// found, existing partitions are reused, and a reopened store (no filters)
// agrees.
func TestPushNewPartitionsReadsNothing(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	h := newHarness(t)
	h.push("q", "existing", `0`)
	// A consumer group besides queue mode: two cursors per partition.
	h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 1, Partitions: 1})
	const n = 2500 // more than a first filter holds: it is rebuilt
	items := func(from, to int) *Push {
		c := &Push{Tenant: "default"}
		for i := from; i < to; i++ {
			c.Items = append(c.Items, PushItem{Queue: "q", Partition: fmt.Sprintf("row-%d", i), TxID: fmt.Sprintf("tx-%d", i), Payload: []byte(`1`)})
		}
		return c
	}
	got := map[string][2]uint64{} // txid -> partition id, offset
	for from := 0; from < n; {
		to := min(n, from+1+rng.Intn(700))
		before := h.s.pointReads
		r := h.apply(items(from, to))[0].(*PushResult)
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		// The first push builds the filter (a scan, not point reads). A
		// filter holds about 1% of names never added: those are read, so
		// a push of a few items may read one or two.
		if reads := h.s.pointReads - before; reads > uint64(to-from)/20+3 {
			t.Fatalf("a push of items %d..%d into new partitions made %d point reads, want at most 5%% of %d, and 3 more", from, to, reads, to-from)
		}
		for i, it := range r.Items {
			if it.Duplicate || it.Offset != 0 {
				t.Fatalf("item %d: %+v, want a new message at offset 0", from+i, it)
			}
			got[it.TxID] = [2]uint64{it.PartitionID, it.Offset}
		}
		from = to
	}
	check := func(when string) {
		t.Helper()
		if qi := h.queueInfo("q"); qi.Partitions != n+1 || qi.Total != n+1 {
			t.Fatalf("%s: %d partitions and %d messages, want %d of each", when, qi.Partitions, qi.Total, n+1)
		}
		// Repeats are found in the partitions they went to; new messages for
		// existing names go to the same partitions.
		c := items(0, n)
		for i := range c.Items {
			if i%2 == 1 {
				c.Items[i].TxID += "-again"
			}
		}
		r := h.apply(c)[0].(*PushResult)
		for i, it := range r.Items {
			want := got[fmt.Sprintf("tx-%d", i)]
			if i%2 == 0 && (!it.Duplicate || it.PartitionID != want[0] || it.Offset != want[1]) {
				t.Fatalf("%s: repeat of item %d: %+v, want a duplicate at %v", when, i, it, want)
			}
			if i%2 == 1 && (it.Duplicate || it.PartitionID != want[0] || it.Offset == 0) {
				t.Fatalf("%s: new message for row %d: %+v, want a new offset in partition %d", when, i, it, want[0])
			}
			if i%2 == 1 {
				got[it.TxID] = [2]uint64{it.PartitionID, it.Offset}
			}
		}
	}
	check("same store")
	h.reopen()
	// After the reopen the odd rows hold two messages; repeat only the
	// first ones again.
	c := items(0, n)
	r := h.apply(c)[0].(*PushResult)
	for i, it := range r.Items {
		want := got[fmt.Sprintf("tx-%d", i)]
		if !it.Duplicate || it.PartitionID != want[0] || it.Offset != want[1] {
			t.Fatalf("after reopen: repeat of item %d: %+v, want a duplicate at %v", i, it, want)
		}
	}
	// Every message reaches the group.
	seen := 0
	for {
		p := h.pop(Pop{Queue: "q", Group: "g", Batch: 1000, Partitions: 1000, AutoAck: true})
		if p.Err != nil {
			t.Fatal(p.Err)
		}
		if len(p.Messages) == 0 {
			break
		}
		seen += len(p.Messages)
	}
	// (The first pop leased the message of "existing".)
	if want := n + n/2; seen != want {
		t.Fatalf("group g got %d messages, want %d", seen, want)
	}
	// A deleted and re-created queue gets new partitions for the same names.
	h.apply(&DeleteQueue{Tenant: "default", Queue: "q"})
	r = h.apply(items(0, 10))[0].(*PushResult)
	for i, it := range r.Items {
		if it.Duplicate || it.Offset != 0 || it.PartitionID == got[fmt.Sprintf("tx-%d", i)][0] {
			t.Fatalf("re-created queue, item %d: %+v, want a new partition", i, it)
		}
	}
}

// TestNameFilter: every added name is held; most others are not.
func TestNameFilter(t *testing.T) {
	f := newNameFilter(0)
	for i := 0; i < 1024; i++ {
		f.set(nameHash([]byte(fmt.Sprintf("n%d", i))))
	}
	if f.full() {
		t.Fatal("a filter sized for 1024 names is full at 1024")
	}
	other := 0
	for i := 0; i < 1024; i++ {
		if !f.mayHold(nameHash([]byte(fmt.Sprintf("n%d", i)))) {
			t.Fatalf("added name n%d is not held", i)
		}
		if f.mayHold(nameHash([]byte(fmt.Sprintf("m%d", i)))) {
			other++
		}
	}
	if other > 50 {
		t.Fatalf("%d of 1024 names never added are held, want about 1%%", other)
	}
	f.set(nameHash([]byte("one more")))
	if !f.full() {
		t.Fatal("a filter past its size is not full")
	}
}
