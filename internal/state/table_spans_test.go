package state

import (
	"fmt"
	"strings"
	"testing"
)

// Every table Pebble writes holds keys of one table of the key space (or
// only of the first four, which share a span), in flushes and compactions
// alike: new partitions' keys of several tables, flushed many times over,
// leave no file that straddles two of them.
func TestTablesEndAtTableBoundaries(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{MemTableBytes: 512 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h := &harness{t: t, dir: dir, s: s, now: 1_700_000_000_000_000}
	n := 0
	for i := 0; i < 30; i++ {
		items := make([]PushItem, 1000)
		for j := range items {
			items[j] = PushItem{Queue: "q", Partition: fmt.Sprint("k", n), Payload: []byte(`{"id":1,"name":"a row of a table"}`)}
			n++
		}
		if r := h.apply(&Push{Tenant: "default", Items: items})[0].(*PushResult); r.Err != nil {
			t.Fatalf("push %d: %v", i, r.Err)
		}
		h.now += 1000
	}
	s.waitCommitted()
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Compact(t.Context(), []byte{0}, []byte{0xff}, true); err != nil {
		t.Fatal(err)
	}
	levels, err := s.db.SSTables()
	if err != nil {
		t.Fatal(err)
	}
	span := func(k []byte) byte { return max(k[0], tPartName-1) }
	files, tables := 0, map[byte]bool{}
	for level, fs := range levels {
		for _, f := range fs {
			files++
			lo, hi := f.Smallest.UserKey, f.Largest.UserKey
			tables[lo[0]] = true
			if span(lo) != span(hi) {
				t.Errorf("level %d table %v holds keys %x to %x, of two tables", level, f.FileNum, lo, hi)
			}
		}
	}
	// The pushes wrote keys of at least these tables; the test means
	// nothing if they all fit one table.
	for _, tb := range []byte{tPartName, tPart, tMsg, tReady} {
		if !tables[tb] {
			t.Errorf("no table begins in table %#x; tables begin in %v", tb, tables)
		}
	}
	t.Logf("%d partitions created, %d tables in %d levels", n, files, len(levels))
}

// Only payloads leave for blob files: a pop's lease record over many
// partitions is larger than blobMinSize and stays in its table, and a
// payload of that size still goes to a blob file.
func TestOnlyPayloadsLeaveForBlobFiles(t *testing.T) {
	h := newHarness(t)
	const parts = 300
	for i := 0; i < parts; i++ {
		h.push("q", fmt.Sprint("p", i), `{"k":1}`)
	}
	r := h.pop(Pop{Queue: "q", Batch: parts, Partitions: parts, LeaseSeconds: 60})
	if len(r.Messages) != parts {
		t.Fatalf("popped %d messages; want one from each of %d partitions", len(r.Messages), parts)
	}
	flushed := func() uint64 {
		t.Helper()
		h.s.waitCommitted()
		if err := h.s.db.Flush(); err != nil {
			t.Fatal(err)
		}
		return h.s.WriteStats().FlushedBlobBytes
	}
	if b := flushed(); b != 0 {
		t.Fatalf("%d bytes flushed into blob files with no payload of %d bytes or more", b, blobMinSize)
	}
	big := fmt.Sprintf(`{"pad":%q}`, strings.Repeat("x", blobMinSize))
	h.push("q", "big", big)
	if b := flushed(); b == 0 {
		t.Fatalf("nothing flushed into blob files after a payload of %d bytes", len(big))
	}
}
