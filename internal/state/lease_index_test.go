package state

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand"
	"os"
	"slices"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
)

// leaseIndexKeys counts the keys of the lease index tables (lease ids and
// lease expiries) in the store.
func leaseIndexKeys(t *testing.T, s *Store) int {
	t.Helper()
	return countKeys(t, s.DB(), tLeaseExp, tLeaseID)
}

// countKeys counts the keys of the tables first to last in db.
func countKeys(t *testing.T, db *pebble.DB, first, last byte) int {
	t.Helper()
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{first}, UpperBound: []byte{last + 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	return n
}

// TestPopLeasesWithOneRecord: a pop that leases 100 partitions writes one
// lease record and one due key (it wrote two keys per partition before),
// and the lease works from them: it holds after a restart, is extended,
// expires at its time, and its ack by lease id deletes both keys.
func TestPopLeasesWithOneRecord(t *testing.T) {
	h := newHarness(t)
	for i := 0; i < 100; i++ {
		h.push("q", fmt.Sprintf("p%03d", i), `1`)
	}
	r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 100, Partitions: 100, LeaseSeconds: 10})
	if len(r.Messages) != 100 || r.Claimed != 100 {
		t.Fatalf("pop got %d messages from %d partitions; want 100 from 100", len(r.Messages), r.Claimed)
	}
	if n := leaseIndexKeys(t, h.s); n != 2 {
		t.Fatalf("a pop leasing 100 partitions left %d lease index keys; want 2 (one record, one due key)", n)
	}
	h.reopen()
	if again := h.pop(Pop{Queue: "q", Group: "g", Batch: 100, Partitions: 100}); len(again.Messages) != 0 {
		t.Fatalf("after a restart a leased partition was delivered again: %d messages", len(again.Messages))
	}
	h.now += 8e6
	ext := h.apply(&ExtendLease{Tenant: "default", LeaseID: r.LeaseID, Seconds: 10})[0].(*ExtendResult)
	if !ext.Success || ext.ExpiresAt != h.now+10e6 {
		t.Fatalf("extend: %+v; want success until %d", ext, h.now+10e6)
	}
	h.now += 5e6 // past the first expiry, within the extension
	h.apply(&Tick{})
	if again := h.pop(Pop{Queue: "q", Group: "g", Batch: 100, Partitions: 100}); len(again.Messages) != 0 {
		t.Fatalf("an extended lease expired at its first expiry: %d messages delivered", len(again.Messages))
	}
	// Ack half, then let the rest expire.
	var items []AckItem
	for _, m := range r.Messages[:50] {
		items = append(items, AckItem{PartitionID: m.PartitionID, TxID: m.TxID, Status: AckCompleted, Group: "g", LeaseID: r.LeaseID})
	}
	for i, it := range h.ack(items...).Items {
		if !it.Success {
			t.Fatalf("ack %d failed: %s", i, it.Error)
		}
	}
	h.now += 6e6
	h.apply(&Tick{})
	if n := leaseIndexKeys(t, h.s); n != 0 {
		t.Fatalf("%d lease index keys left after every holder acked or expired", n)
	}
	r2 := h.pop(Pop{Queue: "q", Group: "g", Batch: 100, Partitions: 100, LeaseSeconds: 10})
	if len(r2.Messages) != 50 {
		t.Fatalf("after expiry %d messages came back; want the 50 not acknowledged", len(r2.Messages))
	}
	for _, m := range r2.Messages {
		if m.Attempt != 2 {
			t.Fatalf("redelivered message attempt %d; want 2", m.Attempt)
		}
	}
	items = items[:0]
	for _, m := range r2.Messages {
		items = append(items, AckItem{PartitionID: m.PartitionID, TxID: m.TxID, Status: AckCompleted, Group: "g", LeaseID: r2.LeaseID})
	}
	h.ack(items...)
	if n := leaseIndexKeys(t, h.s); n != 0 {
		t.Fatalf("%d lease index keys left after the whole lease was acknowledged; want 0", n)
	}
}

