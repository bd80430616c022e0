package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// notifyApplied wakes everything waiting for the applied index to move.
func (n *Node) notifyApplied() {
	n.applyMu.Lock()
	close(n.applyCh)
	n.applyCh = make(chan struct{})
	n.applyMu.Unlock()
}

func (n *Node) appliedChanged() <-chan struct{} {
	n.applyMu.Lock()
	defer n.applyMu.Unlock()
	return n.applyCh
}

// waitApplied blocks until cond holds; cond is checked after every apply.
func (n *Node) waitApplied(ctx context.Context, cond func() bool) error {
	for {
		ch := n.appliedChanged()
		if cond() {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-n.closing:
			return ErrShutdown
		case <-n.halted:
			return n.HaltError()
		}
	}
}

// ReadBarrier returns once this node's state includes every write that was
// acknowledged before the call. The leader confirms it still leads and
// takes its commit index (a read index); a follower asks the leader for it
// over the raft port and waits until it has applied that far.
func (n *Node) ReadBarrier(ctx context.Context) error {
	bo := newBackoff()
	var lastErr error
	for {
		if n.closed.Load() {
			return ErrShutdown
		}
		if err := n.HaltError(); err != nil {
			return err
		}
		if n.IsLeader() {
			_, err := n.leaderReadIndex(ctx)
			if err == nil {
				return nil
			}
			lastErr = err
		} else if addr, id := n.raft.LeaderWithID(); addr != "" && string(id) != n.id {
			idx, err := n.rpc.readIndex(ctx, string(addr))
			if err == nil {
				return n.waitApplied(ctx, func() bool { return n.store.AppliedIndex() >= idx })
			}
			lastErr = err
		} else {
			lastErr = errors.New("no leader is known")
		}
		if !bo.wait(ctx, n.closing) {
			if n.closed.Load() {
				return ErrShutdown
			}
			return fmt.Errorf("%w: no leader confirmed the read before the deadline (last error: %v)", ErrNotLeader, lastErr)
		}
	}
}

// leaderReadIndex confirms leadership and waits until every committed entry
// is applied here. It returns the store's applied index then: every command
// committed before the call is at or below it (entries above it, up to the
// commit index, are raft's own no-op and barrier entries).
func (n *Node) leaderReadIndex(ctx context.Context) (uint64, error) {
	if !n.IsLeader() {
		return 0, ErrNotLeader
	}
	if err := n.raft.VerifyLeader().Error(); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrNotLeader, err)
	}
	want := n.raft.CommitIndex()
	applied := func() bool { return max(n.store.AppliedIndex(), n.floor.Load()) >= want }
	// Commands committed up to want are applied within moments. Entries
	// that never reach the store (raft's no-op, barrier and configuration
	// entries) can keep the store's index below want; if it has not moved
	// shortly, a barrier, applied after everything before it, shows that
	// every entry up to want is applied.
	wctx, cancel := context.WithTimeout(ctx, readSettle)
	err := n.waitApplied(wctx, applied)
	cancel()
	if err == nil {
		return n.store.AppliedIndex(), nil
	}
	if ctx.Err() != nil || errors.Is(err, ErrShutdown) {
		return 0, err
	}
	timeout := 10 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	if err := n.wait(n.raft.Barrier(timeout)); err != nil {
		return 0, fmt.Errorf("%w: read barrier: %v", ErrNotLeader, err)
	}
	n.raiseFloor(want)
	return n.store.AppliedIndex(), nil
}

// readSettle is how long a linearizable read waits for the store to reach
// the commit index before it proves with a barrier that the rest are
// raft's own entries.
const readSettle = 20 * time.Millisecond

// raiseFloor raises the index below which every entry is known applied.
func (n *Node) raiseFloor(idx uint64) {
	for {
		cur := n.floor.Load()
		if idx <= cur || n.floor.CompareAndSwap(cur, idx) {
			return
		}
	}
}

// AppliedIndex is the log index of the last command applied on this node.
func (n *Node) AppliedIndex() uint64 { return n.store.AppliedIndex() }
