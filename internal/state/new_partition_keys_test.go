package state

import (
	"fmt"
	"testing"
)

// newRows pushes one message to each of the partitions row-from..row-to-1
// of a queue, in one command.
func (h *harness) newRows(tenant, queue string, from, to int) *PushResult {
	h.t.Helper()
	c := &Push{Tenant: tenant}
	for i := from; i < to; i++ {
		c.Items = append(c.Items, PushItem{Queue: queue, Partition: fmt.Sprintf("row-%d", i), TxID: fmt.Sprintf("%s-tx-%d-%d", queue, i, h.index), Payload: []byte(`1`)})
	}
	r := h.apply(c)[0].(*PushResult)
	if r.Err != nil {
		h.t.Fatalf("push: %v", r.Err)
	}
	return r
}

// partQueueOf resolves a partition id to its queue id the way acks do,
// and returns the id of the queue named queue.
func (h *harness) partQueueOf(tenant string, pid uint64, queue string) (got, want uint64) {
	h.t.Helper()
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	h.s.waitCommitted()
	ac := h.s.newApplyCtx(0)
	defer ac.b.Close()
	tid, ok := ac.tenantID(tenant, false)
	if !ok {
		h.t.Fatalf("no tenant %s", tenant)
	}
	if q := ac.queueByName(tid, queue); q != nil {
		want = q.ID
	}
	return ac.partQueue(tid, pid), want
}

// TestNewPartitionKeys: a push into new partitions writes, per partition,
// its name, its record, its message and one ready key per group; no dedup
// key (the record holds the first message's id), no cursor record, and one
// locator key for all the partitions one command creates in one queue. Every partition still resolves to its
// queue (and only for its tenant) from the cache and after a reopen, and
// deleting a queue removes its locator keys.
func TestNewPartitionKeys(t *testing.T) {
	h := newHarness(t)
	h.push("q", "existing", `0`)
	// A consumer group besides queue mode: two ready keys per partition.
	h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 1, Partitions: 1})
	before := map[byte]int{}
	tables := []byte{tPartName, tPart, tPartLoc, tMsg, tDedup, tCursor, tReady}
	for _, tb := range tables {
		before[tb] = h.countKeys(tb)
	}
	type owner struct{ tenant, queue string }
	pids := map[uint64]owner{}
	note := func(tenant, queue string, r *PushResult) {
		for _, it := range r.Items {
			pids[it.PartitionID] = owner{tenant, queue}
		}
	}
	sizes := []int{1000, 200, 1, 200}
	n := 0
	for _, size := range sizes {
		note("default", "q", h.newRows("default", "q", n, n+size))
		n += size
	}
	want := map[byte]int{tPartName: n, tPart: n, tPartLoc: len(sizes), tMsg: n, tDedup: 0, tCursor: 0, tReady: 2 * n}
	for _, tb := range tables {
		if got := h.countKeys(tb) - before[tb]; got != want[tb] {
			t.Errorf("table %#x: %d new keys for %d new partitions in %d pushes, want %d", tb, got, n, len(sizes), want[tb])
		}
	}

	// Items alternating between two queues, and another tenant's
	// partitions: runs of one.
	c := &Push{Tenant: "default"}
	for i := 0; i < 10; i++ {
		c.Items = append(c.Items, PushItem{Queue: []string{"a", "b"}[i%2], Partition: fmt.Sprintf("mixed-%d", i), TxID: fmt.Sprintf("mixed-%d", i), Payload: []byte(`2`)})
	}
	r := h.apply(c)[0].(*PushResult)
	for i, it := range r.Items {
		pids[it.PartitionID] = owner{"default", c.Items[i].Queue}
	}
	note("other", "q", h.newRows("other", "q", 0, 50))

	check := func(when string) {
		t.Helper()
		for pid, o := range pids {
			if got, want := h.partQueueOf(o.tenant, pid, o.queue); got != want || want == 0 {
				t.Fatalf("%s: partition %d of %v resolves to queue %d, want %d", when, pid, o, got, want)
			}
			other := "other"
			if o.tenant == "other" {
				other = "default"
			}
			if got, _ := h.partQueueOf(other, pid, o.queue); got != 0 {
				t.Fatalf("%s: partition %d of %v resolves for tenant %s to queue %d", when, pid, o, other, got)
			}
		}
	}
	check("cached")
	h.reopen()
	check("reopened")

	locs := h.countKeys(tPartLoc)
	if d := h.apply(&DeleteQueue{Tenant: "default", Queue: "a"})[0].(*CountResult); !d.Found {
		t.Fatal("queue a not deleted")
	}
	if got := locs - h.countKeys(tPartLoc); got != 5 {
		t.Fatalf("deleting queue a removed %d locator keys, want its 5", got)
	}
	for pid, o := range pids {
		if o == (owner{"default", "a"}) {
			if got, _ := h.partQueueOf("default", pid, "a"); got != 0 {
				t.Fatalf("partition %d of the deleted queue a resolves to queue %d", pid, got)
			}
			delete(pids, pid)
		}
	}
	check("after deleting a")
	h.reopen()
	check("after deleting a, reopened")
}

