package state

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"testing"

	"github.com/google/uuid"
)

// harness applies entries to a store with a controlled clock.
type harness struct {
	t     testing.TB
	dir   string
	s     *Store
	index uint64
	now   int64
}

func newHarness(t testing.TB) *harness {
	t.Helper()
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &harness{t: t, dir: dir, s: s, now: 1_700_000_000_000_000}
}

// apply applies one entry of commands and returns their results.
func (h *harness) apply(cmds ...Command) []any {
	h.t.Helper()
	h.index++
	data, err := EncodeEntry(&Entry{Time: h.now, Cmds: cmds})
	if err != nil {
		h.t.Fatal(err)
	}
	res, err := h.s.ApplyBatch([]LogEntry{{Index: h.index, Data: data}})
	if err != nil {
		h.t.Fatal(err)
	}
	return res[0]
}

func (h *harness) push(queue, part string, payloads ...string) *PushResult {
	h.t.Helper()
	c := &Push{Tenant: "default"}
	for _, p := range payloads {
		c.Items = append(c.Items, PushItem{Queue: queue, Partition: part, TxID: uuid.NewString(), Generated: true, Payload: []byte(p)})
	}
	r := h.apply(c)[0].(*PushResult)
	if r.Err != nil {
		h.t.Fatalf("push: %v", r.Err)
	}
	return r
}

func (h *harness) pop(c Pop) *PopResult {
	h.t.Helper()
	c.Tenant = "default"
	if c.LeaseID == "" {
		c.LeaseID = uuid.Must(uuid.NewV7()).String() // as the broker makes them
	}
	return h.apply(&c)[0].(*PopResult)
}

func (h *harness) ack(items ...AckItem) *AckResult {
	h.t.Helper()
	return h.apply(&Ack{Tenant: "default", Items: items})[0].(*AckResult)
}

// reopen closes the harness's store and opens it again.
func (h *harness) reopen() {
	h.t.Helper()
	if err := h.s.Close(); err != nil {
		h.t.Fatal(err)
	}
	s, err := Open(h.dir, Options{})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { s.Close() })
	h.s = s
}

func offsets(r *PopResult) []uint64 {
	var out []uint64
	for _, m := range r.Messages {
		out = append(out, m.Offset)
	}
	return out
}

func TestPerMessageAckAndLeaseExpiry(t *testing.T) {
	h := newHarness(t)
	h.push("q", "p", `1`, `2`, `3`, `4`, `5`)
	r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 5, Partitions: 1, LeaseSeconds: 10})
	if got := offsets(r); fmt.Sprint(got) != "[0 1 2 3 4]" {
		t.Fatalf("first pop offsets = %v", got)
	}
	pid := r.Messages[0].PartitionID
	// Ack 1 and 3 only; 0, 2, 4 stay unacknowledged.
	o1, o3 := uint64(1), uint64(3)
	a := h.ack(AckItem{PartitionID: pid, Offset: &o1, Status: AckCompleted, Group: "g", LeaseID: r.LeaseID},
		AckItem{PartitionID: pid, Offset: &o3, Status: AckCompleted, Group: "g", LeaseID: r.LeaseID})
	for _, it := range a.Items {
		if !it.Success || it.LeaseReleased {
			t.Fatalf("ack result %+v", it)
		}
	}
	// While the lease holds, nothing is delivered to the group.
	if r2 := h.pop(Pop{Queue: "q", Group: "g", Batch: 5, Partitions: 1}); len(r2.Messages) != 0 {
		t.Fatalf("delivered %v while leased", offsets(r2))
	}
	// The lease expires: exactly the unacknowledged offsets come back, in order.
	h.now += 11e6
	h.apply(&Tick{})
	r3 := h.pop(Pop{Queue: "q", Group: "g", Batch: 5, Partitions: 1, LeaseSeconds: 10})
	if got := offsets(r3); fmt.Sprint(got) != "[0 2 4]" {
		t.Fatalf("after expiry offsets = %v, want [0 2 4]", got)
	}
	for _, m := range r3.Messages {
		if m.Attempt != 2 {
			t.Fatalf("offset %d attempt = %d, want 2", m.Offset, m.Attempt)
		}
	}
	// A stale lease id is refused and changes nothing.
	o0 := uint64(0)
	if a := h.ack(AckItem{PartitionID: pid, Offset: &o0, Status: AckCompleted, Group: "g", LeaseID: r.LeaseID}); a.Items[0].Success || a.Items[0].Error != "lease_expired" {
		t.Fatalf("stale lease ack = %+v", a.Items[0])
	}
	var items []AckItem
	for _, m := range r3.Messages {
		off := m.Offset
		items = append(items, AckItem{PartitionID: pid, Offset: &off, Status: AckCompleted, Group: "g", LeaseID: r3.LeaseID})
	}
	a = h.ack(items...)
	if !a.Items[2].LeaseReleased {
		t.Fatalf("lease not released after the whole batch was acked: %+v", a.Items)
	}
	if r4 := h.pop(Pop{Queue: "q", Group: "g", Batch: 5, Partitions: 1}); len(r4.Messages) != 0 {
		t.Fatalf("redelivered %v after all acked", offsets(r4))
	}
}

