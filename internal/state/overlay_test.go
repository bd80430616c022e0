package state

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestKillReplaysToTheSameState: a store killed at random points (closed
// without flushing: what Pebble had not flushed is lost, as with kill -9,
// since its WAL is off) and started again replays the log from its applied
// index and ends with the same replies and the same state as a store that
// ran through, whatever batches either applied the log in. The log is the
// determinism test's: pops that lease without writing cursors, acks,
// expiries, extensions, seeks and deleted groups. With
// QUEEN_KILL_SEED the run repeats.
func TestKillReplaysToTheSameState(t *testing.T) {
	seed := time.Now().UnixNano()
	if v, err := strconv.ParseInt(os.Getenv("QUEEN_KILL_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (QUEEN_KILL_SEED=%d repeats it)", seed, seed)
	rng := rand.New(rand.NewSource(seed))
	for round := 0; round < 4; round++ {
		log := encodeAll(t, randomCommands(rng.Int63(), 300))
		ref, err := Open(t.TempDir(), Options{})
		if err != nil {
			t.Fatal(err)
		}
		want := make([][]any, len(log))
		for i := range log {
			res, err := ref.ApplyBatch(log[i : i+1])
			if err != nil {
				t.Fatal(err)
			}
			want[i] = res[0]
		}
		sum := checksum(t, ref)
		ref.Close()

		dir := t.TempDir()
		s, err := Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		kills := 0
		for i := 0; i < len(log); {
			if rng.Intn(6) == 0 {
				if err := s.CloseUnflushed(); err != nil {
					t.Fatal(err)
				}
				if s, err = Open(dir, Options{}); err != nil {
					t.Fatal(err)
				}
				kills++
				// Raft hands the entries after the store's applied index
				// to it again.
				i = int(s.AppliedIndex())
				continue
			}
			if rng.Intn(4) == 0 {
				// Flushed: what the next kill cannot take.
				s.waitCommitted()
				if err := s.db.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			end := min(i+1+rng.Intn(20), len(log))
			res, err := s.ApplyBatch(log[i:end])
			if err != nil {
				t.Fatal(err)
			}
			for j := range res {
				ja, _ := json.Marshal(want[i+j])
				jb, _ := json.Marshal(res[j])
				if string(ja) != string(jb) {
					t.Fatalf("seed %d round %d: entry %d after %d kills replied %s, want %s", seed, round, i+j+1, kills, jb, ja)
				}
			}
			i = end
		}
		if got := checksum(t, s); got != sum {
			t.Fatalf("seed %d round %d: after %d kills the state is %x, want %x", seed, round, kills, got, sum)
		}
		s.Close()
	}
}

// TestOldStoreLeasesAfterUpgrade: a store left by a build before overlays
// holds lease records without them and version 2 cursors that name their
// lease. After the upgrade those leases hold, are extended, expire and are
// acknowledged as before; a pop retried with the same lease id adds holders
// with overlays to such a record; and the store replies and ends like one
// that never held the old form (the two compared by what they read, since
// their bytes differ).
func TestOldStoreLeasesAfterUpgrade(t *testing.T) {
	old, cur := newHarness(t), newHarness(t)
	both := func(f func(h *harness) any) any {
		t.Helper()
		ra, rb := f(old), f(cur)
		if ja, jb := fmt.Sprintf("%+v", ra), fmt.Sprintf("%+v", rb); ja != jb {
			t.Fatalf("the upgraded store replied %s, the other %s", ja, jb)
		}
		return ra
	}
	sameState := func(when string) {
		t.Helper()
		ma, mb := logicalDump(t, old), logicalDump(t, cur)
		if !reflect.DeepEqual(ma, mb) {
			for k, v := range ma {
				if mb[k] != v {
					t.Logf("key %x: %q / %q", k, v, mb[k])
				}
			}
			t.Fatalf("%s: the upgraded store reads differently", when)
		}
	}
	both(func(h *harness) any {
		for i := 0; i < 6; i++ {
			pushSame(h, "q", fmt.Sprintf("p%d", i), `1`, `2`, `3`)
		}
		return nil
	})
	lease := uuid.NewString()
	r := both(func(h *harness) any {
		return h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 8, Partitions: 4, LeaseSeconds: 10, LeaseID: lease})
	}).(*PopResult)
	if len(r.Messages) != 8 {
		t.Fatalf("pop got %d messages; want 8", len(r.Messages))
	}
	// The old build's store: cursors of version 2 naming the lease, the
	// lease record without overlays.
	if n := rewriteAsOldStore(t, old, appendCursorV2); n != r.Claimed {
		t.Fatalf("%d cursor records after the rewrite; want %d", n, r.Claimed)
	}
	for _, lh := range leaseHolders(t, old, lease) {
		if lh.ov != nil {
			t.Fatal("the rewritten lease record carries an overlay")
		}
	}
	old.reopen()
	cur.reopen()
	sameState("after the upgrade")
	leasedParts := map[uint64]bool{}
	for _, m := range r.Messages {
		leasedParts[m.PartitionID] = true
	}
	again := both(func(h *harness) any {
		return popSame(h, Pop{Queue: "q", Group: "g", Batch: 8, Partitions: 4, LeaseSeconds: 10})
	}).(*PopResult)
	for _, m := range again.Messages {
		if leasedParts[m.PartitionID] {
			t.Fatalf("after the upgrade a pop got %d@%d of a leased partition", m.PartitionID, m.Offset)
		}
	}
	if len(again.Messages) == 0 {
		t.Fatal("after the upgrade a pop got nothing")
	}
	old.now += 5e6
	cur.now = old.now
	if ext := both(func(h *harness) any {
		return h.apply(&ExtendLease{Tenant: "default", LeaseID: lease, Seconds: 10})[0]
	}).(*ExtendResult); !ext.Success {
		t.Fatalf("extend of a lease of the old form: %+v", ext)
	}
	// Ack the first partition's messages and one of the second's.
	first, second := r.Messages[0].PartitionID, uint64(0)
	var items []AckItem
	for _, m := range r.Messages {
		if m.PartitionID == first || second == 0 && m.PartitionID != first {
			if m.PartitionID != first {
				second = m.PartitionID
			}
			items = append(items, AckItem{PartitionID: m.PartitionID, TxID: m.TxID, Status: AckCompleted, Group: "g", LeaseID: lease})
		}
	}
	both(func(h *harness) any { return h.ack(items...).Items })
	sameState("after acks")
	// A retried pop under the same id takes the first partition again:
	// the old record gains a holder with an overlay.
	pushSame(old, "q", "p-late", `9`)
	pushSame(cur, "q", "p-late", `9`)
	r2 := both(func(h *harness) any {
		return h.pop(Pop{Queue: "q", Group: "g", Batch: 20, Partitions: 6, LeaseSeconds: 10, LeaseID: lease})
	}).(*PopResult)
	if len(r2.Messages) == 0 {
		t.Fatal("the retried pop got nothing")
	}
	mixed := leaseHolders(t, old, lease)
	var with, without int
	for _, lh := range mixed {
		if lh.ov != nil {
			with++
		} else {
			without++
		}
	}
	if with == 0 || without == 0 {
		t.Fatalf("the record after the retried pop: %d holders with overlays, %d without; want both", with, without)
	}
	old.reopen()
	cur.reopen()
	sameState("after the retried pop")
	// Past every expiry: everything not acknowledged comes again, one
	// attempt more, in both.
	old.now += 30e6
	cur.now = old.now
	both(func(h *harness) any { return h.apply(&Tick{})[0] })
	r3 := both(func(h *harness) any {
		return popSame(h, Pop{Queue: "q", Group: "g", Batch: 50, Partitions: 10, LeaseSeconds: 10})
	}).(*PopResult)
	last := map[[2]uint64]uint32{}
	for _, p := range []*PopResult{r, again, r2} {
		for _, m := range p.Messages {
			last[[2]uint64{m.PartitionID, m.Offset}] = m.Attempt
		}
	}
	for _, m := range r3.Messages {
		if a, ok := last[[2]uint64{m.PartitionID, m.Offset}]; ok && m.Attempt != a+1 || !ok && m.Attempt != 1 {
			t.Fatalf("%d@%d came again with attempt %d; it had %d (delivered before: %v)", m.PartitionID, m.Offset, m.Attempt, a, ok)
		}
	}
	if len(r3.Messages) == 0 {
		t.Fatal("nothing came again after the expiry")
	}
	sameState("after the expiry")
	old.now += 30e6
	cur.now = old.now
	both(func(h *harness) any { return h.apply(&Tick{})[0] })
	if n, m := leaseIndexKeys(t, old.s), leaseIndexKeys(t, cur.s); n != 0 || m != 0 {
		for _, h := range []*harness{old, cur} {
			for k, v := range logicalDump(t, h) {
				if k[0] == tLeaseID || k[0] == tLeaseExp {
					t.Logf("%x: %q", k, v)
				}
			}
		}
		t.Fatalf("%d lease index keys left in the upgraded store, %d in the other", n, m)
	}
}

// TestRetentionOfLeasedMessages: retention that drops messages a pop
// leased without writing the cursor skips them for the group (the cursor is
// written then, overlay and all); acks of what is left succeed, acks of what
// went fail alike, and a store that drops its caches before every command,
// and one that reopens, reply and end alike.
func TestRetentionOfLeasedMessages(t *testing.T) {
	hs := []*harness{newHarness(t), newHarness(t), newHarness(t)}
	all := func(f func(h *harness) any) any {
		t.Helper()
		hs[1].s.cache = newRecordCache()
		var first string
		var out any
		for i, h := range hs {
			r := f(h)
			j, _ := json.Marshal(r)
			if i == 0 {
				first, out = string(j), r
			} else if string(j) != first {
				t.Fatalf("store %d replied %s, want %s", i, j, first)
			}
		}
		hs[2].reopen()
		return out
	}
	all(func(h *harness) any {
		h.configure("q", map[string]string{"retentionMessages": "5"})
		for i := 0; i < 5; i++ {
			pushSame(h, "q", "p", fmt.Sprintf(`%d`, i))
		}
		return nil
	})
	r := all(func(h *harness) any {
		return h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 4, LeaseSeconds: 30, LeaseID: "00000000-0000-4000-8000-000000000001"})
	}).(*PopResult)
	if got := offsets(r); !slices.Equal(got, []uint64{0, 1, 2, 3}) {
		t.Fatalf("popped %v", got)
	}
	if n := cursorRecords(t, hs[0]); n != 0 {
		t.Fatalf("the pop wrote %d cursor records", n)
	}
	// Three more messages: retention keeps the last 5, dropping 0-2.
	all(func(h *harness) any {
		for i := 5; i < 8; i++ {
			pushSame(h, "q", "p", fmt.Sprintf(`%d`, i))
		}
		return h.queueInfo("q")
	})
	acks := all(func(h *harness) any {
		var items []AckItem
		for _, m := range r.Messages {
			o := m.Offset
			items = append(items, AckItem{PartitionID: m.PartitionID, Offset: &o, TxIDKnown: true, Status: AckCompleted, Group: "g", LeaseID: r.LeaseID})
		}
		return h.ack(items...).Items
	}).([]AckItemResult)
	for i, a := range acks[:3] {
		if a.Success || a.Error != "message_not_found" {
			t.Fatalf("ack of dropped offset %d: %+v; want message_not_found", i, a)
		}
	}
	if !acks[3].Success || acks[3].LeaseReleased {
		t.Fatalf("the ack of the retained leased message: %+v; want success, the lease held (its dropped offsets are still its own)", acks[3])
	}
	// The lease keeps the partition until it lapses (as before overlays).
	if r := all(func(h *harness) any { return popSame(h, Pop{Queue: "q", Group: "g", Batch: 10, LeaseSeconds: 30}) }).(*PopResult); len(r.Messages) != 0 {
		t.Fatalf("a pop while the lease holds got %v", offsets(r))
	}
	all(func(h *harness) any {
		h.now += 31e6
		return h.apply(&Tick{})[0]
	})
	r2 := all(func(h *harness) any {
		return popSame(h, Pop{Queue: "q", Group: "g", Batch: 10, LeaseSeconds: 30})
	}).(*PopResult)
	if got := offsets(r2); !slices.Equal(got, []uint64{4, 5, 6, 7}) {
		t.Fatalf("after retention popped %v, want [4 5 6 7]", got)
	}
	if a, b, c := checksum(t, hs[0].s), checksum(t, hs[1].s), checksum(t, hs[2].s); a != b || a != c {
		t.Fatalf("checksums differ: %x %x %x", a, b, c)
	}
}

