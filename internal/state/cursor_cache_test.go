package state

import (
	"fmt"
	"math/rand"
	"os"
	"strconv"
	"testing"
	"time"
)

// TestCursorCacheCompact: over many partitions, a push caches no derived
// cursor of a partition without cursor records, a group's cursors that
// have nothing in flight once a batch ends are kept as values (settled),
// not as records, and a pop that leases writes no cursor record (its lease
// record carries the change). None of it changes a result: a store that
// reopens (every cache gone) after each step gets the same replies and
// ends with the same checksum, every message is delivered, acked, and not
// delivered again, but for those whose lease lapses, which come again with
// their attempt counted.
func TestCursorCacheCompact(t *testing.T) {
	seed := time.Now().UnixNano()
	if v, err := strconv.ParseInt(os.Getenv("QUEEN_CACHE_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (QUEEN_CACHE_SEED=%d repeats it)", seed, seed)
	rng := rand.New(rand.NewSource(seed))
	cached, cold := newHarness(t), newHarness(t)
	both := func(f func(h *harness) string) {
		t.Helper()
		a, b := f(cached), f(cold)
		if a != b {
			t.Fatalf("cached store: %s\nreopened store: %s", a, b)
		}
		cold.reopen()
	}
	const parts = 2000
	tx := 0
	push := func(names []int) {
		both(func(h *harness) string {
			c := &Push{Tenant: "default"}
			for i, n := range names {
				c.Items = append(c.Items, PushItem{Queue: "q", Partition: fmt.Sprintf("p%05d", n), TxID: fmt.Sprintf("tx-%d-%d", tx, i), Payload: []byte(`1`)})
			}
			r := h.apply(c)[0].(*PushResult)
			if r.Err != nil {
				t.Fatalf("push: %v", r.Err)
			}
			return fmt.Sprint(r.Items)
		})
		tx++
	}
	all := make([]int, parts)
	for i := range all {
		all[i] = i
	}
	push(all)
	cursors := func() (records, settled int) {
		cached.s.mu.Lock()
		defer cached.s.mu.Unlock()
		for _, c := range cached.s.cache.cursors {
			if c != nil { // nil: cached as absent (backfill)
				records++
			}
		}
		return records, cached.s.cache.settled.len()
	}
	if n, _ := cursors(); n != 0 {
		t.Fatalf("%d cursors cached after pushes into new partitions, want 0", n)
	}
	pushed, delivered, leased, redelivered := parts, 0, 0, 0
	seen := map[[2]uint64]bool{}
	left := map[[2]uint64]bool{}  // delivered, not acknowledged, leased
	again := map[[2]uint64]bool{} // lapsed: to come again
	attempt := map[[2]uint64]uint32{}

	for round := 0; round < 60; round++ {
		names := make([]int, 20+rng.Intn(80))
		for i := range names {
			names[i] = rng.Intn(parts)
		}
		push(names)
		pushed += len(names)
		if n, _ := cursors(); n > leased+len(again) {
			t.Fatalf("round %d: %d cursors cached as records, want at most the %d leased ones and the %d whose lease lapsed", round, n, leased, len(again))
		}
		if round%20 == 19 {
			// The leases left lapse: their messages come again.
			both(func(h *harness) string {
				h.now += 301e6
				return fmt.Sprint(h.apply(&Tick{})[0])
			})
			for k := range left {
				again[k] = true
			}
			clear(left)
			leased = 0
		}
		var got []Delivered
		lease := fmt.Sprintf("00000000-0000-4000-8000-%012d", round)
		before := cursorRecords(t, cold)
		both(func(h *harness) string {
			r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 100, Partitions: 100, LeaseSeconds: 300, LeaseID: lease})
			if r.Err != nil {
				t.Fatalf("pop: %v", r.Err)
			}
			got = r.Messages
			return fmt.Sprint(offsetsByPart(r))
		})
		// A pop that leases writes no cursor: its lease record carries
		// what it changed (the expired leases, ended by the Tick, wrote
		// theirs).
		if after := cursorRecords(t, cold); after != before {
			t.Fatalf("round %d: the pop wrote %d cursor records", round, after-before)
		}
		for _, m := range got {
			k := [2]uint64{m.PartitionID, m.Offset}
			if again[k] {
				if m.Attempt != attempt[k]+1 {
					t.Fatalf("round %d: message %v came again with attempt %d, want %d", round, k, m.Attempt, attempt[k]+1)
				}
				attempt[k] = m.Attempt
				delete(again, k)
				redelivered++
				continue
			}
			if seen[k] {
				t.Fatalf("round %d: message %v delivered twice", round, k)
			}
			if m.Attempt != 1 {
				t.Fatalf("round %d: message %v delivered first with attempt %d", round, k, m.Attempt)
			}
			seen[k], attempt[k] = true, 1
		}
		delivered += len(got)
		// Ack all but, now and then, the last one (its partition stays
		// leased, its cursor a record).
		n := len(got)
		if n > 1 && rng.Intn(3) == 0 {
			n--
			leased++
			left[[2]uint64{got[n].PartitionID, got[n].Offset}] = true
		}
		items := make([]AckItem, n)
		for j, m := range got[:n] {
			items[j] = AckItem{PartitionID: m.PartitionID, TxID: m.TxID, Status: AckCompleted, Group: "g", LeaseID: lease}
		}
		both(func(h *harness) string { return fmt.Sprint(h.ack(items...).Items) })
		if _, s := cursors(); round > 0 && s == 0 {
			t.Fatalf("round %d: no settled cursor after %d acks", round, delivered)
		}
	}
	if a, b := checksum(t, cached.s), checksum(t, cold.s); a != b {
		t.Fatalf("checksums differ: cached %x, reopened %x", a, b)
	}
	if delivered == 0 || delivered > pushed+redelivered {
		t.Fatalf("%d delivered of %d pushed", delivered, pushed)
	}
	t.Logf("%d delivered, %d of them again after their lease lapsed", delivered, redelivered)
	if redelivered == 0 {
		t.Fatal("no lease lapsed and came again")
	}
}

// offsetsByPart lists a pop's deliveries as partition:offset.
func offsetsByPart(r *PopResult) []string {
	out := make([]string, len(r.Messages))
	for i, m := range r.Messages {
		out[i] = fmt.Sprintf("%d:%d", m.PartitionID, m.Offset)
	}
	return out
}