func TestFailedRetriedThenDeadLettered(t *testing.T) {
	h := newHarness(t)
	h.apply(&Configure{Tenant: "default", Queue: "q", Options: map[string]json.RawMessage{"retryLimit": json.RawMessage("1"), "retryDelay": json.RawMessage("2000")}})
	h.push("q", "p", `"a"`, `"b"`)
	for attempt := uint32(1); attempt <= 2; attempt++ {
		r := h.pop(Pop{Queue: "q", Batch: 1, Partitions: 1})
		if len(r.Messages) != 1 || r.Messages[0].Offset != 0 || r.Messages[0].Attempt != attempt || r.Messages[0].Retries != attempt-1 {
			t.Fatalf("attempt %d: got %+v", attempt, r.Messages)
		}
		a := h.ack(AckItem{PartitionID: r.Messages[0].PartitionID, TxID: r.Messages[0].TxID, Status: AckFailed, LeaseID: r.LeaseID, Error: "boom"})
		if !a.Items[0].Success || a.Items[0].DLQ != (attempt == 2) {
			t.Fatalf("attempt %d ack = %+v", attempt, a.Items[0])
		}
		if attempt == 1 {
			// retryDelay hides the message, and holds the partition in order.
			if r := h.pop(Pop{Queue: "q", Batch: 2, Partitions: 1}); len(r.Messages) != 0 {
				t.Fatalf("delivered %v during retryDelay", offsets(r))
			}
			h.now += 2e6
			h.apply(&Tick{})
		}
	}
	r := h.pop(Pop{Queue: "q", Batch: 2, Partitions: 1})
	if got := offsets(r); fmt.Sprint(got) != "[1]" {
		t.Fatalf("partition did not carry on after the dead letter: %v", got)
	}
	rd := h.s.Reader()
	defer rd.Close()
	dl, total, err := rd.DLQ("default", "q", QueueModeGroup, "", 10, 0)
	if err != nil || total != 1 || dl[0].Error != "boom" || dl[0].Offset != 0 || string(dl[0].Payload) != `"a"` {
		t.Fatalf("dlq = %+v total %d err %v", dl, total, err)
	}
}

func TestNewGroupStartsAtEndAndAllFromStart(t *testing.T) {
	h := newHarness(t)
	h.push("q", "a", `1`, `2`)
	h.push("q", "b", `3`)
	if r := h.pop(Pop{Queue: "q", Group: "late", Batch: 10, Partitions: 10}); len(r.Messages) != 0 {
		t.Fatalf("new group saw old messages: %v", offsets(r))
	}
	h.push("q", "a", `4`)
	if r := h.pop(Pop{Queue: "q", Group: "late", Batch: 10, Partitions: 10, AutoAck: true}); len(r.Messages) != 1 || string(r.Messages[0].Payload) != "4" {
		t.Fatalf("new group got %+v, want only the message pushed after it", r.Messages)
	}
	r := h.pop(Pop{Queue: "q", Group: "early", SubMode: "all", Batch: 10, Partitions: 10, AutoAck: true})
	if len(r.Messages) != 4 || r.Claimed != 2 {
		t.Fatalf("all-group got %d messages from %d partitions, want 4 from 2", len(r.Messages), r.Claimed)
	}
}

