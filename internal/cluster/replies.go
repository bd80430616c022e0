package cluster

import (
	"fmt"
	"sync"

	"github.com/queen-mq/queen/internal/state"
)

// Under FsyncAlways the leader counts its own append towards the quorum
// once it is written to the OS (Node.ownAppend), so an entry may be
// committed and applied before it is on the leader's disk. A reply that
// promises durability then waits until the leader's log is synced through
// the reply's entry: with the followers that counted (each fsyncs before it
// answers), a majority has it on disk. The apply thread does not wait: it
// parks the reply here, and the syncer releases it.
//
// Which replies wait: every command but a pop that leases (not autoAck),
// whose loss in a power cut is the same event as its lease expiring
// (docs/design/leases.md).

// durableReply is the answer of an applied command whose entry is at index.
type durableReply struct {
	index uint64
	p     *proposal
	r     result
}

// durableReplies holds the answers waiting for the leader's fsync, in the
// order of their entries (the apply order).
type durableReplies struct {
	synced func() uint64 // the log is on disk through this index
	mu     sync.Mutex
	list   []durableReply
	err    error // set once an fsync failed: nothing more is answered OK
}

// needsSync reports whether the answer of cmd must wait for the leader's
// log to be on disk through its entry (FsyncAlways).
func (n *Node) needsSync(cmd state.Command) bool {
	if n.fsync.mode != FsyncAlways {
		return false
	}
	p, ok := cmd.(*state.Pop)
	return !ok || p.AutoAck
}

// add answers each reply whose entry is synced, and parks the others.
func (d *durableReplies) add(rs []durableReply) {
	if len(rs) == 0 {
		return
	}
	var now []durableReply
	d.mu.Lock()
	if d.err != nil {
		for i := range rs {
			rs[i].r = result{err: d.err, oc: outFinal}
		}
		now = rs
	} else {
		synced := d.synced()
		for _, r := range rs {
			if r.index <= synced {
				now = append(now, r)
			} else {
				d.list = append(d.list, r)
			}
		}
	}
	d.mu.Unlock()
	for _, r := range now {
		r.p.finish(r.r)
	}
}

// release answers the parked replies whose entries are now synced.
func (d *durableReplies) release() {
	d.mu.Lock()
	if d.err != nil || len(d.list) == 0 {
		d.mu.Unlock()
		return
	}
	synced := d.synced()
	k := 0
	for k < len(d.list) && d.list[k].index <= synced {
		k++
	}
	now := d.list[:k:k]
	d.list = d.list[k:]
	if len(d.list) == 0 {
		d.list = nil
	}
	d.mu.Unlock()
	for _, r := range now {
		r.p.finish(r.r)
	}
}

// parked is how many replies wait.
func (d *durableReplies) parked() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.list)
}

// fail answers every parked reply, and every later one, with err: an
// fsync failed, and what it should have made durable may not be on disk.
func (d *durableReplies) fail(err error) {
	d.mu.Lock()
	if d.err == nil {
		d.err = err
	}
	now := d.list
	d.list = nil
	d.mu.Unlock()
	for _, r := range now {
		r.p.finish(result{err: err, oc: outFinal})
	}
}

// fsyncFailed stops the node after a failed fsync of its log and fails the
// replies waiting for one.
func (n *Node) fsyncFailed(err error) {
	n.halt(fmt.Errorf("fsync the raft log: %w", err))
	n.replies.fail(n.HaltError())
}
