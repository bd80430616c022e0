package cluster

import (
	"errors"
	"fmt"
	"os"
	"time"
)

// Each node snapshots its own state once SnapshotThreshold entries were
// applied since its last snapshot (checked every SnapshotInterval, on the
// apply thread, so the checkpoint is at an exact log index), and then drops
// the log before the snapshot but for TrailingLogs entries. A follower
// that needs entries from before the log's start is sent the snapshot.

// maybeSnapshot takes a snapshot when enough entries were applied.
func (n *Node) maybeSnapshot() {
	if n.HaltError() != nil {
		return
	}
	if n.store.AppliedIndex() < n.logs.snapshotIndex()+n.cfg.SnapshotThreshold {
		return
	}
	if err := n.takeSnapshot(); err != nil {
		n.log.Warn("taking a snapshot failed; trying again later", "err", err)
	}
}

// snapshotNow has the apply thread take a snapshot now (tests, operators).
func (n *Node) snapshotNow() error {
	done := make(chan error, 1)
	n.applyq.put(applyJob{fn: n.takeSnapshot, done: done})
	select {
	case err := <-done:
		return err
	case <-n.closing:
		return ErrShutdown
	}
}

// takeSnapshot runs on the apply thread.
func (n *Node) takeSnapshot() error {
	start := time.Now()
	dir, applied, err := n.fsm.checkpoint()
	if err != nil {
		return err
	}
	if applied <= n.logs.snapshotIndex() {
		os.RemoveAll(dir)
		return nil
	}
	term, err := n.logs.Term(applied)
	if err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("snapshot at %d: the log has no term for it: %w", applied, err)
	}
	conf := n.logs.confRecord()
	sink, err := n.fsm.snaps.Create("", applied, term, conf.Conf, conf.Members)
	if err != nil {
		os.RemoveAll(dir)
		return err
	}
	if err := sink.adopt(dir, applied); err != nil {
		os.RemoveAll(dir)
		return errors.Join(err, sink.Cancel())
	}
	if err := sink.Close(); err != nil {
		return err
	}
	n.logs.setSnapshot(sink.meta.raftSnapshot())
	n.log.Info("took a snapshot", "id", sink.meta.ID, "took", time.Since(start).Round(time.Millisecond), "applied", applied, "bytes", sink.meta.Size)
	// Never past what raft has handed over: after a restart it hands the
	// log's entries to the state again from the log's start.
	if upTo := min(applied, n.raftApplied.Load()); upTo > n.cfg.TrailingLogs {
		if err := n.logs.compact(upTo - n.cfg.TrailingLogs); err != nil {
			return err
		}
	}
	return nil
}
