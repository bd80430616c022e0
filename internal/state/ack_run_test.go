package state

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"slices"
	"testing"

	"github.com/google/uuid"
)

// TestAckCommandEqualsItsItemsOneByOne: an ack command of many items (which
// settles each cursor once, at its end) answers every item and leaves the
// state exactly as the same items do acknowledged one command each:
// duplicates, failures up to dead-lettering, retries, wrong and missing
// leases, unknown offsets, items by transaction id, several partitions and
// two groups interleaved. Then both stores deliver the same next messages.
func TestAckCommandEqualsItsItemsOneByOne(t *testing.T) {
	for seed := int64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewSource(seed))
		a, b, both, pops := twoLeasedStores(t, rng, seed, 20)
		var items []AckItem
		for n := 10 + rng.Intn(150); len(items) < n; {
			p := pops[rng.Intn(len(pops))]
			if len(p.msgs) == 0 {
				continue
			}
			// Mostly runs in delivery order, as clients send them.
			start := rng.Intn(len(p.msgs))
			for j := start; j < len(p.msgs) && j < start+1+rng.Intn(12); j++ {
				m := p.msgs[j]
				off := m.Offset
				it := AckItem{PartitionID: m.PartitionID, Offset: &off, Status: AckCompleted, Group: p.group, LeaseID: p.lease}
				switch k := rng.Intn(20); {
				case k < 3:
					it.Status = AckFailed
					it.Error = "boom"
				case k < 4:
					it.Status = AckRetry
				case k < 5:
					it.Status = AckDLQ
				case k < 6:
					it.LeaseID = uuid.NewString() // another lease
				case k < 7:
					it.LeaseID = "" // none
				case k < 8:
					bad := m.Offset + 1000
					it.Offset = &bad // not a message
				case k < 9:
					it.PartitionID = 999 // not a partition
				}
				if rng.Intn(4) == 0 {
					it.TxIDKnown = true // the proposer answers with the id
				} else if rng.Intn(3) == 0 {
					it.Offset, it.TxID = nil, m.TxID // by transaction id
					if rng.Intn(2) == 0 {
						it.TxID = "unknown-" + m.TxID
					}
				}
				items = append(items, it)
				if rng.Intn(8) == 0 {
					items = append(items, it) // the same item again
				}
			}
		}
		ra := a.ack(items...)
		var rb []AckItemResult
		for _, it := range items {
			rb = append(rb, b.ack(it).Items...)
		}
		if !reflect.DeepEqual(ra.Items, rb) {
			for i := range rb {
				if ra.Items[i] != rb[i] {
					t.Errorf("seed %d: item %d (%+v): in one command %+v, one by one %+v", seed, i, items[i], ra.Items[i], rb[i])
				}
			}
			t.FailNow()
		}
		if ca, cb := checksum(t, a.s), checksum(t, b.s); ca != cb {
			t.Fatalf("seed %d: the state differs after %d acks in one command and one by one", seed, len(items))
		}
		sameRestAfterLeases(t, seed, a, b, both)
	}
}

// TestAckOfLeaseRunIsSmallInTheLog: an ack of a lease's messages by offset,
// in delivery order, is logged in about a byte per message (it was about a
// hundred), and decodes back to the same items.
func TestAckOfLeaseRunIsSmallInTheLog(t *testing.T) {
	lease := uuid.NewString()
	c := &Ack{Tenant: "default"}
	for p := uint64(1); p <= 5; p++ {
		for off := uint64(100); off < 200; off++ {
			o := off
			c.Items = append(c.Items, AckItem{PartitionID: p, Offset: &o, Status: AckCompleted, Group: "sink", LeaseID: lease})
		}
	}
	b, err := EncodeEntry(&Entry{Time: 1, Cmds: []Command{c}})
	if err != nil {
		t.Fatal(err)
	}
	if per := float64(len(b)) / float64(len(c.Items)); per > 1.5 {
		t.Fatalf("an ack of %d messages is %d bytes in the log, %.1f per message; want at most 1.5", len(c.Items), len(b), per)
	}
	en, err := DecodeEntry(b)
	if err != nil {
		t.Fatal(err)
	}
	if got := en.Cmds[0].(*Ack); !reflect.DeepEqual(got, c) {
		t.Fatalf("decoded %+v, want %+v", got.Items[:3], c.Items[:3])
	}
	// Named by offset and transaction id (as the sink acks), the id left
	// to the proposer: two bytes a message.
	for i := range c.Items {
		c.Items[i].TxIDKnown = true
	}
	if b, err = EncodeEntry(&Entry{Time: 1, Cmds: []Command{c}}); err != nil {
		t.Fatal(err)
	}
	if per := float64(len(b)) / float64(len(c.Items)); per > 2.5 {
		t.Fatalf("an ack of %d messages whose ids the proposer knows is %.1f bytes per message; want at most 2.5", len(c.Items), per)
	}
}

