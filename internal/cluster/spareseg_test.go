package cluster

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Under always on the OS's file system, segments after the first two are
// made from spares written ahead with zeros, and the log reads back every
// entry across those rotations, after a restart too; the restart keeps the
// spare the last run left. Interval mode and a log that never rotates
// write no spare.
func TestAlwaysSegmentsFromSpares(t *testing.T) {
	if !overlapSafe {
		t.Skip("spares are kept only where the sync rounds overlap (Linux)")
	}
	dir := t.TempDir()
	const segSize = 64 << 10
	data := func(i uint64) []byte { return bytes.Repeat([]byte(fmt.Sprintf("entry %d;", i)), 40) }
	s := newLogSyncer(FsyncAlways, 10*time.Second, quietLogger())
	wal, err := s.openWAL(dir, segSize)
	if err != nil {
		t.Fatal(err)
	}
	log := &syncedLog{WAL: wal, s: s}
	const entries = 600 // about 240 KiB: several rotations
	for i := uint64(1); i <= entries; i++ {
		own := i%2 == 0
		if err := log.storeLogs([]*walRecord{{Index: i, Term: 1, Type: walCommand, Data: data(i)}}, own); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		if i%50 == 0 {
			// Let the spare of the next rotation be written.
			if err := checkFor(5*time.Second, func() error {
				s.spare.mu.Lock()
				defer s.spare.mu.Unlock()
				if s.spare.writing {
					return fmt.Errorf("a spare is being written")
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	used := s.spare.used.Load()
	if used == 0 {
		t.Fatalf("no segment was made from a spare in %d rotations", s.spare.creates-1)
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	if err := wal.Close(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, spareName)); err != nil || fi.Size() != segSize {
		t.Fatalf("no whole spare left beside the log: %v", err)
	}

	s2 := newLogSyncer(FsyncAlways, 10*time.Second, quietLogger())
	wal2, err := s2.openWAL(dir, segSize)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		s2.close()
		wal2.Close()
	}()
	if !s2.spare.ready {
		t.Fatal("the spare the last run left was not kept")
	}
	for i := uint64(1); i <= entries; i++ {
		var l walRecord
		if err := wal2.GetLog(i, &l); err != nil || !bytes.Equal(l.Data, data(i)) {
			t.Fatalf("entry %d after the restart: %v (%d bytes)", i, err, len(l.Data))
		}
	}
	t.Logf("%d of %d segments created were made from spares", used, s.spare.creates)

	// Interval mode keeps no spare; an always log that never rotates
	// writes none.
	for _, mode := range []FsyncMode{FsyncInterval, FsyncAlways} {
		d := t.TempDir()
		s3 := newLogSyncer(mode, 10*time.Second, quietLogger())
		w3, err := s3.openWAL(d, segSize)
		if err != nil {
			t.Fatal(err)
		}
		if err := (&syncedLog{WAL: w3, s: s3}).storeLogs([]*walRecord{{Index: 1, Term: 1, Type: walCommand, Data: data(1)}}, false); err != nil {
			t.Fatal(err)
		}
		s3.close()
		w3.Close()
		for _, n := range []string{spareName, spareTmp} {
			if _, err := os.Stat(filepath.Join(d, n)); err == nil {
				t.Errorf("%s: %s written for a log that did not rotate", mode, n)
			}
		}
	}
}
