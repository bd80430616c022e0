package cluster

import (
	"errors"
	"fmt"
	"os"
	"time"
)

// Each node snapshots its own state once SnapshotThreshold entries were
// applied since its last snapshot (checked every SnapshotInterval), or as
// soon as the entries applied since then hold more than SnapshotLogBytes,
// always on the apply thread, so the checkpoint is at an exact log index.
// It then drops the log before the snapshot but for TrailingLogs entries
// holding at most TrailingLogBytes. A follower that needs entries from
// before the log's start is sent the snapshot. Counting bytes as well
// bounds the log's disk, and the memory raft-wal keeps for each segment
// in the log (walchunk.go), whatever the entries' size.

// Defaults and bounds of the log's byte budgets (QUEEN_SNAPSHOT_LOG_BYTES,
// QUEEN_SNAPSHOT_TRAILING_BYTES).
const (
	DefaultSnapshotLogBytes = 256 << 20
	DefaultTrailingLogBytes = 64 << 20
	MinLogBytes             = 1 << 20
	MaxLogBytes             = 1 << 40
)

// snapshotRetry is how long a failed snapshot for the log's bytes waits
// before it is tried again.
const snapshotRetry = time.Second

// LogBytesSetting checks the value of a byte budget of the raft log: name
// is its setting, as the error names it.
func LogBytesSetting(name string, v int64) (uint64, error) {
	if v < MinLogBytes || v > MaxLogBytes {
		return 0, fmt.Errorf("%s = %d: want %d (1 MiB) to %d (1 TiB) bytes", name, v, int64(MinLogBytes), int64(MaxLogBytes))
	}
	return uint64(v), nil
}

// maybeSnapshot takes a snapshot when enough entries were applied, or
// enough bytes.
func (n *Node) maybeSnapshot() {
	if n.HaltError() != nil {
		return
	}
	if !n.snapshotDue(n.store.AppliedIndex()) {
		return
	}
	if _, err := n.takeSnapshot(); err != nil {
		n.snapRetry.Store(time.Now().Add(snapshotRetry).UnixNano())
		n.log.Warn("taking a snapshot failed; trying again later", "err", err)
	}
}

// snapshotDue reports whether the state applied through index is due for a
// snapshot: SnapshotThreshold entries or SnapshotLogBytes since the last.
func (n *Node) snapshotDue(index uint64) bool {
	return index >= n.logs.snapshotIndex()+n.cfg.SnapshotThreshold || n.logBytesDue(index)
}

// logBytesDue reports whether the entries applied through index since the
// last snapshot hold more than SnapshotLogBytes.
func (n *Node) logBytesDue(index uint64) bool {
	return n.logs.bytesBetween(n.logs.snapshotIndex(), index) > n.cfg.SnapshotLogBytes
}

// checkLogBytes is told each applied index (logStore.onApplied, on the
// apply thread or the ready loop): over the byte budget, it queues a
// snapshot for the apply thread, so the ready loop never takes one itself.
func (n *Node) checkLogBytes(index uint64) {
	if !n.logBytesDue(index) || time.Now().UnixNano() < n.snapRetry.Load() || !n.snapQueued.CompareAndSwap(false, true) {
		return
	}
	n.queueSnapshot()
}

// snapshotTick is the apply thread's periodic check (SnapshotInterval):
// when a snapshot is due and none is queued, it queues one.
func (n *Node) snapshotTick() {
	if n.HaltError() != nil || !n.snapshotDue(n.store.AppliedIndex()) || !n.snapQueued.CompareAndSwap(false, true) {
		return
	}
	n.queueSnapshot()
}

