package state

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/google/uuid"
)

// TestDedupFloor checks the dedup answers against a model of every stored
// id, with ids in the orders clients produce them: increasing UUIDv7s (a
// Queen client's), older ids arriving late, random v4s and short names that
// are prefixes of one another. A floor that misses a new key (one that
// sorts before it) would report a repeated id as new, and one that claims
// more than it knows would do the same for an old id: both fail here.
func TestDedupFloor(t *testing.T) {
	h := newHarness(t)
	rng := rand.New(rand.NewSource(11))
	stored := map[string]map[string]bool{} // partition -> ids
	var v7s []string
	newID := func() string {
		switch k := rng.Intn(10); {
		case k < 6:
			id, err := uuid.NewV7()
			if err != nil {
				t.Fatal(err)
			}
			v7s = append(v7s, id.String())
			return id.String()
		case k < 8 && len(v7s) > 0:
			// An id made earlier by another producer, pushed only now.
			return v7s[rng.Intn(len(v7s))]
		case k < 9:
			return uuid.NewString()
		default:
			return fmt.Sprintf("n%d", rng.Intn(30)) // "n1" is a prefix of "n12"
		}
	}
	for round := 0; round < 400; round++ {
		if round%50 == 49 {
			// The floors are memory only: a reloaded record must give the
			// same answers.
			h.s.cache = newRecordCache()
		}
		c := &Push{Tenant: "default"}
		type want struct {
			part, id string
			dup      bool
		}
		var wants []want
		inReq := map[[2]string]bool{}
		for j := 0; j < 1+rng.Intn(6); j++ {
			part := fmt.Sprintf("p%d", rng.Intn(3))
			id := newID()
			if rng.Intn(8) == 0 {
				for known := range stored[part] { // an exact repeat
					id = known
					break
				}
			}
			key := [2]string{part, id}
			wants = append(wants, want{part, id, stored[part][id] || inReq[key]})
			inReq[key] = true
			c.Items = append(c.Items, PushItem{Queue: "q", Partition: part, TxID: id, Payload: []byte(`1`)})
		}
		r := h.apply(c)[0].(*PushResult)
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		for i, w := range wants {
			if got := r.Items[i].Duplicate; got != w.dup {
				t.Fatalf("round %d: id %q in %s: duplicate=%v, want %v", round, w.id, w.part, got, w.dup)
			}
			if stored[w.part] == nil {
				stored[w.part] = map[string]bool{}
			}
			stored[w.part][w.id] = true
		}
	}
	dups := 0
	for _, ids := range stored {
		dups += len(ids)
	}
	if dups < 500 {
		t.Fatalf("only %d distinct ids stored: the test did not exercise much", dups)
	}
}

// TestDedupFloorAcrossGenerations: retention starts new dedup generations;
// ids of retained messages stay duplicates and dropped ones are free again,
// whichever generation's floor is known.
func TestDedupFloorAcrossGenerations(t *testing.T) {
	h := newHarness(t)
	h.configure("g", map[string]string{"retentionMessages": "3"})
	push := func(id string) bool {
		t.Helper()
		r := h.apply(&Push{Tenant: "default", Items: []PushItem{{Queue: "g", Partition: "p", TxID: id, Payload: []byte(`1`)}}})[0].(*PushResult)
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		return r.Items[0].Duplicate
	}
	var ids []string
	for i := 0; i < 40; i++ {
		id, _ := uuid.NewV7()
		ids = append(ids, id.String())
		if push(id.String()) {
			t.Fatalf("new id %d reported duplicate", i)
		}
		if i%7 == 3 {
			h.s.cache = newRecordCache()
		}
		// The newest message is always retained.
		if !push(id.String()) {
			t.Fatalf("id %d pushed again right away is not a duplicate", i)
		}
	}
	if push(ids[0]) {
		t.Fatal("the first id's message was dropped by retention, but the id still counts as a duplicate")
	}
}

// TestDedupRepeatsWithinOneRequest: a request that names one transaction id
// several times answers every repeat with the message the id belongs to,
// whether that message was stored before (a stored id repeated twice) or is
// written by this request (a new id repeated), in a push and in a
// transaction's push operations.
func TestDedupRepeatsWithinOneRequest(t *testing.T) {
	h := newHarness(t)
	stored := h.apply(&Push{Tenant: "default", Items: []PushItem{{Queue: "rq", Partition: "p", TxID: "old", Payload: []byte(`1`)}}})[0].(*PushResult)
	if stored.Err != nil || stored.Items[0].Duplicate {
		t.Fatalf("first push: %+v", stored)
	}
	old := stored.Items[0]
	items := func(ids ...string) []PushItem {
		var out []PushItem
		for _, id := range ids {
			out = append(out, PushItem{Queue: "rq", Partition: "p", TxID: id, Payload: []byte(`2`)})
		}
		return out
	}
	check := func(what string, got []PushItemResult) {
		t.Helper()
		if len(got) != 6 {
			t.Fatalf("%s: %d results, want 6", what, len(got))
		}
		// old, old, old, new, new, new
		for i := 0; i < 3; i++ {
			if !got[i].Duplicate || got[i].PartitionID != old.PartitionID || got[i].Offset != old.Offset {
				t.Errorf("%s: item %d (stored id) = %+v, want a duplicate of partition %d offset %d", what, i, got[i], old.PartitionID, old.Offset)
			}
		}
		first := got[3]
		if first.Duplicate || first.PartitionID != old.PartitionID || first.Offset <= old.Offset {
			t.Errorf("%s: item 3 (new id) = %+v, want a new message after offset %d", what, first, old.Offset)
		}
		for i := 4; i < 6; i++ {
			if !got[i].Duplicate || got[i].PartitionID != first.PartitionID || got[i].Offset != first.Offset {
				t.Errorf("%s: item %d (repeat of a new id) = %+v, want a duplicate of offset %d", what, i, got[i], first.Offset)
			}
		}
	}
	r := h.apply(&Push{Tenant: "default", Items: items("old", "old", "old", "new1", "new1", "new1")})[0].(*PushResult)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	check("push", r.Items)
	// A transaction: the repeats are spread over two push operations.
	tr := h.apply(&Txn{Tenant: "default", Ops: []TxnOp{
		{Type: OpPush, Items: items("old", "old")},
		{Type: OpPush, Items: items("old", "new2", "new2", "new2")},
	}})[0].(*TxnResult)
	if tr.Err != nil {
		t.Fatal(tr.Err)
	}
	check("transaction", append(append([]PushItemResult(nil), tr.Results[0].Push...), tr.Results[1].Push...))
	if qi := h.queueInfo("rq"); qi.Total != 3 {
		t.Fatalf("queue holds %d messages, want 3 (old, new1, new2)", qi.Total)
	}
}
