package state

import (
	"fmt"
	"runtime"
	"testing"
)

// A pop that asks for many messages and gets few keeps only what it
// delivered alive: its result outlives the apply (the cluster keeps it for
// retries, the reply holds it), so long-polling consumers asking for 1,000
// at a time must not each pin a message slice and an arena chunk sized for
// 1,000.
func TestPopResultSizedToWhatItDelivered(t *testing.T) {
	h := newHarness(t)
	const pops = 300
	results := make([]*PopResult, 0, pops)
	for i := range pops {
		h.push("q", fmt.Sprintf("p%d", i), fmt.Sprintf(`{"n":%d,"pad":"0123456789012345678901234567890123456789"}`, i))
		r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 1000, Partitions: 1, LeaseSeconds: 60})
		if r.Err != nil || len(r.Messages) != 1 {
			t.Fatalf("pop %d: %+v", i, r)
		}
		if c := cap(r.Messages); c > 2 {
			t.Fatalf("pop %d: delivered 1 message in a slice of capacity %d", i, c)
		}
		results = append(results, r)
		empty := h.pop(Pop{Queue: "q", Group: "g", Batch: 1000, Partitions: 1, LeaseSeconds: 60})
		if empty.Err != nil || len(empty.Messages) != 0 || cap(empty.Messages) != 0 {
			t.Fatalf("empty pop %d: %d messages, capacity %d", i, len(empty.Messages), cap(empty.Messages))
		}
		results = append(results, empty)
	}
	// What the results alone keep alive: the heap with them, less the
	// heap once they are dropped.
	var with, without runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&with)
	runtime.KeepAlive(results)
	results = nil
	runtime.GC()
	runtime.ReadMemStats(&without)
	perPop := (int64(with.HeapAlloc) - int64(without.HeapAlloc)) / pops
	t.Logf("heap kept per pair of pops: %d bytes", perPop)
	if perPop > 4<<10 {
		t.Fatalf("each pair of pops (one message, then none) keeps %d bytes alive, want under 4 KiB", perPop)
	}
}
