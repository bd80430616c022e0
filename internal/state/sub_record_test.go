package state

import (
	"encoding/json"
	"math"
	"math/rand"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

// TestSubRecordBinary: subscription records of any values read back field
// for field from version 1 and from JSON as older builds wrote them; cut or
// padded version 1 records are refused.
func TestSubRecordBinary(t *testing.T) {
	seed := rand.Int63()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	u := func() uint64 {
		switch rng.Intn(3) {
		case 0:
			return 0
		case 1:
			return math.MaxUint64 - uint64(rng.Intn(2))
		}
		return rng.Uint64() >> uint(rng.Intn(64))
	}
	for i := 0; i < 2000; i++ {
		s := &subRec{ID: u(), Group: string(rune('a' + rng.Intn(26))), CreatedAt: int64(u()), Epoch: u(),
			Rule: []string{StartAll, StartIndex, StartTime, ""}[rng.Intn(4)], RuleIndex: u(), RuleTime: int64(u()),
			Pending: int64(u()), Consumed: int64(u()), DLQ: int64(u()), Skipped: int64(u()), ScanPos: u(),
			Backfill: rng.Intn(2) == 0, BackfillPos: u()}
		b := s.appendTo(nil)
		d, err := decodeSub(b)
		if err != nil || *d != *s {
			t.Fatalf("%+v does not round-trip: %+v, %v", s, d, err)
		}
		j, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if d, err := decodeSub(j); err != nil || *d != *s {
			t.Fatalf("the JSON of %+v reads as %+v, %v", s, d, err)
		}
		for n := 0; n < len(b); n++ {
			if _, err := decodeSub(b[:n]); err == nil {
				t.Fatalf("a record cut to %d of %d bytes decoded", n, len(b))
			}
		}
		if _, err := decodeSub(append(b, 0)); err == nil {
			t.Fatal("a record with a byte after it decoded")
		}
		if len(b) >= len(j)/2 {
			t.Fatalf("%d bytes binary, %d as JSON", len(b), len(j))
		}
	}
}

// rewriteSubsJSON rewrites every stored subscription record as JSON, as a
// build before the binary record left them.
func rewriteSubsJSON(t *testing.T, h *harness) int {
	t.Helper()
	h.s.waitCommitted()
	it, err := h.s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{tSub}, UpperBound: []byte{tSub + 1}})
	if err != nil {
		t.Fatal(err)
	}
	type kv struct{ k, v []byte }
	var all []kv
	for it.First(); it.Valid(); it.Next() {
		s, err := decodeSub(it.Value())
		if err != nil {
			t.Fatalf("subscription %x: %v", it.Key(), err)
		}
		j, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, kv{slices.Clone(it.Key()), j})
	}
	it.Close()
	for _, r := range all {
		if err := h.s.db.Set(r.k, r.v, pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	}
	return len(all)
}

// TestSubJSONReadAfterReopen: a store whose subscription records are JSON
// opens and carries on: counts continue from the stored ones, and the next
// change writes version 1.
func TestSubJSONReadAfterReopen(t *testing.T) {
	h := newHarness(t)
	h.push("q", "p", `1`, `2`, `3`, `4`)
	r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 2, Partitions: 1, LeaseSeconds: 60})
	if len(r.Messages) != 2 {
		t.Fatalf("popped %d, want 2", len(r.Messages))
	}
	o := r.Messages[0].Offset
	h.ack(AckItem{PartitionID: r.Messages[0].PartitionID, Offset: &o, TxIDKnown: true, Status: AckCompleted, Group: "g", LeaseID: r.LeaseID})
	if n := rewriteSubsJSON(t, h); n == 0 {
		t.Fatal("no subscription record to rewrite")
	}
	h.reopen()
	o = r.Messages[1].Offset
	h.ack(AckItem{PartitionID: r.Messages[1].PartitionID, Offset: &o, TxIDKnown: true, Status: AckCompleted, Group: "g", LeaseID: r.LeaseID})
	if r = h.pop(Pop{Queue: "q", Group: "g", Batch: 10, Partitions: 1, LeaseSeconds: 60}); len(r.Messages) != 2 {
		t.Fatalf("popped %d after reopening, want 2", len(r.Messages))
	}
	h.s.waitCommitted()
	it, err := h.s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{tSub}, UpperBound: []byte{tSub + 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	found := false
	for it.First(); it.Valid(); it.Next() {
		s, err := decodeSub(it.Value())
		if err != nil {
			t.Fatal(err)
		}
		if s.Group != "g" {
			continue
		}
		found = true
		if it.Value()[0] != 1 {
			t.Fatal("the subscription record was not rewritten as version 1")
		}
		if s.Pending != 2 || s.Consumed != 2 {
			t.Fatalf("subscription after reopening: %+v; want 2 pending, 2 consumed", s)
		}
	}
	if !found {
		t.Fatal("no record of group g")
	}
}
