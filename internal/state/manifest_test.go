package state

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

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
func TestManifestStaysNearItsBound(t *testing.T) {
	const bound = 8 << 10
	dir := t.TempDir()
	s, err := Open(dir, Options{manifestBytes: bound})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, dir: dir, s: s, now: 1_700_000_000_000_000}
	// About 65 bytes of edit per flush: 600 flushes write some 40 KB of
	// edits, five times the bound.
	const flushes = 600
	largest := int64(0)
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
		if size, _ := manifestSize(t, dir); size > largest {
			largest = size
		}
	}
	size, _ := manifestSize(t, dir)
	if largest > 3*bound {
		t.Fatalf("the MANIFEST grew to %d bytes over %d flushes (now %d); want it started anew near %d", largest, flushes, size, bound)
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
	t.Logf("largest MANIFEST %d bytes over %d flushes, %d at the end", largest, flushes, size)
}
