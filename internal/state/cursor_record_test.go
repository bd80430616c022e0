package state

import (
	"fmt"
	"math"
	"math/rand"
	"reflect"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/uuid"
)

// appendCursorV1 is the version 1 encoding as builds before version 2 wrote
// it: one entry per exception and per leased offset.
func appendCursorV1(c *cursorRec) []byte { return appendCursorV1To(nil, c) }

// appendCursorV1To appends the version 1 encoding of c to b.
func appendCursorV1To(b []byte, c *cursorRec) []byte {
	e := enc{b: b}
	e.u8(1)
	e.u64(c.Epoch)
	e.u64(c.Cursor)
	e.bool(c.Ready)
	e.uv(uint64(len(c.Ex)))
	for _, x := range c.Ex {
		e.uv(x.Off)
		e.u8(x.Flags)
		e.uv(uint64(x.Attempt))
		e.uv(uint64(x.Retries))
		e.uv(uint64(x.VisibleAt))
	}
	e.i64(c.LeaseExpires)
	if c.LeaseExpires != 0 {
		e.b = append(e.b, c.LeaseID[:]...)
		e.uv(uint64(len(c.LeaseOffs)))
		prev := uint64(0)
		for _, o := range c.LeaseOffs {
			e.uv(o - prev)
			prev = o
		}
	}
	return e.b
}

// cursorFields is what a cursor record stores, empty slices as nil.
func cursorFields(c *cursorRec) cursorRec {
	f := cursorRec{Epoch: c.Epoch, Cursor: c.Cursor, Ready: c.Ready, LeaseID: c.LeaseID, LeaseExpires: c.LeaseExpires}
	if len(c.Ex) > 0 {
		f.Ex = c.Ex
	}
	if len(c.LeaseOffs) > 0 {
		f.LeaseOffs = c.LeaseOffs
	}
	return f
}

// randomCursor makes a cursor of the shapes pops and acks leave: runs of
// consecutive deliveries with the same state, broken by acks, retries,
// dead letters and gaps, and sometimes arbitrary values.
func randomCursor(rng *rand.Rand) *cursorRec {
	big := func() uint64 {
		switch rng.Intn(4) {
		case 0:
			return 0
		case 1:
			return math.MaxUint64 - uint64(rng.Intn(3))
		default:
			return rng.Uint64() >> uint(rng.Intn(64))
		}
	}
	c := &cursorRec{Epoch: big(), Cursor: big(), Ready: rng.Intn(2) == 0}
	off := c.Cursor - uint64(rng.Intn(5))
	if off > c.Cursor {
		off = 0
	}
	for i, n := 0, rng.Intn(40); i < n; i++ {
		x := exception{Flags: uint8(rng.Intn(4)), Attempt: uint32(rng.Intn(3)), Retries: uint32(rng.Intn(2))}
		switch rng.Intn(6) {
		case 0:
			x.VisibleAt = int64(big())
		case 1:
			x.Attempt, x.Retries = uint32(big()), uint32(big())
		}
		for j, l := 0, 1+rng.Intn(30); j < l && off < math.MaxUint64; j++ {
			x.Off = off
			c.Ex = append(c.Ex, x)
			off++
			if rng.Intn(10) == 0 {
				x.Attempt++ // a state change inside a run
			}
		}
		if off >= math.MaxUint64-100 {
			break
		}
		off += uint64(rng.Intn(3)) // often no gap
	}
	if rng.Intn(3) > 0 {
		c.LeaseExpires = int64(big())
		if c.LeaseExpires == 0 {
			c.LeaseExpires = -1
		}
		copy(c.LeaseID[:], uuid.New().String())
		for _, x := range c.Ex {
			if rng.Intn(5) > 0 {
				c.LeaseOffs = append(c.LeaseOffs, x.Off)
			}
		}
	}
	return c
}