// TestAckCodecRoundTrip: every shape of ack item survives the packed
// encoding, and an entry in the earlier per-item encoding (kindAck, still in
// the logs of nodes that ran an older version) decodes to the same command.
func TestAckCodecRoundTrip(t *testing.T) {
	seed := int64(7)
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	pick := func(vs ...string) string { return vs[rng.Intn(len(vs))] }
	for trial := 0; trial < 200; trial++ {
		c := &Ack{Tenant: pick("default", "t-1", "")}
		for i := 0; i < rng.Intn(40); i++ {
			it := AckItem{PartitionID: uint64(rng.Intn(3)), Status: pick(AckCompleted, AckFailed, "", "success"),
				Group: pick("", "g", "h"), LeaseID: pick("", "l1", "l2"), TxID: pick("", "", "tx-"+fmt.Sprint(i)), Error: pick("", "", "why"),
				TxIDKnown: rng.Intn(3) == 0}
			if rng.Intn(4) != 0 {
				o := uint64(rng.Intn(5))
				if n := len(c.Items); n > 0 && c.Items[n-1].Offset != nil && rng.Intn(2) == 0 {
					o = *c.Items[n-1].Offset + 1
				}
				it.Offset = &o
			}
			c.Items = append(c.Items, it)
		}
		if c.Items == nil {
			c.Items = []AckItem{}
		}
		got, err := decodeAckPacked(encodeAckPacked(c), false)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		if !reflect.DeepEqual(got, c) {
			t.Fatalf("trial %d: packed round trip gave %+v, want %+v", trial, got, c)
		}
		old := enc{}
		old.u8(entryVersion)
		old.i64(5)
		old.uv(1)
		old.u8(kindAck)
		old.bytes(encodeAck(c))
		en, err := DecodeEntry(old.b)
		if err != nil {
			t.Fatalf("trial %d: the per-item encoding no longer decodes: %v", trial, err)
		}
		// (The per-item encoding predates TxIDKnown.)
		for i := range c.Items {
			c.Items[i].TxIDKnown = false
		}
		if !reflect.DeepEqual(en.Cmds[0], c) {
			t.Fatalf("trial %d: the per-item encoding decodes to %+v, want %+v", trial, en.Cmds[0], c)
		}
	}
	// A packed item that says "the next offset" with no offset before is
	// refused, not guessed.
	if _, err := decodeAckPacked([]byte{0, 1, ackSamePart | ackHasOffset | ackNextOffset | ackSameStatus | ackSameGroup | ackSameLease}, false); err == nil {
		t.Fatal("an offset relative to nothing was accepted")
	}
}

// TestNormalizeOnePass: normalize in one pass gives what the step-by-step
// definition gives (drop what lies below the cursor unless requeued, then
// advance over finished offsets one at a time) on random cursors.
func TestNormalizeOnePass(t *testing.T) {
	seed := int64(11)
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	reference := func(c *cursorRec) {
		out := c.Ex[:0]
		for _, x := range c.Ex {
			if x.Off < c.Cursor && x.Flags&exRequeued == 0 {
				continue
			}
			out = append(out, x)
		}
		c.Ex = out
		for {
			i := c.find(c.Cursor)
			if i < 0 || c.Ex[i].Flags&exDone == 0 {
				break
			}
			c.Ex = append(c.Ex[:i], c.Ex[i+1:]...)
			c.Cursor++
		}
	}
	for trial := 0; trial < 5000; trial++ {
		c := &cursorRec{Cursor: uint64(rng.Intn(20))}
		for off := uint64(0); off < 40; off++ {
			if rng.Intn(3) == 0 {
				c.Ex = append(c.Ex, exception{Off: off, Flags: uint8(rng.Intn(4)), Attempt: uint32(rng.Intn(3))})
			}
		}
		want := &cursorRec{Cursor: c.Cursor, Ex: slices.Clone(c.Ex)}
		reference(want)
		before, from := slices.Clone(c.Ex), c.Cursor
		c.normalize()
		if c.Cursor != want.Cursor || !slices.Equal(c.Ex, want.Ex) {
			t.Fatalf("trial %d: %v from cursor %d: got cursor %d %v, want %d %v", trial, before, from, c.Cursor, c.Ex, want.Cursor, want.Ex)
		}
	}
}

