package cluster

import (
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// walFiles lists the segment files in dir and the dropped ones.
func walFiles(t *testing.T, dir string) (segments, dropped []string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		switch {
		case strings.HasSuffix(e.Name(), ".wal"):
			segments = append(segments, e.Name())
		case strings.HasSuffix(e.Name(), droppedSuffix):
			dropped = append(dropped, e.Name())
		}
	}
	return segments, dropped
}

// The segments a compaction drops leave raft-wal's names at once and are
// unlinked beside it; the log reads on from its new start, a file a
// crashed run left renamed is removed at the next open, and nothing
// dropped is left once the log is closed.
func TestDroppedSegmentsUnlinkedBeside(t *testing.T) {
	for _, mode := range []FsyncMode{FsyncAlways, FsyncInterval} {
		t.Run(string(mode), func(t *testing.T) {
			seed := time.Now().UnixNano()
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewSource(seed))
			dir := t.TempDir()
			// A file a previous run renamed and did not unlink.
			left := filepath.Join(dir, "00000000000000000001-0000000000000001.wal"+droppedSuffix)
			if err := os.WriteFile(left, []byte("old"), 0o644); err != nil {
				t.Fatal(err)
			}
			s := newLogSyncer(mode, time.Hour, quietLogger())
			wal, err := s.openWAL(dir, 64<<10)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(left); !os.IsNotExist(err) {
				t.Fatalf("a dropped segment left by an earlier run is still there after open (%v)", err)
			}
			log := &syncedLog{WAL: wal, s: s}
			if err := log.StoreLogs([]*walRecord{durableEntry(1)}); err != nil {
				t.Fatal(err)
			}
			const last = 40
			for i := uint64(2); i <= last; i++ {
				if err := log.StoreLogs([]*walRecord{bigEntry(rng, i, 16<<10)}); err != nil {
					t.Fatal(err)
				}
			}
			before, _ := walFiles(t, dir)
			if len(before) < 4 {
				t.Fatalf("%d segments after %d entries of 16 KiB in 64 KiB segments; want several", len(before), last)
			}
			if err := wal.DeleteRange(1, 30); err != nil {
				t.Fatal(err)
			}
			after, _ := walFiles(t, dir)
			if len(after) >= len(before) {
				t.Fatalf("%d segments after dropping entries 1-30, %d before: none left raft-wal's names", len(after), len(before))
			}
			if first, _ := wal.FirstIndex(); first != 31 {
				t.Fatalf("first index %d after dropping 1-30; want 31", first)
			}
			var l walRecord
			for i := uint64(31); i <= last; i++ {
				if err := wal.GetLog(i, &l); err != nil || l.Index != i {
					t.Fatalf("read %d after the drop: index %d, %v", i, l.Index, err)
				}
			}
			if err := s.close(); err != nil {
				t.Fatal(err)
			}
			wal.Close()
			if _, dropped := walFiles(t, dir); len(dropped) != 0 {
				t.Fatalf("dropped segments left after close: %v", dropped)
			}
			s2 := newLogSyncer(mode, time.Hour, quietLogger())
			wal2, err := s2.openWAL(dir, 64<<10)
			if err != nil {
				t.Fatalf("reopen: %v", err)
			}
			defer wal2.Close()
			defer s2.close()
			if first, _ := wal2.FirstIndex(); first != 31 {
				t.Fatalf("first index %d after reopening; want 31", first)
			}
			if lastIdx, _ := wal2.LastIndex(); lastIdx != last {
				t.Fatalf("last index %d after reopening; want %d", lastIdx, last)
			}
			t.Logf("%d segments, %d after the drop", len(before), len(after))
		})
	}
}