// TestLeaseIndexModel applies random pushes, pops (some reusing an earlier
// lease id), acks, extensions, expiries, seeks and restarts to two stores,
// one of which drops its caches before every entry, and checks them against
// a model of the lease guarantees: one holder per partition and group while
// its lease holds, an acknowledged message is never delivered again,
// attempts never go backwards, acks and extensions succeed exactly while
// the lease holds, and every message is delivered until acknowledged. At
// the end no lease index key is left.
func TestLeaseIndexModel(t *testing.T) {
	seed := time.Now().UnixNano()
	if v := os.Getenv("QUEEN_LEASE_SEED"); v != "" {
		seed, _ = strconv.ParseInt(v, 10, 64)
	}
	t.Logf("seed %d (QUEEN_LEASE_SEED=%d repeats it)", seed, seed)
	rng := rand.New(rand.NewSource(seed))
	// a keeps its caches; b drops them all before every entry; c drops a
	// random part of its cached cursors and lease records, as the cache's
	// trim does.
	a, b, c := newHarness(t), newHarness(t), newHarness(t)
	step := func(cmds ...Command) []any {
		t.Helper()
		b.s.cache = newRecordCache()
		b.now, c.now = a.now, a.now
		c.s.waitCommitted()
		for ref := range c.s.cache.cursors {
			if rng.Intn(3) == 0 {
				delete(c.s.cache.cursors, ref)
			}
		}
		if rng.Intn(3) == 0 {
			clear(c.s.cache.leases)
		}
		if rng.Intn(5) == 0 {
			c.s.cache.settled = newSettledSet()
		}
		ra, rb, rc := a.apply(cmds...), b.apply(cmds...), c.apply(cmds...)
		ja, _ := json.Marshal(ra)
		jb, _ := json.Marshal(rb)
		jc, _ := json.Marshal(rc)
		if !bytes.Equal(ja, jb) || !bytes.Equal(ja, jc) {
			t.Fatalf("seed %d: results differ:\n cached:   %s\n uncached: %s\n trimmed:  %s", seed, ja, jb, jc)
		}
		return ra
	}
	type gp struct {
		group string
		pid   uint64
	}
	type msg struct {
		pid uint64
		off uint64
	}
	type hold struct {
		lease   string
		expires int64
		offs    map[uint64]bool
	}
	groups := []string{"g1", "g2"}
	holds := map[gp]*hold{}
	done := map[string]map[msg]bool{"g1": {}, "g2": {}}
	attempts := map[string]map[msg]uint32{"g1": {}, "g2": {}}
	type leaseInfo struct {
		group   string
		secs    int64
		holders map[gp]bool
	}
	leases := map[string]*leaseInfo{}
	var leaseIDs []string
	pushed := map[msg]bool{}
	var nAcked, nExtended, nRedelivered int
	// sorted lists a lease's holders in a fixed order, so that a seed
	// repeats its run.
	sorted := func(m map[gp]bool) []gp {
		out := make([]gp, 0, len(m))
		for k := range m {
			out = append(out, k)
		}
		sort.Slice(out, func(i, j int) bool {
			if out[i].group != out[j].group {
				return out[i].group < out[j].group
			}
			return out[i].pid < out[j].pid
		})
		return out
	}
	live := func(h *hold) bool { return h != nil && len(h.offs) > 0 && h.expires > a.now }

	// recent picks a lease id, mostly one of the last few (likelier to hold).
	recent := func() string {
		if n := len(leaseIDs); n > 8 && rng.Intn(4) > 0 {
			return leaseIDs[n-1-rng.Intn(8)]
		}
		return leaseIDs[rng.Intn(len(leaseIDs))]
	}
	// positions checks what readers of each store say of the leases
	// against the model (a reader applies the overlays of its snapshot).
	positions := func(i int) {
		t.Helper()
		var js [][]byte
		for _, h := range []*harness{a, b, c} {
			rd := h.s.Reader()
			ps, _ := rd.Partitions("default", "q", 0, 100, a.now)
			rd.Close()
			for _, p := range ps {
				for _, g := range p.Groups {
					hd := holds[gp{g.Group, p.ID}]
					want := live(hd)
					if g.Leased != want || want && (g.LeaseID != hd.lease || g.LeaseExpires != hd.expires) {
						t.Fatalf("seed %d step %d: a reader says %s on %d: leased %v by %s until %d; the model: %v, %+v", seed, i, g.Group, p.ID, g.Leased, g.LeaseID, g.LeaseExpires, want, hd)
					}
				}
			}
			j, _ := json.Marshal(ps)
			js = append(js, j)
		}
		if !bytes.Equal(js[0], js[1]) || !bytes.Equal(js[0], js[2]) {
			t.Fatalf("seed %d step %d: readers differ:\n cached:   %s\n uncached: %s\n trimmed:  %s", seed, i, js[0], js[1], js[2])
		}
	}
	var nDeleted int
	for i := 0; i < 1000; i++ {
		if i%10 == 0 {
			positions(i)
		}
		switch op := rng.Intn(22); {
		case op < 6:
			p := &Push{Tenant: "default"}
			for j := 0; j < 1+rng.Intn(6); j++ {
				p.Items = append(p.Items, PushItem{Queue: "q", Partition: fmt.Sprintf("p%d", rng.Intn(12)), TxID: uuid.NewString(), Generated: true, Payload: []byte(`1`)})
			}
			r := step(p)[0].(*PushResult)
			for _, it := range r.Items {
				pushed[msg{it.PartitionID, it.Offset}] = true
			}
		case op < 12:
			g := groups[rng.Intn(2)]
			// Mostly a node's new UUIDv7, above every id taken so far (no
			// record read); sometimes a random one, below some of them.
			id := uuid.Must(uuid.NewV7()).String()
			if rng.Intn(4) == 0 {
				id = uuid.NewString()
			}
			if len(leaseIDs) > 0 && rng.Intn(5) == 0 {
				id = leaseIDs[rng.Intn(len(leaseIDs))] // a retried pop reuses its id
			}
			secs := int64(1 + rng.Intn(20))
			r := step(&Pop{Tenant: "default", Queue: "q", Group: g, SubMode: "all", Batch: 1 + rng.Intn(12), Partitions: 1 + rng.Intn(6), LeaseSeconds: secs, LeaseID: id})[0].(*PopResult)
			if len(r.Messages) == 0 {
				continue
			}
			if leases[id] == nil {
				leases[id] = &leaseInfo{group: g, secs: secs, holders: map[gp]bool{}}
				leaseIDs = append(leaseIDs, id)
			}
			for _, m := range r.Messages {
				k := gp{g, m.PartitionID}
				mk := msg{m.PartitionID, m.Offset}
				if done[g][mk] {
					t.Fatalf("seed %d step %d: %s got acknowledged message %v again", seed, i, g, mk)
				}
				if m.Attempt < attempts[g][mk] {
					t.Fatalf("seed %d step %d: attempt of %v went back from %d to %d", seed, i, mk, attempts[g][mk], m.Attempt)
				}
				attempts[g][mk] = m.Attempt
				if m.Attempt > 1 {
					nRedelivered++
				}
				h := holds[k]
				if h == nil || h.lease != id || h.expires != a.now+secs*1e6 {
					if live(h) {
						t.Fatalf("seed %d step %d: %v delivered under %s while %s holds it until %d (now %d)", seed, i, k, id, h.lease, h.expires, a.now)
					}
					h = &hold{lease: id, expires: a.now + secs*1e6, offs: map[uint64]bool{}}
					holds[k] = h
					leases[id].holders[k] = true
				}
				h.offs[m.Offset] = true
			}
		case op < 16:
			// Ack some of what some lease holds (or held).
			if len(leaseIDs) == 0 {
				continue
			}
			id := recent()
			li := leases[id]
			var items []AckItem
			var want []bool
			for _, k := range sorted(li.holders) {
				h := holds[k]
				if h == nil || h.lease != id {
					continue
				}
				for _, off := range slices.Sorted(maps.Keys(h.offs)) {
					if rng.Intn(3) == 0 {
						continue
					}
					st := AckCompleted
					if rng.Intn(4) == 0 {
						st = AckFailed
					}
					o := off
					items = append(items, AckItem{PartitionID: k.pid, Offset: &o, Status: st, Group: k.group, LeaseID: id})
					want = append(want, live(h))
				}
			}
			if len(items) == 0 {
				continue
			}
			r := step(&Ack{Tenant: "default", Items: items})[0].(*AckResult)
			for j, it := range r.Items {
				k := gp{items[j].Group, items[j].PartitionID}
				mk := msg{k.pid, *items[j].Offset}
				if it.Success != want[j] && !done[k.group][mk] {
					t.Fatalf("seed %d step %d: ack of %v under %s: success %v (%s); the model says the lease holds: %v", seed, i, mk, id, it.Success, it.Error, want[j])
				}
				if !it.Success {
					continue
				}
				if h := holds[k]; h != nil {
					delete(h.offs, mk.off)
				}
				nAcked++
				if items[j].Status == AckCompleted || it.DLQ {
					done[k.group][mk] = true
				}
			}
		case op < 18:
			if len(leaseIDs) == 0 {
				continue
			}
			id := recent()
			secs := int64(1 + rng.Intn(20))
			r := step(&ExtendLease{Tenant: "default", LeaseID: id, Seconds: secs})[0].(*ExtendResult)
			held := false
			for _, k := range sorted(leases[id].holders) {
				if h := holds[k]; h != nil && h.lease == id && live(h) {
					held = true
					h.expires = a.now + secs*1e6
				}
			}
			if r.Success {
				nExtended++
			}
			if r.Success != held {
				t.Fatalf("seed %d step %d: extend %s: success %v (%s), the model says some partition holds it: %v", seed, i, id, r.Success, r.Error, held)
			}
		case op < 19:
			a.now += int64(1+rng.Intn(8)) * 1e6
			step(&Tick{})
		case op < 20:
			a.reopen()
			b.reopen()
			c.reopen()
		case op < 21:
			// The group goes, leases and all; the next pop creates it
			// again (a new id), from the start: its overlays in the lease
			// records left behind must not apply to the new group.
			g := groups[rng.Intn(2)]
			if !step(&DeleteGroup{Tenant: "default", Queue: "q", Group: g})[0].(*CountResult).Found {
				continue
			}
			nDeleted++
			done[g], attempts[g] = map[msg]bool{}, map[msg]uint32{}
			for k := range holds {
				if k.group == g {
					delete(holds, k)
				}
			}
		default:
			// A seek to the end: the group skips what is there, and its
			// leases end with its cursors.
			g := groups[rng.Intn(2)]
			if !step(&Seek{Tenant: "default", Queue: "q", Group: g, ToEnd: true})[0].(*CountResult).Found {
				continue // the group does not exist yet
			}
			for mk := range pushed {
				done[g][mk] = true
			}
			for k := range holds {
				if k.group == g {
					delete(holds, k)
				}
			}
		}
	}
	positions(-1)
	t.Logf("%d acks, %d extensions, %d redeliveries, %d groups deleted", nAcked, nExtended, nRedelivered, nDeleted)
	if nAcked < 50 || nExtended < 5 || nRedelivered < 10 || nDeleted < 3 {
		t.Fatalf("seed %d: the run exercised too little", seed)
	}
	// Drain: past every lease, each group takes and acknowledges everything.
	a.now += 100e6
	step(&Tick{})
	for _, g := range groups {
		for round := 0; ; round++ {
			r := step(&Pop{Tenant: "default", Queue: "q", Group: g, SubMode: "all", Batch: 50, Partitions: 20, LeaseSeconds: 30, LeaseID: uuid.NewString()})[0].(*PopResult)
			if len(r.Messages) == 0 {
				break
			}
			if round > 100 {
				t.Fatalf("seed %d: %s still draining after 100 rounds", seed, g)
			}
			var items []AckItem
			for _, m := range r.Messages {
				mk := msg{m.PartitionID, m.Offset}
				if done[g][mk] {
					t.Fatalf("seed %d: draining %s got acknowledged message %v again", seed, g, mk)
				}
				done[g][mk] = true
				items = append(items, AckItem{PartitionID: m.PartitionID, TxID: m.TxID, Status: AckCompleted, Group: g, LeaseID: r.LeaseID})
			}
			for _, it := range step(&Ack{Tenant: "default", Items: items})[0].(*AckResult).Items {
				if !it.Success {
					t.Fatalf("seed %d: draining %s: ack failed: %s", seed, g, it.Error)
				}
			}
		}
		for mk := range pushed {
			if !done[g][mk] {
				t.Fatalf("seed %d: %s never finished message %v", seed, g, mk)
			}
		}
	}
	a.now += 100e6
	step(&Tick{})
	if n := leaseIndexKeys(t, a.s); n != 0 {
		t.Fatalf("seed %d: %d lease index keys left once every lease ended", seed, n)
	}
	if ca, cb, cc := checksum(t, a.s), checksum(t, b.s), checksum(t, c.s); ca != cb || ca != cc {
		t.Fatalf("seed %d: state differs: cached %x, uncached %x, trimmed %x", seed, ca, cb, cc)
	}
}