// TestAckAfterTheLeaseEndsInOneCommand: an item that releases the lease
// makes the partition ready (one message failed, so there is work), and a
// later item of the same command, needing no lease then, finishes that
// message; the state is the same as with one item per command.
func TestAckAfterTheLeaseEndsInOneCommand(t *testing.T) {
	a, b := newHarness(t), newHarness(t)
	lease := uuid.NewString()
	var pid uint64
	push := &Push{Tenant: "default"}
	for i := 0; i < 3; i++ {
		push.Items = append(push.Items, PushItem{Queue: "q", Partition: "p", TxID: uuid.NewString(), Payload: []byte(`1`)})
	}
	for _, h := range []*harness{a, b} {
		h.apply(push)
		r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 10, LeaseID: lease})
		if len(r.Messages) != 3 {
			t.Fatalf("popped %d messages, want 3", len(r.Messages))
		}
		pid = r.Messages[0].PartitionID
	}
	off := func(o uint64) *uint64 { return &o }
	items := []AckItem{
		{PartitionID: pid, Offset: off(0), Status: AckCompleted, Group: "g", LeaseID: lease},
		{PartitionID: pid, Offset: off(1), Status: AckFailed, Group: "g", LeaseID: lease},
		{PartitionID: pid, Offset: off(2), Status: AckCompleted, Group: "g", LeaseID: lease},
		{PartitionID: pid, Offset: off(1), Status: AckCompleted, Group: "g"},
	}
	ra := a.ack(items...)
	var rb []AckItemResult
	for _, it := range items {
		rb = append(rb, b.ack(it).Items...)
	}
	if !reflect.DeepEqual(ra.Items, rb) {
		t.Fatalf("in one command %+v, one by one %+v", ra.Items, rb)
	}
	if !ra.Items[2].LeaseReleased || !ra.Items[3].Success {
		t.Fatalf("want the third item to release the lease and the fourth to succeed: %+v", ra.Items)
	}
	if ca, cb := checksum(t, a.s), checksum(t, b.s); ca != cb {
		t.Fatal("the state differs between the acks in one command and one by one")
	}
}

// leased is one group's pop: its lease and what it delivered.
type leased struct {
	lease string
	group string
	msgs  []Delivered
}

// twoLeasedStores makes two stores that receive the same commands (both):
// a queue q with retryLimit 1, 5 to perPartition+4 messages in each of
// three partitions, and a pop of each of groups g1 and g2, which both
// stores must answer alike.
func twoLeasedStores(t *testing.T, rng *rand.Rand, seed int64, perPartition int) (a, b *harness, both func(...Command) ([]any, []any), pops []leased) {
	t.Helper()
	a, b = newHarness(t), newHarness(t)
	both = func(cmds ...Command) ([]any, []any) { return a.apply(cmds...), b.apply(cmds...) }
	both(&Configure{Tenant: "default", Queue: "q", Options: map[string]json.RawMessage{"retryLimit": json.RawMessage("1")}})
	var pushed []PushItem
	for p := 0; p < 3; p++ {
		for i := 0; i < 5+rng.Intn(perPartition); i++ {
			pushed = append(pushed, PushItem{Queue: "q", Partition: fmt.Sprintf("p%d", p), TxID: uuid.NewString(), Payload: []byte(fmt.Sprintf(`{"p":%d,"i":%d}`, p, i))})
		}
	}
	both(&Push{Tenant: "default", Items: pushed})
	for _, g := range []string{"g1", "g2"} {
		l := uuid.NewString()
		ra, rb := both(&Pop{Tenant: "default", Queue: "q", Group: g, SubMode: "all", Batch: 10 + rng.Intn(60), Partitions: 1 + rng.Intn(3), LeaseSeconds: 30, LeaseID: l})
		pa, pb := ra[0].(*PopResult), rb[0].(*PopResult)
		if !reflect.DeepEqual(pa.Messages, pb.Messages) {
			t.Fatalf("seed %d: the two stores delivered differently", seed)
		}
		pops = append(pops, leased{l, g, pa.Messages})
	}
	return a, b, both, pops
}

// sameRestAfterLeases lets the leases of twoLeasedStores' pops expire and
// checks that both stores then deliver the same rest to each group and hold
// the same state. The pops run at the same log index in both stores: a
// pop's index is in what it stores (the lease record's overlays, the
// cursor's stamp), and one store may have taken more entries for its acks.
func sameRestAfterLeases(t *testing.T, seed int64, a, b *harness, both func(...Command) ([]any, []any)) {
	t.Helper()
	a.now += 31e6
	b.now += 31e6
	a.index = max(a.index, b.index)
	b.index = a.index
	for _, g := range []string{"g1", "g2"} {
		l := uuid.NewString()
		ra, rb := both(&Pop{Tenant: "default", Queue: "q", Group: g, SubMode: "all", Batch: 200, Partitions: 3, LeaseSeconds: 30, LeaseID: l})
		if pa, pb := ra[0].(*PopResult), rb[0].(*PopResult); !reflect.DeepEqual(pa.Messages, pb.Messages) {
			t.Fatalf("seed %d: group %s: after the acks the stores deliver %v and %v", seed, g, offsets(pa), offsets(pb))
		}
	}
	if ca, cb := checksum(t, a.s), checksum(t, b.s); ca != cb {
		t.Fatalf("seed %d: the state differs after the next pops", seed)
	}
}