// TestAttemptsSurviveExpiryAndRestart: a message whose leases lapse again
// and again, with the store restarted between each pop and its expiry (so
// that every cursor is read from its record and the lease record's
// overlay), comes back with one attempt more each time, never fewer; and a
// pop that leases it writes no cursor record.
func TestAttemptsSurviveExpiryAndRestart(t *testing.T) {
	h := newHarness(t)
	h.push("q", "p", `1`)
	for want := uint32(1); want <= 5; want++ {
		r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 1, LeaseSeconds: 5})
		if len(r.Messages) != 1 || r.Messages[0].Attempt != want {
			t.Fatalf("pop %d: %+v; want attempt %d", want, r.Messages, want)
		}
		if hs := leaseHolders(t, h, r.LeaseID); len(hs) != 1 || hs[0].ov == nil || hs[0].ov.runs[0].attempt != want {
			t.Fatalf("pop %d: its lease record %+v; want one holder with an overlay of attempt %d", want, hs, want)
		}
		h.reopen()
		if again := h.pop(Pop{Queue: "q", Group: "g", Batch: 1}); len(again.Messages) != 0 {
			t.Fatalf("pop %d: after a restart the leased message came again: %+v", want, again.Messages)
		}
		h.reopen()
		h.now += 6e6
		h.apply(&Tick{})
		h.reopen()
	}
}

