package cluster

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// Dropped segments: raft-wal deletes the segments a compaction of the log
// drops while it holds its write lock, so no append is written meanwhile,
// and its delete unlinks each file and syncs the directory: under a heavy
// push, longer than a snapshot's checkpoint (docs/design/durability.md,
// "Taking a snapshot"). On the OS's file system a dropped
// segment is therefore renamed out of raft-wal's names instead (raft-wal
// lists only names ending in .wal) and unlinked on a goroutine of its own.
//
// Nothing needs the rename to be durable: raft-wal committed the metadata
// that no longer lists the segment before it deletes it, and at open it
// deletes a segment file its metadata does not list. A file renamed but
// not unlinked when the process stopped is removed at the next open
// (removeDropped).
const droppedSuffix = ".dropped"

// segmentTrash unlinks dropped segments in the background.
type segmentTrash struct {
	log *slog.Logger
	wg  sync.WaitGroup
}

// drop takes the segment name in dir out of the log at once and unlinks it
// later.
func (t *segmentTrash) drop(dir, name string) error {
	path := filepath.Join(dir, name)
	gone := path + droppedSuffix
	if err := os.Rename(path, gone); err != nil {
		return err
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		if err := os.Remove(gone); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.log.Warn("removing a dropped raft log segment failed; the next start removes it", "file", gone, "err", err)
		}
	}()
	return nil
}

// close waits for the unlinks under way.
func (t *segmentTrash) close() { t.wg.Wait() }

// removeDropped removes the segments a previous run dropped and did not
// unlink.
func removeDropped(dir string, log *slog.Logger) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return // a new directory; raft-wal's open reports real errors
	}
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), droppedSuffix) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			log.Warn("removing a dropped raft log segment failed", "file", e.Name(), "err", err)
		}
	}
}
