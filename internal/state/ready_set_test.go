package state

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestReadySetMatchesReference drives the ready set and a map with the same
// random inserts and deletes (ids clustered so that chunks turn dense and
// back) and requires the same membership, size and ordered walks.
func TestReadySetMatchesReference(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	r := newReadySet()
	ref := map[uint64]bool{}
	id := func() uint64 {
		switch rng.IntN(4) {
		case 0: // a dense run near the start of a chunk boundary
			return 1<<16 - 3000 + rng.Uint64N(12000)
		case 1: // sparse ids far apart, now and then
			if rng.IntN(20) == 0 {
				return rng.Uint64N(1 << 40)
			}
			return 9<<16 + rng.Uint64N(1<<16)
		default: // a dense chunk
			return 5<<16 + rng.Uint64N(1<<16)
		}
	}
	sorted := func() []uint64 {
		var l []uint64
		for k := range ref {
			l = append(l, k)
		}
		slices.Sort(l)
		return l
	}
	for step := range 200_000 {
		k := id()
		// Phases of mostly inserts and mostly deletes, so dense chunks
		// turn back into lists and empty again.
		ins := rng.IntN(10) < 8
		if step/50_000%2 == 1 {
			ins = !ins
		}
		if ins {
			r.Insert(k)
			ref[k] = true
		} else {
			r.Delete(k)
			delete(ref, k)
		}
		if r.Has(k) != ref[k] {
			t.Fatalf("step %d: Has(%d) = %v, want %v", step, k, r.Has(k), ref[k])
		}
		if step%10_000 != 0 {
			continue
		}
		want := sorted()
		if r.Len() != len(want) {
			t.Fatalf("step %d: Len %d, want %d", step, r.Len(), len(want))
		}
		for _, from := range []uint64{0, k, k + 1, 1<<16 - 1, 5 << 16, 5<<16 + 64, rng.Uint64N(1 << 40)} {
			var got []uint64
			r.AscendGreaterOrEqual(from, func(id uint64) bool { got = append(got, id); return true })
			i, _ := slices.BinarySearch(want, from)
			if !slices.Equal(got, want[i:]) {
				t.Fatalf("step %d: walk from %d gave %d ids, want %d", step, from, len(got), len(want[i:]))
			}
			// A walk that stops early stops where it is told.
			n := 0
			r.AscendGreaterOrEqual(from, func(uint64) bool { n++; return n < 3 })
			if n != min(3, len(want[i:])) {
				t.Fatalf("step %d: a walk told to stop after 3 visited %d", step, n)
			}
		}
	}
	dense := 0
	for _, c := range r.chunks {
		if c.bits != nil {
			dense++
		}
	}
	t.Logf("%d ids in %d chunks, %d dense", r.Len(), len(r.chunks), dense)
}