// TestPopAckWritesPerPartition: a pop that takes one message from each of
// 100 partitions that a new group's backfill found, and the ack of them,
// write per partition the holder's overlay in the pop's lease record and
// the ack's cursor record, and nothing else: no lease index
// keys per partition, and no ready key set by the backfill only to be
// deleted by the pop that claims it.
func TestPopAckWritesPerPartition(t *testing.T) {
	h := newHarness(t)
	for i := 0; i < 100; i++ {
		h.push("q", fmt.Sprintf("p%03d", i), `1`)
	}
	h.s.DB() // waits for the pushes' batches to be committed and counted
	before := h.s.WriteStats().BatchBytes
	r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 100, Partitions: 100, LeaseSeconds: 10})
	if len(r.Messages) != 100 {
		t.Fatalf("pop got %d messages; want 100", len(r.Messages))
	}
	h.s.DB()
	popped := h.s.WriteStats().BatchBytes
	var items []AckItem
	for _, m := range r.Messages {
		items = append(items, AckItem{PartitionID: m.PartitionID, TxID: m.TxID, Status: AckCompleted, Group: "g", LeaseID: r.LeaseID})
	}
	for i, it := range h.ack(items...).Items {
		if !it.Success {
			t.Fatalf("ack %d: %s", i, it.Error)
		}
	}
	h.s.DB()
	after := h.s.WriteStats().BatchBytes
	per := float64(after-before) / 100
	// The pop's share is its share of the lease record (the holder and
	// its overlay: offsets, attempt), the cursor record it no longer
	// writes was about 60 bytes; the ack's is the settled cursor record
	// (about 30).
	popShare := float64(popped-before) / 100
	t.Logf("pop+ack wrote %.0f bytes per partition: pop %.0f, ack %.0f", per, popShare, float64(after-popped)/100)
	// Two cursor records and a share of the lease record came to about
	// 100 bytes; the per-partition lease keys and the ready key, each set
	// and deleted, took it past 300 before lease records.
	if per > 60 || popShare > 20 {
		t.Fatalf("pop+ack wrote %.0f bytes per partition (the pop %.0f); want at most 60 (one cursor record and the overlay), the pop at most 20", per, popShare)
	}
	if n := leaseIndexKeys(t, h.s); n != 0 {
		t.Fatalf("%d lease index keys left", n)
	}
}

