package state

import (
	"math/rand"
	"testing"
	"time"
)

// TestSettledSet: random puts, gets and deletes over a few groups, with
// ids mostly near each other and some far apart, agree with a map; a
// dropped group holds nothing; the count matches.
func TestSettledSet(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	s := newSettledSet()
	model := map[cursorRef]settledCur{}
	ref := func() cursorRef {
		pid := uint64(1000 + rng.Intn(3000))
		if rng.Intn(10) == 0 {
			pid = uint64(rng.Int63n(1 << 40))
		}
		return cursorRef{tid: uint64(rng.Intn(2)), sub: uint64(1 + rng.Intn(3)), pid: pid}
	}
	for i := 0; i < 200000; i++ {
		r := ref()
		switch rng.Intn(4) {
		case 0, 1:
			e := settledCur{epoch: uint64(rng.Intn(3)), cursor: uint64(rng.Intn(100)), ready: rng.Intn(2) == 0, derived: rng.Intn(2) == 0}
			s.put(r, e)
			e.set = true
			model[r] = e
		case 2:
			s.del(r)
			delete(model, r)
		case 3:
			got, ok := s.get(r)
			want, wok := model[r]
			if ok != wok || got != want {
				t.Fatalf("op %d: get %+v = %+v %v, want %+v %v", i, r, got, ok, want, wok)
			}
		}
		if i%50000 == 49999 {
			s.dropSub(1, 2)
			for r := range model {
				if r.tid == 1 && r.sub == 2 {
					delete(model, r)
				}
			}
		}
		if s.len() != len(model) {
			t.Fatalf("op %d: %d held, want %d", i, s.len(), len(model))
		}
	}
	for r, want := range model {
		if got, ok := s.get(r); !ok || got != want {
			t.Fatalf("get %+v = %+v %v, want %+v", r, got, ok, want)
		}
	}
}
