package broker

import (
	"context"
	"errors"

	"github.com/queen-mq/queen/internal/cluster"
)

// The cluster as the API shows it: this node's health, its view of the
// members, the cluster's status as every member reports it, and membership
// changes. The HTTP layer reads these and never the replication node.

// ClusterStatus is the cluster as this node sees it, with each member's
// own report (asked over the node port).
type ClusterStatus = cluster.ClusterStatus

// Health is whether this node can serve requests now.
type Health struct {
	Node string
	// Leader: this node leads and has applied every earlier term's entries.
	Leader bool
	// Ready: a leader that has applied an entry of its term, or a follower in touch
	// with its leader (writes are forwarded there and reads confirmed there).
	Ready bool
	// Halted is why the node's state machine stopped; nil while it runs.
	Halted error
}

// NodeID is this node's id in the cluster.
func (b *Broker) NodeID() string { return b.node.ID() }

// Halted is closed once this node's state machine stopped applying the log
// (a storage error, or an entry of a newer version); HaltError says why.
func (b *Broker) Halted() <-chan struct{} { return b.node.Halted() }

// HaltError is why the node's state machine stopped; nil while it runs.
func (b *Broker) HaltError() error { return b.node.HaltError() }

// MemoryBudget is the Pebble block cache and memtable size the store was
// opened with.
func (b *Broker) MemoryBudget() (cacheBytes, memTableBytes int64) {
	return b.node.Store().MemoryBudget()
}

// Health reports this node's role and whether it can serve.
func (b *Broker) Health() Health {
	n := b.node
	return Health{Node: n.ID(), Leader: n.IsLeader(), Ready: n.CanServe(), Halted: n.HaltError()}
}

// NodeInfo is this node's view of the cluster, without asking the members.
type NodeInfo struct {
	Node          string
	Leader        bool // this node leads
	LeaderID      string
	LeaderAddress string
	Term          uint64
	CommitIndex   uint64
	// Members of the raft configuration; empty when it cannot be read.
	Members []MemberInfo
}

// MemberInfo is a server of the configuration.
type MemberInfo struct {
	ID, Address string
	Suffrage    string // Voter, Nonvoter
}

// NodeInfo reports this node's view of the cluster (no network).
func (b *Broker) NodeInfo() NodeInfo {
	n := b.node
	addr, id := n.LeaderAddr()
	out := NodeInfo{Node: n.ID(), Leader: n.IsLeader(), LeaderID: id, LeaderAddress: addr,
		Term: n.Term(), CommitIndex: n.CommitIndex()}
	for _, srv := range n.Members() {
		out.Members = append(out.Members, MemberInfo{ID: srv.ID, Address: srv.Address, Suffrage: srv.Suffrage})
	}
	return out
}

// Cluster reports the members, the leader and each member's own status;
// members that do not answer in time are marked unreachable. checksum asks
// each member for its state's checksum (it reads the whole store).
func (b *Broker) Cluster(ctx context.Context, checksum bool) ClusterStatus {
	return b.node.Cluster(ctx, checksum)
}

// JoinMember adds a voter (through the leader, wherever it is). The node
// must answer on its node port under that id first; it is promoted once it
// has caught up. A refusal (a bad id, the node unreachable, a join still
// pending) is an *Error; anything else failed on the way.
func (b *Broker) JoinMember(ctx context.Context, id, addr string) error {
	return refusal(b.node.Join(ctx, id, addr))
}

// RemoveMember removes a member (through the leader). A refusal (no such
// member, the last member) is an *Error; anything else failed on the way.
func (b *Broker) RemoveMember(ctx context.Context, id string) error {
	return refusal(b.node.RemoveMember(ctx, id))
}

// refusal turns a refusal of the cluster layer into an *Error and leaves
// other errors as they are.
func refusal(err error) error {
	var ce *cluster.Error
	if errors.As(err, &ce) {
		return &Error{Code: ce.Code, Message: ce.Message}
	}
	return err
}
