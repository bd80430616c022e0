package cluster

import (
	"context"
	"fmt"
	"time"

	etcdraft "go.etcd.io/raft/v3"
)

// IsLeader reports whether this node leads and has applied an entry of its
// own term (raft's empty entry at each new term), so that every entry of
// earlier terms is applied here.
func (n *Node) IsLeader() bool {
	return n.ready.Load() && n.rstate.Load() == int32(etcdraft.StateLeader) && n.HaltError() == nil
}

// CanServe reports whether requests to this node can be served now: a
// leader that has applied an entry of its term, or a follower that heard
// from its leader recently and is a member (writes are forwarded there and
// reads confirmed there).
func (n *Node) CanServe() bool {
	if n.closed.Load() || n.HaltError() != nil {
		return false
	}
	switch etcdraft.StateType(n.rstate.Load()) {
	case etcdraft.StateLeader:
		return n.ready.Load()
	case etcdraft.StateFollower:
		addr, id := n.LeaderAddr()
		if addr == "" || id == n.id {
			return false
		}
		// A node that is not (yet, or no longer) a member may still hear
		// from a leader replicating to its address.
		return time.Since(n.lastContactTime()) < n.contactBound() && n.inConfiguration()
	default:
		return false
	}
}

func (n *Node) lastContactTime() time.Time {
	ns := n.lastContact.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// contactBound is how long a follower may go without hearing from its
// leader before it stops counting it as reachable.
func (n *Node) contactBound() time.Duration { return 2 * n.cfg.HeartbeatTimeout }

// LeaderAddr returns the raft address and id of the current leader.
func (n *Node) LeaderAddr() (string, string) {
	lead := n.leadID.Load()
	if lead == 0 {
		return "", ""
	}
	if lead == n.rid {
		return n.cfg.Advertise, n.id
	}
	m, ok := n.memberAddr(lead)
	if !ok {
		return "", ""
	}
	return m.Addr, m.ID
}

// WaitLeader blocks until some node leads (this one or another), or ctx ends.
func (n *Node) WaitLeader(ctx context.Context) error {
	for {
		if n.IsLeader() {
			return nil
		}
		if a, _ := n.LeaderAddr(); a != "" && n.rstate.Load() != int32(etcdraft.StateLeader) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for a leader: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
