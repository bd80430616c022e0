package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/queen-mq/queen/internal/failpoint"
)

// Installing a snapshot replaces the state directory. The steps, each
// durable before the next (docs/design/durability.md):
//
//  1. raft has the snapshot in snapshots/<id> (snapSink: files, meta.json
//     and both directories fsynced, then renamed into place);
//  2. fsm.Restore links or copies its files into state.restore, fsynced;
//  3. the store closes; state is renamed to state.old, state.restore to
//     state, state.old removed, the data directory fsynced after each;
//  4. the store opens the new state.
//
// A crash anywhere leaves either the old state or the new one in place
// (recoverInstall rolls an unfinished swap back); the old one is behind
// the snapshot, which catchUp finds before raft starts and installs again.

const (
	stateDirName   = "state"
	restoreDirName = "state.restore"
	oldSuffix      = ".old"
)

// Failpoints of the install (internal/failpoint), in order.
const (
	fpInstallStart    = "install-start"     // the snapshot is in place, nothing else done
	fpInstallUnpacked = "install-unpacked"  // state.restore complete
	fpInstallOldMoved = "install-old-moved" // state moved to state.old; no state
	fpInstallSwapped  = "install-swapped"   // the new state in place, state.old still there
	fpInstallOpened   = "install-opened"    // the new store open
)

// recoverInstall puts the data directory back in order after a crash in
// the middle of an install, before the store opens: a missing state
// directory gets state.old back (the roll back), and leftovers go.
func recoverInstall(dataDir string, log *slog.Logger) error {
	state := filepath.Join(dataDir, stateDirName)
	old := state + oldSuffix
	restore := filepath.Join(dataDir, restoreDirName)
	_, err := os.Stat(state)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if _, oerr := os.Stat(old); oerr == nil {
			log.Warn("a snapshot install was interrupted before the new state was in place; putting the previous state back (it is brought up to date from the snapshot next)", "dir", state)
			if err := os.Rename(old, state); err != nil {
				return fmt.Errorf("roll back an interrupted snapshot install (rename %s to %s): %w", old, state, err)
			}
		}
	case err != nil:
		return fmt.Errorf("inspect state directory %s: %w", state, err)
	}
	for _, dir := range []string{old, restore} {
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("remove what an interrupted snapshot install left (%s): %w", dir, err)
		}
	}
	if err := syncDir(dataDir); err != nil {
		return fmt.Errorf("sync data directory %s: %w", dataDir, err)
	}
	return nil
}

// swapState moves the state directory made by a restore (from) into place
// (to), durably: see the steps above.
func swapState(from, to string) error {
	parent := filepath.Dir(to)
	old := to + oldSuffix
	if err := os.RemoveAll(old); err != nil {
		return err
	}
	if err := os.Rename(to, old); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := syncDir(parent); err != nil {
		return err
	}
	failpoint.Hit(fpInstallOldMoved)
	if err := os.Rename(from, to); err != nil {
		return err
	}
	if err := syncDir(parent); err != nil {
		return err
	}
	failpoint.Hit(fpInstallSwapped)
	if err := os.RemoveAll(old); err != nil {
		return err
	}
	return syncDir(parent)
}

// catchUp installs the newest snapshot when the store is behind it, before
// raft starts. raft starts from its newest snapshot without restoring it
// (the store keeps its state across restarts; the log starts after it),
// so a store behind the snapshot (an install cut short, a state directory
// lost) would otherwise get the entries after the snapshot applied onto
// an older state, and diverge in silence.
func (f *fsm) catchUp() error {
	metas, err := f.snaps.list()
	if err != nil {
		return err
	}
	if len(metas) == 0 {
		return nil
	}
	m := metas[0]
	covers := m.Index // raft's index; the state's own is at or below it
	if m.Applied != nil {
		covers = *m.Applied
	}
	applied := f.store.AppliedIndex()
	if applied >= covers {
		return nil
	}
	f.log.Warn("the state store is behind the newest snapshot (an interrupted install, or a lost state directory); installing the snapshot before joining the cluster",
		"applied", applied, "snapshot", m.ID, "snapshot_index", m.Index, "covers", covers)
	_, rc, err := f.snaps.Open(m.ID)
	if err != nil {
		return fmt.Errorf("open snapshot %s to bring the store up to date: %w", m.ID, err)
	}
	if err := f.Restore(rc); err != nil {
		return fmt.Errorf("install snapshot %s to bring the store up to date: %w", m.ID, err)
	}
	if got := f.store.AppliedIndex(); got < covers {
		return fmt.Errorf("after installing snapshot %s the store is at %d, below the %d the snapshot covers: the snapshot is damaged; move the data directory away and restart the node to copy the state from the leader", m.ID, got, covers)
	}
	return nil
}