// randomCommands builds a reproducible workload touching every command.
func randomCommands(seed int64, n int) [][]Command {
	rng := rand.New(rand.NewSource(seed))
	ids := func() string {
		var b [16]byte
		rng.Read(b[:])
		return uuid.UUID(b).String()
	}
	var entries [][]Command
	var leases, txids []string
	for i := 0; i < n; i++ {
		var cmds []Command
		for j := 0; j < 1+rng.Intn(4); j++ {
			q := fmt.Sprintf("q%d", rng.Intn(3))
			switch k := rng.Intn(10); {
			case k < 4:
				p := &Push{Tenant: "default"}
				for m := 0; m < 1+rng.Intn(5); m++ {
					tx := ids()
					if rng.Intn(5) == 0 {
						tx = fmt.Sprintf("dup-%d", rng.Intn(20))
					}
					txids = append(txids, tx)
					p.Items = append(p.Items, PushItem{Queue: q, Partition: fmt.Sprintf("p%d", rng.Intn(5)), TxID: tx, Payload: []byte(fmt.Sprintf(`{"i":%d}`, i))})
				}
				cmds = append(cmds, p)
			case k < 7:
				l := ids()
				leases = append(leases, l)
				groups := []string{"", "g1", "g2"}
				cmds = append(cmds, &Pop{Tenant: "default", Queue: q, Group: groups[rng.Intn(3)], SubMode: "all", Batch: 1 + rng.Intn(5), Partitions: 1 + rng.Intn(3), LeaseSeconds: 5, LeaseID: l, AutoAck: rng.Intn(4) == 0})
			case k < 9:
				st := []string{AckCompleted, AckFailed, AckRetry, AckDLQ}[rng.Intn(4)]
				off := uint64(rng.Intn(6))
				lease := ""
				if len(leases) > 0 && rng.Intn(2) == 0 {
					lease = leases[rng.Intn(len(leases))]
				}
				item := AckItem{PartitionID: uint64(1 + rng.Intn(15)), Offset: &off, Status: st, Group: []string{"", "g1"}[rng.Intn(2)], LeaseID: lease}
				if len(txids) > 0 && rng.Intn(2) == 0 {
					// By transaction id, as clients do (found through the
					// cursor's memory of its last delivery, or the dedup index).
					item.Offset, item.TxID = nil, txids[len(txids)-1-rng.Intn(min(len(txids), 30))]
				}
				cmds = append(cmds, &Ack{Tenant: "default", Items: []AckItem{item}})
			default:
				switch rng.Intn(5) {
				case 0:
					cmds = append(cmds, &Tick{})
				case 1:
					cmds = append(cmds, &Seek{Tenant: "default", Group: "g1", Queue: q, ToStart: true})
				case 2:
					cmds = append(cmds, &Configure{Tenant: "default", Queue: q, Options: map[string]json.RawMessage{"retryLimit": json.RawMessage("1")}})
				case 3:
					if len(leases) > 0 {
						cmds = append(cmds, &ExtendLease{Tenant: "default", LeaseID: leases[rng.Intn(len(leases))], Seconds: 7})
					}
				case 4:
					cmds = append(cmds, &DeleteGroup{Tenant: "default", Group: "g2", Queue: q})
				}
			}
		}
		entries = append(entries, cmds)
	}
	return entries
}

func encodeAll(t *testing.T, entries [][]Command) []LogEntry {
	var out []LogEntry
	now := int64(1_700_000_000_000_000)
	for i, cmds := range entries {
		now += 700_000 // 0.7 s per entry: leases expire during the run
		data, err := EncodeEntry(&Entry{Time: now, Cmds: cmds})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, LogEntry{Index: uint64(i + 1), Data: data})
	}
	return out
}

