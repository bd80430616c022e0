package cluster

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	etcdraft "go.etcd.io/raft/v3"
)

// notifyApplied wakes everything waiting for the applied index to move.
// A channel nobody took is kept: most applies have no waiter.
func (n *Node) notifyApplied() {
	n.applyMu.Lock()
	if n.applyTaken {
		close(n.applyCh)
		n.applyCh = make(chan struct{})
		n.applyTaken = false
	}
	n.applyMu.Unlock()
}

func (n *Node) appliedChanged() <-chan struct{} {
	n.applyMu.Lock()
	defer n.applyMu.Unlock()
	n.applyTaken = true
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
		} else if addr, id := n.LeaderAddr(); addr != "" && id != n.id {
			idx, err := n.rpc.readIndex(ctx, addr)
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

// leaderReadIndex confirms leadership with raft's read index (a round of
// heartbeats answered by a majority) and waits until every entry committed
// before it is applied here. It returns the store's applied index then:
// every command committed before the call is at or below it.
func (n *Node) leaderReadIndex(ctx context.Context) (uint64, error) {
	if !n.IsLeader() {
		return 0, ErrNotLeader
	}
	var rctx [16]byte
	rand.Read(rctx[:])
	ch := make(chan uint64, 1)
	select {
	case n.funcs <- func(rn *etcdraft.RawNode) {
		n.reads[string(rctx[:])] = ch
		rn.ReadIndex(rctx[:])
	}:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-n.closing:
		return 0, ErrShutdown
	}
	var want uint64
	select {
	case idx, ok := <-ch:
		if !ok {
			return 0, fmt.Errorf("%w: leadership changed before the read was confirmed", ErrNotLeader)
		}
		want = idx
	case <-ctx.Done():
		n.forgetRead(rctx[:])
		return 0, fmt.Errorf("%w: the read was not confirmed by a majority: %v", ErrNotLeader, ctx.Err())
	case <-n.closing:
		return 0, ErrShutdown
	case <-n.halted:
		return 0, n.HaltError()
	}
	if err := n.waitApplied(ctx, func() bool { return n.store.AppliedIndex() >= want }); err != nil {
		return 0, err
	}
	return n.store.AppliedIndex(), nil
}

func (n *Node) forgetRead(rctx []byte) {
	select {
	case n.funcs <- func(*etcdraft.RawNode) { delete(n.reads, string(rctx)) }:
	case <-n.loopDone:
	}
}

// AppliedIndex is the log index of the last command applied on this node.
func (n *Node) AppliedIndex() uint64 { return n.store.AppliedIndex() }
