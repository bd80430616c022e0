package state

import (
	"fmt"
	"testing"
)

// TestPushIndexesNewNames: a push indexes the names of the partitions it
// creates (name lookups and the queue's name filter) after its items are
// written. A push that mixes existing and new partitions, repeats a new
// name, and creates more names than the queue's filter was sized for must
// leave every name findable: by the next command of the same batch, by a
// later batch, with the caches dropped, and after a reopen.
func TestPushIndexesNewNames(t *testing.T) {
	// 300 new names fit the filter the first push built (1,024 names);
	// 3,000 fill it during the indexing, which drops it for a rebuild.
	for _, fresh := range []int{300, 3000} {
		t.Run(fmt.Sprint(fresh), func(t *testing.T) { testPushIndexesNewNames(t, fresh) })
	}
}

func testPushIndexesNewNames(t *testing.T, fresh int) {
	h := newHarness(t)
	const old = 100
	var oldItems []PushItem
	for i := 0; i < old; i++ {
		oldItems = append(oldItems, PushItem{Queue: "q", Partition: fmt.Sprintf("old-%d", i), TxID: fmt.Sprintf("o-%d", i), Payload: []byte(`0`)})
	}
	r0 := h.apply(&Push{Tenant: "default", Items: oldItems})[0].(*PushResult)
	if r0.Err != nil {
		t.Fatal(r0.Err)
	}
	oldIDs := map[string]uint64{}
	for i, it := range r0.Items {
		oldIDs[oldItems[i].Partition] = it.PartitionID
	}

	// Command A: new names interleaved with existing ones, new-5 twice.
	var a []PushItem
	for i := 0; i < fresh; i++ {
		a = append(a, PushItem{Queue: "q", Partition: fmt.Sprintf("new-%d", i), TxID: fmt.Sprintf("a-%d", i), Payload: []byte(`1`)})
		if i < old {
			a = append(a, PushItem{Queue: "q", Partition: fmt.Sprintf("old-%d", i), TxID: fmt.Sprintf("a-old-%d", i), Payload: []byte(`1`)})
		}
		if i == 5 {
			a = append(a, PushItem{Queue: "q", Partition: "new-5", TxID: "a-5-again", Payload: []byte(`1`)})
		}
	}
	// Command B, in the same entry: every new name again.
	var b []PushItem
	for i := 0; i < fresh; i++ {
		b = append(b, PushItem{Queue: "q", Partition: fmt.Sprintf("new-%d", i), TxID: fmt.Sprintf("b-%d", i), Payload: []byte(`2`)})
	}
	res := h.apply(&Push{Tenant: "default", Items: a}, &Push{Tenant: "default", Items: b})
	ra, rb := res[0].(*PushResult), res[1].(*PushResult)
	if ra.Err != nil || rb.Err != nil {
		t.Fatalf("push: %v, %v", ra.Err, rb.Err)
	}
	newIDs := map[string]uint64{}
	seen := map[uint64]string{}
	for i, it := range ra.Items {
		name := a[i].Partition
		if id, ok := oldIDs[name]; ok {
			if it.PartitionID != id || it.Offset != 1 {
				t.Fatalf("%s in the mixed push: partition %d offset %d, want %d offset 1", name, it.PartitionID, it.Offset, id)
			}
			continue
		}
		if id, ok := newIDs[name]; ok {
			if it.PartitionID != id || it.Offset != 1 {
				t.Fatalf("%s repeated in the push: partition %d offset %d, want %d offset 1", name, it.PartitionID, it.Offset, id)
			}
			continue
		}
		if other, ok := seen[it.PartitionID]; ok || it.Offset != 0 {
			t.Fatalf("%s: partition %d offset %d (partition also %q)", name, it.PartitionID, it.Offset, other)
		}
		newIDs[name], seen[it.PartitionID] = it.PartitionID, name
	}
	if len(newIDs) != fresh {
		t.Fatalf("%d new partitions, want %d", len(newIDs), fresh)
	}
	checkB := func(when string, r *PushResult, items []PushItem, offsetOf func(name string) uint64) {
		t.Helper()
		for i, it := range r.Items {
			name := items[i].Partition
			if it.PartitionID != newIDs[name] || it.Offset != offsetOf(name) {
				t.Fatalf("%s: push to %s went to partition %d offset %d, want %d offset %d", when, name, it.PartitionID, it.Offset, newIDs[name], offsetOf(name))
			}
		}
	}
	off := func(base uint64) func(string) uint64 {
		return func(name string) uint64 {
			if name == "new-5" {
				return base + 1
			}
			return base
		}
	}
	checkB("the next command of the batch", rb, b, off(1))

	// The caches hold every new name: the lookups and the filter.
	h.s.mu.Lock()
	qid := h.s.cache.queueNames[string(queueNameKey(1, "q"))]
	f := h.s.cache.filters[queueRef{1, qid}]
	for name, id := range newIDs {
		hash := nameHash(partNameKey(1, qid, name))
		if got, ok := h.s.cache.partIDs.get(hash); !ok || got != id {
			t.Fatalf("name lookup of %s: %d, %v; want %d", name, got, ok, id)
		}
	}
	if fresh < 1024 && f == nil {
		t.Fatal("the queue's name filter was dropped")
	}
	for name := range newIDs {
		hash := nameHash(partNameKey(1, qid, name))
		if f != nil && !f.mayHold(hash) {
			t.Fatalf("the queue's name filter does not hold %s", name)
		}
	}
	h.s.mu.Unlock()

	pushAll := func(when string, base uint64, tx string) {
		t.Helper()
		var c []PushItem
		for i := 0; i < fresh; i += 7 {
			c = append(c, PushItem{Queue: "q", Partition: fmt.Sprintf("new-%d", i), TxID: fmt.Sprintf("%s-%d", tx, i), Payload: []byte(`3`)})
		}
		r := h.apply(&Push{Tenant: "default", Items: c})[0].(*PushResult)
		if r.Err != nil {
			t.Fatalf("%s: %v", when, r.Err)
		}
		checkB(when, r, c, off(base))
	}
	pushAll("a later batch", 2, "c")
	h.s.mu.Lock()
	h.s.cache = newRecordCache()
	h.s.mu.Unlock()
	pushAll("with the caches dropped", 3, "d")
	h.reopen()
	pushAll("after a reopen", 4, "e")
}