func checksum(t *testing.T, s *Store) uint64 {
	sum, err := s.Checksum()
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// TestDeterminism applies the same log to fresh stores, batched differently,
// with the record caches dropped before every batch, and replayed after a
// reopen, and requires identical state. (The caches, the in-memory ready
// index and a cursor's memory of its last delivery may change only speed.)
func TestDeterminism(t *testing.T) {
	for seed := int64(1); seed <= 3; seed++ {
		log := encodeAll(t, randomCommands(seed, 400))
		var sums []uint64
		for run, batch := range []int{1, 7, 64, 3} {
			s, err := Open(t.TempDir(), Options{})
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < len(log); i += batch {
				if run == 3 {
					s.cache = newRecordCache()
				}
				end := min(i+batch, len(log))
				if _, err := s.ApplyBatch(log[i:end]); err != nil {
					t.Fatal(err)
				}
			}
			sums = append(sums, checksum(t, s))
			s.Close()
		}
		for i := 1; i < len(sums); i++ {
			if sums[i] != sums[0] {
				t.Fatalf("seed %d: state differs between batchings: %x vs %x", seed, sums[0], sums[i])
			}
		}
		// Replay after reopen: entries at or below the applied index are skipped.
		dir := t.TempDir()
		s, err := Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.ApplyBatch(log[:250]); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if s, err = Open(dir, Options{}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ApplyBatch(log); err != nil { // replays 1..250 as no-ops
			t.Fatal(err)
		}
		if got := checksum(t, s); got != sums[0] {
			t.Fatalf("seed %d: replay after reopen gave %x, want %x", seed, got, sums[0])
		}
		if s.AppliedIndex() != uint64(len(log)) {
			t.Fatalf("applied index %d, want %d", s.AppliedIndex(), len(log))
		}
		s.Close()
	}
}

func TestMessageIDRoundTrip(t *testing.T) {
	for _, c := range [][2]uint64{{1, 0}, {17, 42}, {1<<64 - 1, 1<<64 - 1}} {
		id := MessageID(c[0], c[1])
		p, o, err := ParseMessageID(id)
		if err != nil || p != c[0] || o != c[1] {
			t.Fatalf("%v -> %s -> %d %d %v", c, id, p, o, err)
		}
	}
	for _, bad := range []string{"", "zz", "00000000-0000-0001-0000-00000000000g", "000000000000-0001-0000-0000000000000"} {
		if _, _, err := ParseMessageID(bad); err == nil {
			t.Fatalf("ParseMessageID(%q) accepted", bad)
		}
	}
}

func FuzzDecodeEntry(f *testing.F) {
	for _, cmds := range randomCommands(9, 20) {
		b, err := EncodeEntry(&Entry{Time: 1, Cmds: cmds})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 1, 255})
	f.Fuzz(func(t *testing.T, b []byte) {
		en, err := DecodeEntry(b)
		if err != nil {
			return
		}
		if _, err := EncodeEntry(en); err != nil {
			t.Fatalf("decoded entry does not re-encode: %v", err)
		}
	})
}

func FuzzDecodeCursor(f *testing.F) {
	c := &cursorRec{Epoch: 1, Cursor: 5, Ex: []exception{{Off: 6, Flags: exDone}, {Off: 9, Attempt: 2}}, LeaseExpires: 10, LeaseOffs: []uint64{5, 7}}
	f.Add(c.encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		if c, err := decodeCursor(b); err == nil {
			c.normalize()
			_ = c.encode()
		}
	})
}

