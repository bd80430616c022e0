package state

import (
	"math/rand"
	"testing"
	"time"
)

// TestPartCacheModel: the partition cache (a window of the ids this store
// created, a map for the rest) answers every lookup as a plain map does,
// through new ids in order, gaps, an id far ahead (the window starts
// again), records read from Pebble, "absent" entries, deletes and trims.
func TestPartCacheModel(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	c := newPartCache()
	model := map[uint64]*partRec{}
	next := uint64(1)
	check := func(step int) {
		t.Helper()
		if c.len() != len(model) {
			t.Fatalf("step %d: len %d, want %d", step, c.len(), len(model))
		}
		for pid, want := range model {
			if got, ok := c.get(pid); !ok || got != want {
				t.Fatalf("step %d: get(%d) = %p %v, want %p", step, pid, got, ok, want)
			}
		}
		seen := 0
		c.each(func(pid uint64, p *partRec) {
			if want, ok := model[pid]; !ok || want != p {
				t.Fatalf("step %d: each gave %d %p, not cached so", step, pid, p)
			}
			seen++
		})
		if seen != len(model) {
			t.Fatalf("step %d: each gave %d records, want %d", step, seen, len(model))
		}
	}
	for step := 0; step < 20000; step++ {
		switch op := rng.Intn(10); {
		case op < 5: // a new partition, sometimes after a gap
			switch rng.Intn(20) {
			case 0:
				next += uint64(rng.Intn(2 * maxWindowGap))
			case 1:
				next += 10 * maxWindowGap
			}
			p := c.newRec()
			p.Name = "p"
			c.putNew(next, p)
			model[next] = p
			next++
		case op < 7: // a record read from Pebble, or found absent
			pid := uint64(rng.Int63n(int64(next) + 10))
			var p *partRec
			if rng.Intn(3) > 0 {
				p = &partRec{Name: "old"}
			}
			c.put(pid, p)
			model[pid] = p
		case op < 9:
			pid := uint64(rng.Int63n(int64(next) + 1))
			c.del(pid)
			delete(model, pid)
		default:
			if _, ok := c.get(uint64(rng.Int63n(int64(next) + 10))); ok {
				continue
			}
		}
		if step%1000 == 0 {
			check(step)
		}
	}
	check(-1)
	// Trimming drops the older half of a window past the bound and keeps
	// every answer it gives right.
	c = newPartCache()
	for pid := uint64(1); pid <= maxCachedPerMap+10; pid++ {
		c.putNew(pid, c.newRec())
	}
	c.trim()
	if c.len() > maxCachedPerMap {
		t.Fatalf("%d records after trim, want at most %d", c.len(), maxCachedPerMap)
	}
	if _, ok := c.get(1); ok {
		t.Fatal("the oldest id survived the trim")
	}
	if p, ok := c.get(maxCachedPerMap + 10); !ok || p == nil {
		t.Fatal("the newest id is gone after the trim")
	}
}
