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
	// What the results alone keep alive: the heap with them, less the heap
	// once they are dropped. Other work in the process (a store of an
	// earlier test still closing) can move the heap between the two reads,
	// so the test fails only when three trials in a row exceed the bound.
	var kept []int64
	for trial := range 3 {
		results := make([]*PopResult, 0, 2*pops)
		for i := range pops {
			h.push("q", fmt.Sprintf("t%d-p%d", trial, i), fmt.Sprintf(`{"n":%d,"pad":"0123456789012345678901234567890123456789"}`, i))
			r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 1000, Partitions: 1, LeaseSeconds: 60})
			if r.Err != nil || len(r.Messages) != 1 {
				t.Fatalf("trial %d, pop %d: %+v", trial, i, r)
			}
			if c := cap(r.Messages); c > 2 {
				t.Fatalf("trial %d, pop %d: delivered 1 message in a slice of capacity %d", trial, i, c)
			}
			results = append(results, r)
			empty := h.pop(Pop{Queue: "q", Group: "g", Batch: 1000, Partitions: 1, LeaseSeconds: 60})
			if empty.Err != nil || len(empty.Messages) != 0 || cap(empty.Messages) != 0 {
				t.Fatalf("trial %d, empty pop %d: %d messages, capacity %d", trial, i, len(empty.Messages), cap(empty.Messages))
			}
			results = append(results, empty)
		}
		var with, without runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&with)
		runtime.KeepAlive(results)
		results = nil
		runtime.GC()
		runtime.ReadMemStats(&without)
		perPop := (int64(with.HeapAlloc) - int64(without.HeapAlloc)) / pops
		t.Logf("trial %d: heap kept per pair of pops: %d bytes", trial, perPop)
		if perPop <= 4<<10 {
			return
		}
		kept = append(kept, perPop)
	}
	t.Fatalf("each pair of pops (one message, then none) keeps %v bytes alive in three trials, want under 4 KiB", kept)
}
