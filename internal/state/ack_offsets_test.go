package state

import (
	"math/rand"
	"reflect"
	"testing"

	"github.com/google/uuid"
)

// TestAckRunEqualsItsOffsets: an ack whose items are runs of offsets
// (AckItem.Count) leaves the state exactly as the same offsets acknowledged
// one item each: runs over a lease's messages, runs that reach past them or
// start below the cursor, runs acknowledged twice, runs under another lease
// or none, failures and dead letters, runs of several partitions and groups
// interleaved with single items. A run's result succeeds when each of its
// offsets' did, and else holds the first error. Both stores then deliver
// the same next messages.
func TestAckRunEqualsItsOffsets(t *testing.T) {
	for seed := int64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewSource(seed))
		a, b, both, pops := twoLeasedStores(t, rng, seed, 30)
		// runs holds the command's items; each one's offsets one by one
		// are the items of expanded[i].
		var runs []AckItem
		var expanded [][]AckItem
		for n := 5 + rng.Intn(30); len(runs) < n; {
			p := pops[rng.Intn(len(pops))]
			if len(p.msgs) == 0 {
				continue
			}
			m := p.msgs[rng.Intn(len(p.msgs))]
			off := m.Offset
			if rng.Intn(6) == 0 && off > 2 {
				off -= 2 // from below what the lease holds
			}
			it := AckItem{PartitionID: m.PartitionID, Offset: &off, Status: AckCompleted, Group: p.group, LeaseID: p.lease, TxIDKnown: true, Count: uint64(2 + rng.Intn(15))}
			switch k := rng.Intn(20); {
			case k < 2:
				it.Status = AckFailed
				it.Error = "boom"
			case k < 3:
				it.Status = AckRetry
			case k < 4:
				it.Status = AckDLQ
			case k < 5:
				it.LeaseID = uuid.NewString() // another lease
			case k < 6:
				it.LeaseID = "" // none
			case k < 7:
				it.PartitionID = 999 // not a partition
			}
			var one []AckItem
			for k := uint64(0); k < it.Count; k++ {
				o := off + k
				x := it
				x.Offset, x.Count = &o, 0
				one = append(one, x)
			}
			runs, expanded = append(runs, it), append(expanded, one)
			if rng.Intn(4) == 0 {
				// A single item between runs, or the same run again.
				if rng.Intn(2) == 0 {
					x := one[0]
					runs, expanded = append(runs, x), append(expanded, []AckItem{x})
				} else {
					runs, expanded = append(runs, it), append(expanded, one)
				}
			}
		}
		ra := a.ack(runs...)
		for i, one := range expanded {
			rb := b.ack(one...)
			want := AckItemResult{Success: true}
			for _, r := range rb.Items {
				if !r.Success && want.Success {
					want.Success, want.Error = false, r.Error
				}
				want.LeaseReleased = want.LeaseReleased || r.LeaseReleased
				want.DLQ = want.DLQ || r.DLQ
			}
			if len(one) == 1 && runs[i].Count == 0 {
				want = rb.Items[0]
			}
			if ra.Items[i] != want {
				t.Fatalf("seed %d: item %d (%+v, offset %d): as a run %+v, offset by offset %+v", seed, i, runs[i], *runs[i].Offset, ra.Items[i], want)
			}
		}
		if ca, cb := checksum(t, a.s), checksum(t, b.s); ca != cb {
			t.Fatalf("seed %d: the state differs after %d runs and their offsets one by one", seed, len(runs))
		}
		sameRestAfterLeases(t, seed, a, b, both)
	}
}

// TestAckRunCodec: runs survive the entry's encoding under their own kind
// (an ack without runs keeps the packed kind every build knows), an offset
// "next" after a run is the one after its last, and a run that is not one
// (a count below two, no offset, a transaction id, past the last offset or
// MaxAckRun) or a count under the packed kind is refused as corrupt.
func TestAckRunCodec(t *testing.T) {
	off := func(o uint64) *uint64 { return &o }
	c := &Ack{Tenant: "default", Items: []AckItem{
		{PartitionID: 1, Offset: off(10), Count: 500, Status: AckCompleted, Group: "sink", LeaseID: "l", TxIDKnown: true},
		{PartitionID: 1, Offset: off(510), Status: AckFailed, Group: "sink", LeaseID: "l", Error: "refused"},
		{PartitionID: 1, Offset: off(511), Count: 7, Status: AckCompleted, Group: "sink", LeaseID: "l"},
		{PartitionID: 2, Offset: off(0), Count: MaxAckRun, Status: AckCompleted, Group: "sink", LeaseID: "l"},
	}}
	if k := c.kind(); k != kindAckRuns {
		t.Fatalf("an ack with runs has kind %d, want %d", k, kindAckRuns)
	}
	b, err := EncodeEntry(&Entry{Time: 1, Cmds: []Command{c}})
	if err != nil {
		t.Fatal(err)
	}
	en, err := DecodeEntry(b)
	if err != nil {
		t.Fatal(err)
	}
	if got := en.Cmds[0].(*Ack); !reflect.DeepEqual(got, c) {
		t.Fatalf("decoded %+v, want %+v", got, c)
	}
	if len(b) > 120 {
		t.Fatalf("an ack of four items is %d bytes", len(b))
	}
	single := &Ack{Tenant: "default", Items: []AckItem{{PartitionID: 1, Offset: off(3), Status: AckCompleted}}}
	if k := single.kind(); k != kindAckPacked {
		t.Fatalf("an ack without runs has kind %d, want %d", k, kindAckPacked)
	}
	body := encodeAckPacked(c)
	if _, err := decodeAckPacked(body, false); err == nil {
		t.Fatal("a run was accepted under the packed kind")
	}
	bad := []AckItem{
		{PartitionID: 1, Offset: off(1), Count: MaxAckRun + 1, Status: AckCompleted},
		{PartitionID: 1, Offset: off(^uint64(0) - 2), Count: 5, Status: AckCompleted},
		{PartitionID: 1, Count: 5, Status: AckCompleted},
		{PartitionID: 1, Offset: off(1), TxID: "x", Count: 5, Status: AckCompleted},
	}
	for i, it := range bad {
		if _, err := decodeAckPacked(encodeAckPacked(&Ack{Tenant: "t", Items: []AckItem{it}}), true); err == nil {
			t.Errorf("bad run %d (%+v) was accepted", i, it)
		}
	}
}