// TestBackfilledPartitionStaysReady: a partition that a new group's
// backfill found and the same pop claimed goes into the ready index after
// the pop only if it still has work for the group and is not leased: an
// auto-acknowledging pop that takes part of it leaves it ready, and the
// group drains every message exactly once.
func TestBackfilledPartitionStaysReady(t *testing.T) {
	h := newHarness(t)
	for i := 0; i < 10; i++ {
		h.push("q", fmt.Sprintf("p%d", i), `1`, `2`, `3`)
	}
	seen := map[[2]uint64]bool{}
	for round := 0; round < 40; round++ {
		r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 2, Partitions: 1, AutoAck: true})
		if len(r.Messages) == 0 {
			break
		}
		for _, m := range r.Messages {
			k := [2]uint64{m.PartitionID, m.Offset}
			if seen[k] {
				t.Fatalf("round %d: message %v delivered twice", round, k)
			}
			seen[k] = true
		}
	}
	if len(seen) != 30 {
		t.Fatalf("the group got %d of 30 messages: a partition left the ready index with work", len(seen))
	}
}

// TestLeasesTakenBeforeRecords: a store written before lease records
// holds a lease-id key and an expiry key per leased partition. After an
// upgrade those leases still hold, are extended, expire at their time, and
// their keys are deleted when they end.
func TestLeasesTakenBeforeRecords(t *testing.T) {
	h := newHarness(t)
	for i := 0; i < 4; i++ {
		h.push("q", fmt.Sprintf("p%d", i), `1`, `2`)
	}
	r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 8, Partitions: 4, LeaseSeconds: 10})
	if len(r.Messages) != 8 {
		t.Fatalf("pop got %d messages; want 8", len(r.Messages))
	}
	// Rewrite the store as a build before lease records left it: the
	// cursors (version 2) name the lease, and the lease index is a lease
	// id key and an expiry key per partition.
	if n := rewriteAsOldStore(t, h, appendCursorV2); n != 4 {
		t.Fatalf("%d cursor records after the rewrite; want 4", n)
	}
	id, _ := parseLeaseID(r.LeaseID)
	var sub uint64
	if it, err := h.s.DB().NewIter(&pebble.IterOptions{LowerBound: []byte{tCursor}, UpperBound: []byte{tCursor + 1}}); err != nil {
		t.Fatal(err)
	} else {
		if !it.First() {
			t.Fatal("no cursor written")
		}
		sub = lastU64(it.Key()[:13])
		it.Close()
	}
	exp := h.now + 10e6
	b := h.s.DB().NewBatch()
	b.Delete(leaseRecKey(1, id), nil)
	b.Delete(leaseDueKey(exp, 1, id), nil)
	pids := map[uint64]bool{}
	for _, m := range r.Messages {
		pids[m.PartitionID] = true
	}
	for pid := range pids {
		b.Set(leaseIDKey(1, id, sub, pid), nil, nil)
		b.Set(leaseExpKey(exp, 1, sub, pid), nil, nil)
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	h.reopen()
	if n := leaseIndexKeys(t, h.s); n != 8 {
		t.Fatalf("%d lease index keys after the rewrite; want 8 (2 per partition)", n)
	}
	if again := h.pop(Pop{Queue: "q", Group: "g", Batch: 8, Partitions: 4}); len(again.Messages) != 0 {
		t.Fatalf("a lease of the old form did not hold: %d messages delivered", len(again.Messages))
	}
	h.now += 5e6
	if ext := h.apply(&ExtendLease{Tenant: "default", LeaseID: r.LeaseID, Seconds: 10})[0].(*ExtendResult); !ext.Success {
		t.Fatalf("extend of a lease of the old form: %+v", ext)
	}
	// Ack the two messages of the first partition: its keys go.
	var items []AckItem
	first := r.Messages[0].PartitionID
	for _, m := range r.Messages {
		if m.PartitionID == first {
			items = append(items, AckItem{PartitionID: m.PartitionID, TxID: m.TxID, Status: AckCompleted, Group: "g", LeaseID: r.LeaseID})
		}
	}
	for i, it := range h.ack(items...).Items {
		if !it.Success || !it.LeaseReleased && i == len(items)-1 {
			t.Fatalf("ack %d: %+v", i, it)
		}
	}
	if n := leaseIndexKeys(t, h.s); n != 6 {
		t.Fatalf("%d lease index keys after one partition was acknowledged; want 6", n)
	}
	h.now += 6e6 // past the first expiry, within the extension
	h.apply(&Tick{})
	if again := h.pop(Pop{Queue: "q", Group: "g", Batch: 8, Partitions: 4}); len(again.Messages) != 0 {
		t.Fatalf("an extended lease of the old form expired early: %d messages", len(again.Messages))
	}
	h.now += 5e6
	h.apply(&Tick{})
	if n := leaseIndexKeys(t, h.s); n != 0 {
		t.Fatalf("%d lease index keys after the lease expired; want 0", n)
	}
	r2 := h.pop(Pop{Queue: "q", Group: "g", Batch: 8, Partitions: 4, LeaseSeconds: 10})
	if len(r2.Messages) != 6 {
		t.Fatalf("after expiry %d messages came back; want the 6 not acknowledged", len(r2.Messages))
	}
}

