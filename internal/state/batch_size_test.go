package state

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
)

// TestLargeApplyBatchAllocatesOnce: an ApplyBatch of many large pushes (64
// requests of 100 payloads of 1 KiB, as 64 producers' pushes arrive in one
// round) builds its Pebble batch in one buffer sized from the entries,
// not by doubling from Pebble's default: the batch never outgrows the size
// it started at, and (without the race detector, whose Pebble allocates its
// memtables on the Go heap) the heap bytes a round allocates (the batch,
// its index, the decoded commands) stay within twice the entries' bytes;
// doubling costs about twice the batch by itself.
func TestLargeApplyBatchAllocatesOnce(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 0))
	h := newHarness(t)
	h.push("q", "p", "warm")
	for round := range 2 {
		applyLargeRound(t, h, r, round)
	}
}

// applyLargeRound applies 64 entries of 100 payloads of 1 KiB in one
// ApplyBatch and checks the bytes it allocated.
func applyLargeRound(t *testing.T, h *harness, r *rand.Rand, round int) {
	const requests, items, size = 64, 100, 1024
	payload := make([]byte, size)
	entries := make([]LogEntry, requests)
	entryBytes := 0
	for i := range entries {
		c := &Push{Tenant: "default", Items: make([]PushItem, items)}
		for j := range c.Items {
			for k := range payload {
				payload[k] = 'a' + byte(r.IntN(26))
			}
			c.Items[j] = PushItem{Queue: "q", Partition: "p", TxID: fmt.Sprintf("0190a8c4-%04x-7000-8000-%012x", round, i<<16|j), Generated: true, Payload: append([]byte(nil), payload...)}
		}
		data, err := EncodeEntry(&Entry{Time: h.now, Cmds: []Command{c}})
		if err != nil {
			t.Fatal(err)
		}
		h.index++
		entries[i] = LogEntry{Index: h.index, Data: data}
		entryBytes += len(data)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	res, err := h.s.ApplyBatch(entries)
	if err != nil {
		t.Fatal(err)
	}
	h.s.waitCommitted()
	runtime.ReadMemStats(&after)
	for i, rs := range res {
		if pr := rs[0].(*PushResult); pr.Err != nil || len(pr.Items) != items {
			t.Fatalf("entry %d: push result %+v", i, pr.Err)
		}
	}
	if h.s.sizer.sized == 0 || h.s.sizer.grew {
		t.Fatalf("round %d: the apply's batch started at %d bytes and grew past it", round, h.s.sizer.sized)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	ratio := float64(alloc) / float64(entryBytes)
	t.Logf("round %d: entries of %d bytes, batch sized %d, the apply allocated %d bytes (%.2f×)", round, entryBytes, h.s.sizer.sized, alloc, ratio)
	if raceEnabled {
		t.Logf("round %d: the heap bound is not checked under the race detector (its Pebble allocates memtables on the Go heap)", round)
		return
	}
	if ratio > 2 {
		t.Fatalf("round %d: applying %d bytes of entries allocated %d bytes on the heap (%.2f×, want at most 2×): the batch grew by doubling", round, entryBytes, alloc, ratio)
	}
}