// TestCursorRecordV2: cursors of every shape read back field for field,
// stamp included, from version 3 and from versions 2 and 1 as older builds
// wrote them (stamp 0); cut or padded version 3 records and runs longer than the bound are refused; a pop's
// cursor of 500 deliveries is a few dozen bytes.
func TestCursorRecordV2(t *testing.T) {
	seed := rand.Int63()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	for i := 0; i < 1500; i++ {
		c := randomCursor(rng)
		if rng.Intn(2) == 0 {
			c.Stamp = uint64(rng.Int63n(1 << uint(1+rng.Intn(62))))
		}
		b := c.encode()
		if b[0] != 3 {
			t.Fatalf("cursor written as version %d, want 3", b[0])
		}
		d, err := decodeCursor(b)
		if err != nil || !reflect.DeepEqual(cursorFields(d), cursorFields(c)) || d.Stamp != c.Stamp {
			t.Fatalf("cursor %+v (stamp %d) does not round-trip: %+v, %v", cursorFields(c), c.Stamp, d, err)
		}
		d, err = decodeCursor(appendCursorV1(c))
		if err != nil || !reflect.DeepEqual(cursorFields(d), cursorFields(c)) || d.Stamp != 0 {
			t.Fatalf("version 1 of %+v reads as %+v, %v", cursorFields(c), d, err)
		}
		d, err = decodeCursor(appendCursorV2(c))
		if err != nil || !reflect.DeepEqual(cursorFields(d), cursorFields(c)) || d.Stamp != 0 {
			t.Fatalf("version 2 of %+v reads as %+v, %v", cursorFields(c), d, err)
		}
		for n := 1; n < len(b); n += 1 + rng.Intn(8) {
			if _, err := decodeCursor(b[:n]); err == nil {
				t.Fatalf("a version 3 record cut to %d of %d bytes decoded", n, len(b))
			}
		}
		if _, err := decodeCursor(append(b, 0)); err == nil {
			t.Fatal("a version 3 record with a byte after it decoded")
		}
	}

	pop := &cursorRec{Epoch: 1, Cursor: 1_000_000, LeaseExpires: 1_800_000_000_000_000, LeaseID: [16]byte{1}}
	for o := uint64(1_000_000); o < 1_000_500; o++ {
		pop.Ex = append(pop.Ex, exception{Off: o, Attempt: 1})
		pop.LeaseOffs = append(pop.LeaseOffs, o)
	}
	if n, old := len(pop.encode()), len(appendCursorV1(pop)); n > 64 || old < 3000 {
		t.Fatalf("a pop of 500's cursor is %d bytes (version 1: %d), want at most 64", n, old)
	}
	// A pop's run split by an ack in the middle, a retry and a dead letter:
	// five runs.
	split := *pop
	split.Ex = slices.Clone(pop.Ex)
	split.Ex[100].Flags = exDone
	split.Ex[200].Retries = 1
	if d, _ := decodeCursor(split.encode()); d == nil || !reflect.DeepEqual(d.Ex, split.Ex) {
		t.Fatal("a split run does not round-trip")
	}

	// Runs adding up to more than maxCursorEntries: refused before any
	// allocation of their size.
	e := enc{}
	e.u8(2)
	e.uv(1)
	e.uv(0)
	e.bool(false)
	e.uv(2)
	for i := 0; i < 2; i++ {
		e.b = append(e.b, 0) // start: varint 0
		e.uv(maxCursorEntries / 2)
		e.u8(0)
		e.uv(1)
		e.uv(0)
		e.uv(0)
	}
	e.b = append(e.b, 0) // no lease
	if _, err := decodeCursor(e.b); err == nil {
		t.Fatal("a cursor of more than maxCursorEntries exceptions decoded")
	}
}

// rewriteCursorsV1 rewrites the store as a build before version 2 left
// it: every cursor record as version 1, naming its lease, and every lease
// record without overlays (rewriteAsOldStore).
func rewriteCursorsV1(t *testing.T, h *harness) int {
	return rewriteAsOldStore(t, h, appendCursorV1)
}

// TestCursorV1ReadAfterReopen: a store whose cursors are version 1 records
// (written by an older build) opens, and pops and acks carry on from them:
// the lease's deliveries ack, the others come again with their attempts.
func TestCursorV1ReadAfterReopen(t *testing.T) {
	h := newHarness(t)
	for i := 0; i < 10; i++ {
		h.push("q", "p", fmt.Sprintf(`%d`, i))
	}
	lease := uuid.NewString()
	r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 6, Partitions: 1, LeaseSeconds: 60, LeaseID: lease})
	if len(r.Messages) != 6 {
		t.Fatalf("popped %d, want 6", len(r.Messages))
	}
	pid := r.Messages[0].PartitionID
	ack := func(off uint64, status string) AckItemResult {
		o := off
		return h.ack(AckItem{PartitionID: pid, Offset: &o, TxIDKnown: true, Status: status, Group: "g", LeaseID: lease}).Items[0]
	}
	if res := ack(2, AckCompleted); !res.Success {
		t.Fatalf("ack 2: %+v", res)
	}
	if res := ack(3, AckFailed); !res.Success {
		t.Fatalf("nack 3: %+v", res)
	}
	if n := rewriteCursorsV1(t, h); n == 0 {
		t.Fatal("no cursor record to rewrite")
	}
	h.reopen()
	for _, off := range []uint64{0, 1, 4, 5} {
		if res := ack(off, AckCompleted); !res.Success || res.Error != "" {
			t.Fatalf("ack %d after reopen: %+v", off, res)
		}
	}
	// Offset 3 failed once: it comes again first, attempt 2, one retry;
	// then 6..9, attempt 1; 2 never again.
	r = h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 10, Partitions: 1, LeaseSeconds: 60})
	if got := offsets(r); !slices.Equal(got, []uint64{3, 6, 7, 8, 9}) {
		t.Fatalf("after reopen popped %v, want [3 6 7 8 9]", got)
	}
	if m := r.Messages[0]; m.Attempt != 2 || m.Retries != 1 {
		t.Fatalf("offset 3: attempt %d retries %d, want 2 and 1", m.Attempt, m.Retries)
	}
	if m := r.Messages[1]; m.Attempt != 1 || m.Retries != 0 {
		t.Fatalf("offset 6: attempt %d retries %d, want 1 and 0", m.Attempt, m.Retries)
	}
}

