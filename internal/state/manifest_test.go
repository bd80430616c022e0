package state

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// manifestName is the name of the store's current MANIFEST.
func manifestName(t *testing.T, dir string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "MANIFEST-*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no MANIFEST in %s: %v", dir, err)
	}
	return slices.Max(files)
}

// manifestSize is the size of the store's current MANIFEST and how many
// MANIFEST files its directory holds.
func manifestSize(t *testing.T, dir string) (int64, int) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "MANIFEST-*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no MANIFEST in %s: %v", dir, err)
	}
	var newest string
	for _, f := range files {
		if f > newest {
			newest = f
		}
	}
	fi, err := os.Stat(newest)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size(), len(files)
}

// Pebble's MANIFEST grows by an edit at every flush and compaction, and a
// snapshot's checkpoint copies the whole file: the store has Pebble start
// a new one past a bound (maxManifestBytes; a small one here), so the file
// stays near it however long the store runs, and the state reopens whole.
//
// A new MANIFEST starts with a listing of every live table, and Pebble
// starts the next one only once the edits since name more tables than that
// listing (so that listings are not rewritten at every edit). So the file
// stays under about the bound plus twice the largest listing; without a
// new start it would hold every edit of the run.
func TestManifestStaysNearItsBound(t *testing.T) {
	const bound = 8 << 10
	dir := t.TempDir()
	s, err := Open(dir, Options{manifestBytes: bound})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, dir: dir, s: s, now: 1_700_000_000_000_000}
	// Each flush writes a few small tables (one per table of the key space
	// it holds): 400 flushes write some 130 KB of edits.
	const flushes = 400
	largest, listing, starts := int64(0), int64(0), 0
	last := manifestName(t, dir)
	for i := 0; i < flushes; i++ {
		items := make([]PushItem, 10)
		for j := range items {
			items[j] = PushItem{Queue: "q", Partition: fmt.Sprint("p", (i*10+j)%500), TxID: fmt.Sprint("t", i, "-", j), Payload: []byte(`{"k":1}`)}
		}
		if r := h.apply(&Push{Tenant: "default", Items: items})[0].(*PushResult); r.Err != nil {
			t.Fatalf("push %d: %v", i, r.Err)
		}
		h.now += 100
		if err := s.db.Flush(); err != nil {
			t.Fatal(err)
		}
		size, _ := manifestSize(t, dir)
		if name := manifestName(t, dir); name != last {
			// A new MANIFEST: its listing and the flush's edit.
			last, starts = name, starts+1
			listing = max(listing, size)
		}
		largest = max(largest, size)
	}
	size, _ := manifestSize(t, dir)
	if limit := bound + 3*listing; starts == 0 || largest > limit {
		t.Fatalf("the MANIFEST grew to %d bytes over %d flushes (now %d) and started anew %d times; want it started anew under %d (its bound %d, listings of up to %d bytes)", largest, flushes, size, starts, limit, bound, listing)
	}
	sum, err := s.Checksum()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(dir, Options{manifestBytes: bound})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s2.Close()
	sum2, err := s2.Checksum()
	if err != nil {
		t.Fatal(err)
	}
	if sum2 != sum {
		t.Fatalf("state checksum %x after reopening; %x before", sum2, sum)
	}
	rd := s2.Reader()
	defer rd.Close()
	if qi, ok := rd.Queue("default", "q"); !ok || qi.Total != flushes*10 {
		t.Fatalf("queue q %v with %d messages after reopening; want %d", ok, qi.Total, flushes*10)
	}
	t.Logf("largest MANIFEST %d bytes over %d flushes, %d at the end; %d new ones, listings of up to %d bytes", largest, flushes, size, starts, listing)
}