func FuzzDecodeTxn(f *testing.F) {
	v := uint64(3)
	off := uint64(1)
	f.Add(encodeTxn(&Txn{Tenant: "t", RequiredLeases: []string{"l"}, Ops: []TxnOp{
		{Type: OpPush, Items: []PushItem{{Queue: "q", Partition: "p", TxID: "x", Payload: []byte(`1`)}}},
		{Type: OpAck, Ack: AckItem{PartitionID: 1, Offset: &off, Status: AckCompleted}},
		{Type: OpKVPut, Key: "k", Value: []byte(`{}`), IfVersion: &v, TTLMs: 5},
		{Type: OpKVDelete, Key: "k"},
	}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := decodeTxn(b)
		if err != nil {
			return
		}
		again, err := decodeTxn(encodeTxn(c))
		if err != nil || len(again.Ops) != len(c.Ops) {
			t.Fatalf("transaction does not round-trip: %v", err)
		}
	})
}

func FuzzDecodeKV(f *testing.F) {
	f.Add((&kvRec{Version: 7, ExpiresAt: 9, Value: []byte(`"v"`)}).encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, ok := decodeKV(b); ok {
			if r2, ok := decodeKV(r.encode()); !ok || r2.Version != r.Version || !bytes.Equal(r2.Value, r.Value) {
				t.Fatal("kv record does not round-trip")
			}
		}
	})
}

// TestCachesChangeOnlySpeed drives two stores with the same commands, built
// from the first store's pop results the way a client would (acks name
// messages by transaction id). The second store drops its record caches,
// in-memory ready index and cursor memories before every entry. Every
// result and the final state must be the same.
func TestCachesChangeOnlySpeed(t *testing.T) {
	a, b := newHarness(t), newHarness(t)
	rng := rand.New(rand.NewSource(7))
	step := func(cmds ...Command) []any {
		t.Helper()
		b.s.cache = newRecordCache()
		ra, rb := a.apply(cmds...), b.apply(cmds...)
		ja, _ := json.Marshal(ra)
		jb, _ := json.Marshal(rb)
		if !bytes.Equal(ja, jb) {
			t.Fatalf("results differ:\n cached:   %s\n uncached: %s", ja, jb)
		}
		return ra
	}
	acked := 0
	for i := 0; i < 300; i++ {
		p := &Push{Tenant: "default"}
		for j := 0; j < 1+rng.Intn(8); j++ {
			tx := uuid.NewString()
			if rng.Intn(6) == 0 {
				tx = fmt.Sprintf("dup-%d", rng.Intn(10))
			}
			p.Items = append(p.Items, PushItem{Queue: "q", Partition: fmt.Sprintf("p%d", rng.Intn(6)), TxID: tx, Payload: []byte(`1`)})
		}
		step(p)
		group := []string{"", "g1", "g2"}[rng.Intn(3)]
		pr := step(&Pop{Tenant: "default", Queue: "q", Group: group, SubMode: "all", Batch: 1 + rng.Intn(10), Partitions: 1 + rng.Intn(3), LeaseSeconds: 30, LeaseID: uuid.NewString()})[0].(*PopResult)
		var items []AckItem
		for _, m := range pr.Messages {
			if rng.Intn(4) == 0 {
				continue // left to lease expiry
			}
			st := []string{AckCompleted, AckCompleted, AckFailed, AckRetry}[rng.Intn(4)]
			items = append(items, AckItem{PartitionID: m.PartitionID, TxID: m.TxID, Status: st, Group: group, LeaseID: pr.LeaseID})
		}
		rng.Shuffle(len(items), func(i, j int) { items[i], items[j] = items[j], items[i] })
		if len(items) > 0 {
			ar := step(&Ack{Tenant: "default", Items: items})[0].(*AckResult)
			for _, r := range ar.Items {
				if r.Success {
					acked++
				}
			}
		}
		if i%50 == 49 {
			a.now += 31_000_000 // leases expire
			b.now = a.now
			step(&Tick{})
		}
	}
	if acked < 100 {
		t.Fatalf("only %d acks by transaction id succeeded: the test exercises too little", acked)
	}
	if ca, cb := checksum(t, a.s), checksum(t, b.s); ca != cb {
		t.Fatalf("state differs: cached %x, uncached %x", ca, cb)
	}
}