// storedCursor reads the one stored cursor record of the harness's store.
func storedCursor(t *testing.T, h *harness) []byte {
	t.Helper()
	h.s.waitCommitted()
	it, err := h.s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{tCursor}, UpperBound: []byte{tCursor + 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	if !it.First() {
		t.Fatal("no cursor record")
	}
	v := slices.Clone(it.Value())
	if it.Next() {
		t.Fatal("more than one cursor record")
	}
	return v
}

// TestCursorRunSplits: a pop's run split by acks in its middle, a nack and
// a dead letter is written as the runs the state holds, reads back after a
// reopen, and once the lease lapses the unfinished offsets come again with
// their own attempts and retries.
func TestCursorRunSplits(t *testing.T) {
	h := newHarness(t)
	for i := 0; i < 20; i++ {
		h.push("q", "p", fmt.Sprintf(`%d`, i))
	}
	lease := uuid.NewString()
	r := h.pop(Pop{Queue: "q", Group: "g", SubMode: "all", Batch: 20, Partitions: 1, LeaseSeconds: 30, LeaseID: lease})
	if len(r.Messages) != 20 {
		t.Fatalf("popped %d, want 20", len(r.Messages))
	}
	pid := r.Messages[0].PartitionID
	// The pop writes no cursor: its lease record carries the 20 offsets as
	// one run of attempt 1.
	if n := cursorRecords(t, h); n != 0 {
		t.Fatalf("the pop wrote %d cursor records, want none", n)
	}
	if hs := leaseHolders(t, h, lease); len(hs) != 1 || hs[0].ov == nil || !slices.Equal(hs[0].ov.runs, []attRun{{off: 0, n: 20, attempt: 1}}) {
		t.Fatalf("the pop's lease record: %+v", hs)
	}
	ack := func(off uint64, status string) AckItemResult {
		o := off
		return h.ack(AckItem{PartitionID: pid, Offset: &o, TxIDKnown: true, Status: status, Group: "g", LeaseID: lease}).Items[0]
	}
	for off := uint64(5); off < 10; off++ {
		if res := ack(off, AckCompleted); !res.Success {
			t.Fatalf("ack %d: %+v", off, res)
		}
	}
	if res := ack(12, AckFailed); !res.Success {
		t.Fatalf("nack 12: %+v", res)
	}
	if res := ack(15, AckDLQ); !res.Success || !res.DLQ {
		t.Fatalf("dlq 15: %+v", res)
	}
	// Runs: 0-4 delivered, 5-9 done, 10-11 delivered, 12 failed once,
	// 13-14 delivered, 15 done, 16-19 delivered; the lease's offsets
	// 0-4, 10-11, 13-14, 16-19 (an ack of any status ends its offset's
	// part in the lease).
	v := storedCursor(t, h)
	if v[0] != 3 {
		t.Fatalf("cursor record version %d, want 3", v[0])
	}
	d := dec{b: v[1:]}
	d.uv()
	d.uv()
	d.bool()
	if n := d.uv(); n != 7 {
		t.Fatalf("%d runs of exceptions, want 7", n)
	}
	h.reopen()
	c, _ := decodeCursor(storedCursor(t, h))
	if want := []uint64{0, 1, 2, 3, 4, 10, 11, 13, 14, 16, 17, 18, 19}; !slices.Equal(c.LeaseOffs, want) {
		t.Fatalf("lease offsets %v, want %v", c.LeaseOffs, want)
	}
	// The lease lapses: everything unfinished comes again, attempt 2, and
	// 12 with its failure; the done ones never.
	h.now += 31e6
	h.apply(&Tick{})
	r = h.pop(Pop{Queue: "q", Group: "g", Batch: 20, Partitions: 1, LeaseSeconds: 30})
	if got, want := offsets(r), []uint64{0, 1, 2, 3, 4, 10, 11, 12, 13, 14, 16, 17, 18, 19}; !slices.Equal(got, want) {
		t.Fatalf("after the lapse popped %v, want %v", got, want)
	}
	for _, m := range r.Messages {
		retries := uint32(0)
		if m.Offset == 12 {
			retries = 1
		}
		if m.Attempt != 2 || m.Retries != retries {
			t.Fatalf("offset %d: attempt %d retries %d, want 2 and %d", m.Offset, m.Attempt, m.Retries, retries)
		}
	}
}
