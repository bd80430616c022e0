package state

import (
	"math/rand"
	"testing"
)

// TestNameIndex: the partition-name index keeps what a map would through
// growth, overwrites and a trim (which drops a tenth and nothing else), and
// takes hash 0 like any other.
func TestNameIndex(t *testing.T) {
	seed := rand.Int63()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	x, want := newNameIndex(), map[uint64]uint64{}
	put := func(h, id uint64) {
		x.put(h, id)
		want[max(h, 1)] = id
	}
	put(0, 7)
	for i := 0; i < 50_000; i++ {
		h := rng.Uint64()
		if i%7 == 0 && len(want) > 0 {
			h = uint64(i) // small keys, in a run: neighbours in the table
		}
		put(h, uint64(i+1))
	}
	for h := range want { // overwrites
		if rng.Intn(4) == 0 {
			put(h, want[h]+1_000_000)
		}
	}
	check := func(when string, all bool) int {
		t.Helper()
		found := 0
		for h, id := range want {
			got, ok := x.get(h)
			switch {
			case ok && got == id:
				found++
			case ok:
				t.Fatalf("%s: hash %#x maps to %d, want %d", when, h, got, id)
			case all:
				t.Fatalf("%s: hash %#x missing", when, h)
			}
		}
		if x.len() != found {
			t.Fatalf("%s: len %d, %d entries found", when, x.len(), found)
		}
		return found
	}
	check("filled", true)
	if got, ok := x.get(0); !ok || got != want[1] {
		t.Fatalf("hash 0: %d %v, want %d (hash 0 is stored as 1)", got, ok, want[1])
	}
	if _, ok := x.get(rng.Uint64() | 1<<63); ok {
		// A random 64-bit hash colliding with one of 50,000 is out of reach.
		t.Fatal("a hash never put was found")
	}
	x.trim() // under the bound: nothing dropped
	check("trim under the bound", true)
	x.resize(len(x.kv), 10)
	if n, all := check("trimmed", false), len(want); n < all*89/100 || n > all*91/100 {
		t.Fatalf("a trim kept %d of %d entries, want nine tenths", n, all)
	}
}