// TestDerivedCursorsAcrossRestart: partitions created by a push get no
// cursor record until a consumer changes one; across reopens (caches
// gone), their cursors are derived and their ready flag read from the
// ready index, so every message is delivered exactly once and the ready
// index empties once all is consumed.
func TestDerivedCursorsAcrossRestart(t *testing.T) {
	h := newHarness(t)
	h.newRows("default", "d", 0, 300)
	if n := h.countKeys(tCursor); n != 0 {
		t.Fatalf("%d cursor records after pushes into new partitions, want 0", n)
	}
	h.reopen()
	// A second message in a third of them: their cursors are derived, and
	// the ready keys already there.
	h.newRows("default", "d", 0, 100)
	if n, r := h.countKeys(tCursor), h.countKeys(tReady); n != 0 || r != 300 {
		t.Fatalf("%d cursor records and %d ready keys, want 0 and 300", n, r)
	}
	seen := map[[2]uint64]bool{}
	consume := func(when string, want int) {
		t.Helper()
		got := 0
		for {
			r := h.pop(Pop{Queue: "d", Batch: 1000, Partitions: 1000, AutoAck: true})
			if r.Err != nil {
				t.Fatalf("%s: pop: %v", when, r.Err)
			}
			if len(r.Messages) == 0 {
				break
			}
			for _, m := range r.Messages {
				k := [2]uint64{m.PartitionID, m.Offset}
				if seen[k] {
					t.Fatalf("%s: message %v delivered twice", when, k)
				}
				seen[k] = true
				got++
			}
		}
		if got != want {
			t.Fatalf("%s: %d messages delivered, want %d", when, got, want)
		}
		if r := h.countKeys(tReady); r != 0 {
			t.Fatalf("%s: %d ready keys left once all is consumed", when, r)
		}
	}
	consume("first", 400)
	h.reopen()
	h.newRows("default", "d", 0, 50)
	h.newRows("default", "d", 250, 300)
	consume("after a reopen", 100)
	h.reopen()
	consume("nothing new", 0)
}

// TestNewPartitionNamesCached: creating a partition caches its name
// lookup, so that pushes that come back to it by name (a queue of a million
// partitions pushed at random) read no name key; a push to one of them
// appends to it rather than creating another, and after a reopen the name
// key finds it.
func TestNewPartitionNamesCached(t *testing.T) {
	h := newHarness(t)
	cached := func() int {
		h.s.mu.Lock()
		defer h.s.mu.Unlock()
		return h.s.cache.partIDs.len()
	}
	before := cached()
	r := h.newRows("default", "q", 0, 500)
	if got := cached() - before; got != 500 {
		t.Fatalf("creating 500 partitions cached %d name lookups, want 500", got)
	}
	for _, i := range []int{0, 250, 499} {
		again := h.push("q", fmt.Sprintf("row-%d", i), `2`)
		it := again.Items[0]
		if it.PartitionID != r.Items[i].PartitionID || it.Offset != 1 {
			t.Fatalf("push to row-%d went to partition %d offset %d, want partition %d offset 1", i, it.PartitionID, it.Offset, r.Items[i].PartitionID)
		}
	}
	if got := cached() - before; got != 500 {
		t.Fatalf("three pushes by name to existing partitions left %d lookups cached, want 500", got)
	}
	h.reopen()
	again := h.push("q", "row-7", `2`)
	if it := again.Items[0]; it.PartitionID != r.Items[7].PartitionID || it.Offset != 1 {
		t.Fatalf("after a reopen, push to row-7 went to partition %d offset %d, want %d offset 1", it.PartitionID, it.Offset, r.Items[7].PartitionID)
	}
}