// TestLeaderClockBehind: leadership moves to a node whose clock is 30 s
// behind. State time never runs backwards (it is the larger of the entry's
// time and the last applied time), so a lease granted under the old leader
// neither expires early nor restarts; it expires once the new leader's
// clock passes the grant time plus the lease. Messages stamped meanwhile
// keep non-decreasing creation times.
func TestLeaderClockBehind(t *testing.T) {
	h := newHarness(t)
	h.push("q", "p", `1`, `2`)
	h.now += 1e6
	granted := h.now
	r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 1, Partitions: 1, LeaseSeconds: 5})
	if len(r.Messages) != 1 {
		t.Fatalf("first pop got %d messages", len(r.Messages))
	}
	// The new leader's clock is 30 s behind.
	h.now -= 30e6
	h.apply(&Tick{})
	if r2 := h.pop(Pop{Queue: "q", Group: "g", Batch: 1, Partitions: 1}); len(r2.Messages) != 0 {
		t.Fatalf("partition delivered %v while its lease holds", offsets(r2))
	}
	h.push("q", "p", `3`)
	// Its clock moves on: 4 s after the grant in state time, still leased.
	h.now = granted + 4e6
	h.apply(&Tick{})
	if r3 := h.pop(Pop{Queue: "q", Group: "g", Batch: 1, Partitions: 1}); len(r3.Messages) != 0 {
		t.Fatalf("lease of 5 s expired after 4 s: delivered %v", offsets(r3))
	}
	// 6 s after the grant: expired, the message comes back.
	h.now = granted + 6e6
	h.apply(&Tick{})
	r4 := h.pop(Pop{Queue: "q", Group: "g", Batch: 3, Partitions: 1, LeaseSeconds: 5})
	if got := offsets(r4); fmt.Sprint(got) != "[0 1 2]" {
		t.Fatalf("after expiry offsets = %v, want [0 1 2]", got)
	}
	if r4.Messages[0].Attempt != 2 {
		t.Fatalf("redelivered message attempt = %d, want 2", r4.Messages[0].Attempt)
	}
	for i := 1; i < len(r4.Messages); i++ {
		if r4.Messages[i].CreatedAt < r4.Messages[i-1].CreatedAt {
			t.Fatalf("creation times run backwards: %d after %d", r4.Messages[i].CreatedAt, r4.Messages[i-1].CreatedAt)
		}
	}
	if c := r4.Messages[2].CreatedAt; c < granted {
		t.Fatalf("message pushed under the slow clock is stamped %d, before the last applied time %d", c, granted)
	}
}

// TestPartitionTailFromMessages: pushes after a partition's first message
// change only its tail (next offset, newest time and index), which the
// stored record need not hold. Readers, a reopened store and the offsets
// of later pushes must still see the true tail.
func TestPartitionTailFromMessages(t *testing.T) {
	h := newHarness(t)
	h.push("q", "p", `0`)
	for i := 1; i < 5; i++ {
		h.now += 1e6
		h.push("q", "p", fmt.Sprint(i))
	}
	h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 2, Partitions: 1, LeaseSeconds: 30})
	check := func(when string) {
		t.Helper()
		r := h.s.Reader()
		defer r.Close()
		parts, ok := r.Partitions("default", "q", 0, 10, h.now)
		if !ok || len(parts) != 1 {
			t.Fatalf("%s: partitions %+v", when, parts)
		}
		p := parts[0]
		if p.Next != 5 || p.LastTime != h.now {
			t.Fatalf("%s: next %d, last time %d; want 5 and %d", when, p.Next, p.LastTime, h.now)
		}
		lag := int64(-1)
		for _, g := range p.Groups {
			if g.Group == "g" {
				lag = g.Lag
			}
		}
		if lag != 5 {
			t.Fatalf("%s: group positions %+v, want a lag of 5 for g", when, p.Groups)
		}
	}
	check("before reopening")
	h.reopen()
	check("after reopening")
	if r := h.push("q", "p", `5`); r.Items[0].Offset != 5 {
		t.Fatalf("push after reopening got offset %d, want 5", r.Items[0].Offset)
	}
}