// pushSame pushes with transaction ids of the harness's log index, so
// that harnesses in step push the same messages.
func pushSame(h *harness, queue, part string, payloads ...string) {
	h.t.Helper()
	c := &Push{Tenant: "default"}
	for i, p := range payloads {
		c.Items = append(c.Items, PushItem{Queue: queue, Partition: part, TxID: fmt.Sprintf("%s-%d-%d", part, h.index+1, i), Payload: []byte(p)})
	}
	if r := h.apply(c)[0].(*PushResult); r.Err != nil {
		h.t.Fatalf("push: %v", r.Err)
	}
}

// popSame pops under a lease id of the harness's log index (unless c has
// one).
func popSame(h *harness, c Pop) *PopResult {
	if c.LeaseID == "" {
		c.LeaseID = fmt.Sprintf("00000000-0000-4000-8000-%012d", h.index+1)
	}
	return h.pop(c)
}

// TestDeterminismRandomBatchings applies random logs in random batches,
// with caches dropped before some batches and the store reopened between
// some, and requires the replies and the state of one entry per batch
// (a store dropping its caches reads every cursor from its record and the
// overlays): whether a pop
// writes its cursor, and what the flush writes of a cursor a pop did not
// write, must not depend on where batches end (replicas batch alike only
// by chance). QUEEN_BATCH_SEED repeats a run.
func TestDeterminismRandomBatchings(t *testing.T) {
	seed := time.Now().UnixNano()
	if v, err := strconv.ParseInt(os.Getenv("QUEEN_BATCH_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (QUEEN_BATCH_SEED=%d repeats it)", seed, seed)
	rng := rand.New(rand.NewSource(seed))
	rounds := 12
	if testing.Short() {
		rounds = 3
	}
	for round := 0; round < rounds; round++ {
		log := encodeAll(t, randomCommands(rng.Int63(), 400))
		var sums []uint64
		replies := make([]string, len(log))
		for run := 0; run < 4; run++ {
			dir := t.TempDir()
			s, err := Open(dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < len(log); {
				n := 1
				if run > 0 {
					n = 1 + rng.Intn(80)
				}
				if run == 2 {
					s.cache = newRecordCache()
				}
				if run == 3 && rng.Intn(10) == 0 {
					s.Close()
					if s, err = Open(dir, Options{}); err != nil {
						t.Fatal(err)
					}
				}
				end := min(i+n, len(log))
				res, err := s.ApplyBatch(log[i:end])
				if err != nil {
					t.Fatal(err)
				}
				for j, r := range res {
					js, _ := json.Marshal(r)
					if run == 0 {
						replies[i+j] = string(js)
					} else if string(js) != replies[i+j] {
						t.Fatalf("seed %d round %d run %d: entry %d replied %s, one entry per batch %s", seed, round, run, i+j+1, js, replies[i+j])
					}
				}
				i = end
			}
			sums = append(sums, checksum(t, s))
			s.Close()
		}
		for i := 1; i < len(sums); i++ {
			if sums[i] != sums[0] {
				t.Fatalf("seed %d round %d: run %d ends with state %x, one entry per batch with %x", seed, round, i, sums[i], sums[0])
			}
		}
	}
}

// TestPopAckPopInOneEntry: a pop, the ack of everything it leased and a
// second pop of the same partition in one log entry share the entry's
// index, which the cursor's stamp cannot tell apart, so the second pop
// writes the cursor: after a restart its lease still holds, and the state
// is the one a store keeping its caches has.
func TestPopAckPopInOneEntry(t *testing.T) {
	a, b := newHarness(t), newHarness(t)
	for _, h := range []*harness{a, b} {
		pushSame(h, "q", "p", `1`, `2`, `3`, `4`)
	}
	l1, l2 := "00000000-0000-4000-8000-100000000001", "00000000-0000-4000-8000-100000000002"
	var pid uint64
	for _, h := range []*harness{a, b} {
		// The partition's id: a pop by another group.
		pid = popSame(h, Pop{Queue: "q", Group: "other", SubMode: "all", Batch: 1}).Messages[0].PartitionID
	}
	zero, one := uint64(0), uint64(1)
	entry := []Command{
		&Pop{Tenant: "default", Queue: "q", Group: "g", SubMode: "all", Batch: 2, LeaseSeconds: 30, LeaseID: l1},
		&Ack{Tenant: "default", Items: []AckItem{
			{PartitionID: pid, Offset: &zero, TxIDKnown: true, Status: AckCompleted, Group: "g", LeaseID: l1},
			{PartitionID: pid, Offset: &one, TxIDKnown: true, Status: AckCompleted, Group: "g", LeaseID: l1},
		}},
		&Pop{Tenant: "default", Queue: "q", Group: "g", Batch: 2, LeaseSeconds: 30, LeaseID: l2},
	}
	ra, rb := a.apply(entry...), b.apply(entry...)
	if got := offsets(ra[2].(*PopResult)); !slices.Equal(got, []uint64{2, 3}) {
		t.Fatalf("the second pop got %v, want [2 3]", got)
	}
	if fmt.Sprint(ra[2].(*PopResult).Messages) != fmt.Sprint(rb[2].(*PopResult).Messages) {
		t.Fatal("the two stores popped differently")
	}
	b.reopen()
	for _, h := range []*harness{a, b} {
		if r := popSame(h, Pop{Queue: "q", Group: "g", Batch: 4, LeaseSeconds: 30}); len(r.Messages) != 0 {
			t.Fatalf("while the second pop's lease holds a pop got %v", offsets(r))
		}
	}
	if ca, cb := checksum(t, a.s), checksum(t, b.s); ca != cb {
		t.Fatalf("state differs: %x kept its caches, %x reopened", ca, cb)
	}
	// The second lease lapses: its messages come again, attempt 2.
	for _, h := range []*harness{a, b} {
		h.now += 31e6
		h.apply(&Tick{})
		r := popSame(h, Pop{Queue: "q", Group: "g", Batch: 4, LeaseSeconds: 30})
		if got := offsets(r); !slices.Equal(got, []uint64{2, 3}) || r.Messages[0].Attempt != 2 {
			t.Fatalf("after the second lease lapsed a pop got %v (%+v), want [2 3] at attempt 2", got, r.Messages)
		}
	}
}