// TestFirstMessageIDInRecord: the first message of a partition created by
// a push has no dedup key; its partition record holds its transaction id.
// Pushing the same id to the partition again is still a duplicate (in the
// same batch's cache, after the cache is dropped, after a reopen), an ack
// by that id finds the message, a different id is new, and once
// retention removed the message the id may be stored again. Records
// without the id (version 1) still decode.
func TestFirstMessageIDInRecord(t *testing.T) {
	h := newHarness(t)
	h.configure("q", map[string]string{"retentionSeconds": "60"})
	first := h.newRows("default", "q", 0, 50)
	if n := h.countKeys(tDedup); n != 0 {
		t.Fatalf("%d dedup keys for 50 first messages, want 0", n)
	}
	repush := func(when string, i int, txid string) PushItemResult {
		t.Helper()
		r := h.apply(&Push{Tenant: "default", Items: []PushItem{{Queue: "q", Partition: fmt.Sprintf("row-%d", i), TxID: txid, Payload: []byte(`2`)}}})[0].(*PushResult)
		if r.Err != nil {
			t.Fatalf("%s: push: %v", when, r.Err)
		}
		return r.Items[0]
	}
	check := func(when string, i int) {
		t.Helper()
		want := first.Items[i]
		got := repush(when, i, want.TxID)
		if !got.Duplicate || got.PartitionID != want.PartitionID || got.Offset != 0 {
			t.Fatalf("%s: the first message's id again: %+v, want a duplicate of partition %d offset 0", when, got, want.PartitionID)
		}
	}
	check("cached", 3)
	h.s.mu.Lock()
	h.s.cache = newRecordCache()
	h.s.mu.Unlock()
	check("uncached", 4)
	h.reopen()
	check("reopened", 5)
	// A new id in the same partition is a new message, with a dedup key.
	if got := repush("new id", 5, "other-id"); got.Duplicate || got.Offset != 1 {
		t.Fatalf("a new id: %+v, want offset 1", got)
	}
	check("after a second message", 5)
	// An ack by the first message's id finds it.
	h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Partition: ptr("row-6"), Batch: 10, LeaseSeconds: 30})
	a := h.ack(AckItem{PartitionID: first.Items[6].PartitionID, TxID: first.Items[6].TxID, Status: AckCompleted, Group: "g"})
	if len(a.Items) != 1 || a.Items[0].Error != "" {
		t.Fatalf("ack by the first message's id: %+v", a.Items)
	}
	// Retention removes the first messages: their ids may come again.
	h.now += 70e6
	for i := 0; i < 5; i++ {
		h.apply(&Tick{})
		h.now += 5e6
	}
	if got := repush("after retention", 7, first.Items[7].TxID); got.Duplicate || got.Offset != 1 {
		t.Fatalf("the id of a message retention removed: %+v, want a new message at offset 1", got)
	}
	// Both record versions round-trip.
	for _, p := range []*partRec{{Queue: 1, Name: "a"}, {Queue: 1, Name: "a", FirstTx: "tx"}} {
		p.markTail()
		d, err := decodePart(p.encode())
		if err != nil || d.Name != "a" || d.FirstTx != p.FirstTx {
			t.Fatalf("record %+v does not round-trip: %+v, %v", p, d, err)
		}
	}
	if v := (&partRec{Name: "a"}).encode()[0]; v != 1 {
		t.Fatalf("a record without a first id is version %d, want 1", v)
	}
}