// Ended leases leave no entries behind in the record cache: every pop
// takes a new lease id, and the cache would otherwise hold one "absent"
// entry per pop until it reached its bound.
func TestEndedLeasesLeaveTheCache(t *testing.T) {
	h := newHarness(t)
	const cycles = 3 * minLeaseSweep
	for i := 0; i < cycles; i++ {
		h.push("q", "p", `1`)
		r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 1, Partitions: 1, LeaseSeconds: 60})
		if len(r.Messages) != 1 {
			t.Fatalf("cycle %d: popped %d messages, want 1", i, len(r.Messages))
		}
		off := r.Messages[0].Offset
		a := h.ack(AckItem{PartitionID: r.Messages[0].PartitionID, Offset: &off, Status: AckCompleted, Group: "g", LeaseID: r.LeaseID})
		if !a.Items[0].Success || !a.Items[0].LeaseReleased {
			t.Fatalf("cycle %d: ack %+v, want success and the lease released", i, a.Items[0])
		}
	}
	h.apply() // an entry of its own: the trim runs before each batch
	if n := len(h.s.cache.leases); n > 2*minLeaseSweep {
		t.Fatalf("after %d leases taken and released the cache holds %d lease entries, want at most %d", cycles, n, 2*minLeaseSweep)
	}
}

