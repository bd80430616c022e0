package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
)

// IsLeader reports whether this node leads and has applied its barrier.
func (n *Node) IsLeader() bool {
	return n.ready.Load() && n.raft.State() == raft.Leader && n.HaltError() == nil
}

// CanServe reports whether requests to this node can be served now: a
// leader that has applied its barrier, or a follower that heard from its
// leader recently and is a member (writes are forwarded there and reads
// confirmed there).
func (n *Node) CanServe() bool {
	if n.closed.Load() || n.HaltError() != nil {
		return false
	}
	switch n.raft.State() {
	case raft.Leader:
		return n.ready.Load()
	case raft.Follower:
		addr, id := n.raft.LeaderWithID()
		if addr == "" || string(id) == n.id {
			return false
		}
		// A node that is not (yet, or no longer) a member may still hear
		// from a leader replicating to its address.
		return time.Since(n.raft.LastContact()) < n.contactBound() && n.inConfiguration()
	default:
		return false
	}
}

// contactBound is how long a follower may go without hearing from its
// leader before it stops counting it as reachable.
func (n *Node) contactBound() time.Duration { return 2 * n.cfg.HeartbeatTimeout }

// LeaderAddr returns the raft address and id of the current leader.
func (n *Node) LeaderAddr() (string, string) {
	a, id := n.raft.LeaderWithID()
	return string(a), string(id)
}

// watchLeadership applies a barrier whenever this node becomes leader, so it
// serves only once every entry of earlier terms is applied.
func (n *Node) watchLeadership() {
	defer n.wg.Done()
	ch := n.raft.LeaderCh()
	for {
		select {
		case <-n.closing:
			return
		case isLeader := <-ch:
			n.ready.Store(false)
			if !isLeader {
				// Replication to followers has stopped; a pipelined send
				// stuck on a silent follower would otherwise stay blocked
				// (see trackedTransport).
				n.transport.closePipelines()
				continue
			}
			for {
				err := n.wait(n.raft.Barrier(10 * time.Second))
				if err == nil {
					// No command is proposed here before ready is set, so
					// the entries committed by now past the barrier's
					// predecessors are raft's own (the barrier itself, a
					// configuration): none reaches the store. (raft's
					// applied index may not count the barrier yet.)
					n.raiseFloor(max(n.raft.AppliedIndex(), n.raft.CommitIndex()))
					n.ready.Store(true)
					n.notifyApplied()
					n.log.Info("leading", "term", n.raft.CurrentTerm())
					break
				}
				if n.raft.State() != raft.Leader || n.closed.Load() {
					break
				}
				n.log.Warn("leader barrier failed; retrying", "err", err)
			}
		}
	}
}

// WaitLeader blocks until some node leads (this one or another), or ctx ends.
func (n *Node) WaitLeader(ctx context.Context) error {
	for {
		if n.IsLeader() {
			return nil
		}
		if a, _ := n.LeaderAddr(); a != "" && n.raft.State() != raft.Leader {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for a leader: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