// queueSnapshot queues a snapshot for the apply thread after flushing the
// store's memtables on a goroutine of its own; the caller holds
// n.snapQueued. The checkpoint flushes before it links the store's files,
// and the apply waits for that flush, which for a memtable full of large
// payloads is most of the snapshot. Flushed beforehand while entries go
// on being applied, what the checkpoint still flushes is what was applied
// meanwhile (docs/design/durability.md, "Taking a snapshot").
func (n *Node) queueSnapshot() {
	n.snapWork.Add(1)
	go func() {
		defer n.snapWork.Done()
		if left, err := n.store.FlushMemtables(); err != nil {
			// The checkpoint flushes again and reports what fails.
			n.log.Debug("flushing before a snapshot failed", "err", err)
		} else {
			n.log.Debug("flushed before a snapshot", "left_bytes", left)
		}
		if n.preflushed != nil {
			n.preflushed()
		}
		select {
		case <-n.stopStorage:
			n.snapQueued.Store(false)
			return
		default:
		}
		n.applyQueued.Add(1)
		n.applyq.put(applyJob{fn: func() error {
			n.snapQueued.Store(false)
			n.maybeSnapshot()
			return nil
		}, done: make(chan error, 1)})
	}()
}

// snapshotNow has the apply thread take a snapshot now (tests, operators).
func (n *Node) snapshotNow() error {
	done := make(chan error, 1)
	n.applyQueued.Add(1)
	n.applyq.put(applyJob{fn: func() error {
		trimmed, err := n.takeSnapshot()
		if err != nil {
			return err
		}
		<-trimmed // the caller sees the log dropped too
		return nil
	}, done: done})
	select {
	case err := <-done:
		return err
	case <-n.closing:
		return ErrShutdown
	}
}

// closedTrim is the trim of a snapshot that took none.
var closedTrim = func() <-chan struct{} { c := make(chan struct{}); close(c); return c }()

// takeSnapshot runs on the apply thread. trimmed is closed once the older
// snapshots are removed and the log dropped behind the new one
// (trimAfterSnapshot).
func (n *Node) takeSnapshot() (trimmed <-chan struct{}, err error) {
	start := time.Now()
	dir, applied, err := n.fsm.checkpoint()
	if err != nil {
		return nil, err
	}
	if applied <= n.logs.snapshotIndex() {
		os.RemoveAll(dir)
		return closedTrim, nil
	}
	term, err := n.logs.Term(applied)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("snapshot at %d: the log has no term for it: %w", applied, err)
	}
	conf := n.logs.confRecord()
	sink, err := n.fsm.snaps.Create("", applied, term, conf.Conf, conf.Members)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := sink.adopt(dir, applied); err != nil {
		os.RemoveAll(dir)
		return nil, errors.Join(err, sink.Cancel())
	}
	if err := sink.closeKeep(); err != nil {
		return nil, err
	}
	n.logs.setSnapshot(sink.meta.raftSnapshot())
	n.log.Info("took a snapshot", "id", sink.meta.ID, "took", time.Since(start).Round(time.Millisecond), "applied", applied, "bytes", sink.meta.Size)
	// Never past what raft has handed over: after a restart it hands the
	// log's entries to the state again from the log's start.
	return n.trimAfterSnapshot(n.logs.compactPoint(min(applied, n.raftApplied.Load()), n.cfg.TrailingLogs, n.cfg.TrailingLogBytes)), nil
}

// trimAfterSnapshot removes the snapshots a new one replaces and drops the
// log through index through (0: none of it), on a goroutine of its own,
// one trim at a time; the returned channel is closed when it is done. Both
// delete files, and raft-wal's delete commits its own metadata with an
// fsync: on the apply thread they held every apply for longer than the
// checkpoint itself, more so as a run went on (docs/design/durability.md,
// "Taking a snapshot"). The snapshot is durable and raft knows it before
// either starts, so a crash in between leaves only files a later trim
// removes: raft-wal's own start is where the next compaction starts
// (logStore.compact), and every snapshot reaps all but the newest.
func (n *Node) trimAfterSnapshot(through uint64) <-chan struct{} {
	done := make(chan struct{})
	n.snapWork.Add(1)
	go func() {
		defer n.snapWork.Done()
		defer close(done)
		n.logTrim.Lock()
		defer n.logTrim.Unlock()
		n.fsm.snaps.reap()
		if through == 0 {
			return
		}
		if err := n.logs.compact(through); err != nil {
			n.log.Warn("dropping the raft log behind a snapshot failed; the next snapshot drops it", "through", through, "err", err)
		}
	}()
	return done
}