// A pop's new lease id, above every lease id the store holds, takes its
// lease without reading the lease record (there is none); an id below
// them reads it, so that a lease id used again keeps its holders, also
// after a restart.
func TestNewLeaseIsNotRead(t *testing.T) {
	h := newHarness(t)
	for _, p := range []string{"a", "b", "c", "d"} {
		h.push("q", p, `1`)
	}
	pop := func(part, lease string) (*PopResult, uint64) {
		t.Helper()
		before := h.s.pointReads
		r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Partition: ptr(part), Batch: 10, Partitions: 1, LeaseSeconds: 60, LeaseID: lease})
		if len(r.Messages) != 1 {
			t.Fatalf("pop of %s under %s: %d messages, want 1", part, lease, len(r.Messages))
		}
		return r, h.s.pointReads - before
	}
	reused := uuid.Must(uuid.NewV7()).String()
	pop("a", reused)
	_, fresh := pop("b", uuid.Must(uuid.NewV7()).String())
	old := "00000000-0000-4000-8000-000000000001"

	if _, below := pop("c", old); below != fresh+1 {
		t.Fatalf("a pop under a new lease id made %d point reads, one under an id below the others %d; want one more (its record)", fresh, below)
	}
	h.reopen()
	// The id of partition a's lease, used again after a restart: its record
	// is read and keeps a, so extending the lease extends both holders.
	pop("d", reused)
	h.now += 50e6
	if ext := h.apply(&ExtendLease{Tenant: "default", LeaseID: reused, Seconds: 60})[0].(*ExtendResult); !ext.Success {
		t.Fatalf("extend: %+v", ext)
	}
	h.now += 30e6 // past the first expiry, within the extension
	h.apply(&Tick{})
	if again := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 10, Partitions: 10, LeaseSeconds: 60}); len(again.Messages) != 2 {
		t.Fatalf("after the extension and a tick %d messages were delivered again; want 2 (b and c, whose leases ran out)", len(again.Messages))
	} else {
		for _, m := range again.Messages {
			if m.Partition == "a" || m.Partition == "d" {
				t.Fatalf("partition %s was delivered again: the reused lease lost its holder", m.Partition)
			}
		}
	}
}
