package cluster

import (
	etcdraft "go.etcd.io/raft/v3"

	"github.com/queen-mq/queen/internal/failpoint"
)

// The combining write path of a single member.
//
// A command submitted on the leader is queued for the ready loop
// (proposeQueued), which then proposes it, writes the log (appendHere),
// commits and applies it (applyHere), and answers it: each step after the
// queueing waits for the loop to be woken and scheduled, and the reply for
// the submitter to be woken in turn, which on a loaded machine costs more
// than the work. So a submitter on a single member that finds the loop
// idle (loopMu free) runs the loop's rounds itself, on its own goroutine,
// for everything queued: it proposes, writes, commits and applies, and
// only the submitters whose commands it carried are woken. Under
// FsyncAlways it then runs the sync round of what it wrote itself when no
// round is fsyncing (takeIdle), with loopMu released, so that the next
// submitter can drive the loop meanwhile.
//
// The rounds are the ready loop's own (the same code under the same lock),
// so every guarantee is the loop's: the same entries, writes, rounds and
// replies, in the same order. A leader change, a membership change or a
// snapshot met in a combined round is handled as the loop would handle it;
// after it the next submitter finds the fast path off (soleVoter, leader).

// Failpoints inside a combined round (tests/cluster).
const (
	fpCombineWritten = "combine-written" // the round wrote and applied, loopMu held, not yet synced
	fpCombineSyncing = "combine-syncing" // loopMu released, before the own sync round
)

// maxCombinedRounds bounds the rounds one submitter runs for others, so
// that its own latency stays bounded when the queue never empties; the
// loop takes over what is left.
const maxCombinedRounds = 8

// queue queues p for proposal; when this node is a single member leading
// and the loop is idle (loopMu free), it queues p without waking the loop
// and returns true with loopMu held: the caller then runs combine.
func (n *Node) queue(p *proposal) bool {
	if n.soleVoter.Load() && n.rstate.Load() == int32(etcdraft.StateLeader) && n.cfg.SnapshotInterval > 0 && n.loopMu.TryLock() {
		if !n.loopStopped {
			n.propq.putQuiet(p)
			return true
		}
		n.loopMu.Unlock()
	}
	n.propq.put(p)
	return false
}

// combine runs the ready loop's rounds on the caller's goroutine (loopMu
// held, queue) for p, the caller's proposal, and everything queued with
// it; it releases loopMu.
func (n *Node) combine(p *proposal) {
	n.combined = true
	n.combines.Add(1)
	for range maxCombinedRounds {
		if msgs := n.local.takeNow(); len(msgs) > 0 {
			for _, m := range msgs {
				if err := n.rn.Step(m); err != nil {
					n.log.Debug("raft refused a storage answer", "type", m.GetType().String(), "err", err)
				}
			}
			n.local.recycle(msgs)
		}
		n.proposeQueued()
		if !n.rn.HasReady() {
			break
		}
		n.handleReady(n.rn.Ready())
		if combineHook != nil {
			combineHook(n)
		}
		if done(p) && n.local.empty() {
			break
		}
	}
	failpoint.Hit(fpCombineWritten)
	n.combined = false
	// Work left for the loop, which no token may announce (queued quietly,
	// or its token taken by takeNow).
	if !n.local.empty() {
		n.local.poke()
	}
	if n.rn.HasReady() || !n.propq.empty() {
		n.propq.poke()
	}
	n.loopMu.Unlock()
	if n.fsync.uncovered() {
		failpoint.Hit(fpCombineSyncing)
		if n.fsync.takeIdle() {
			n.syncOwn()
		} else {
			n.fsync.demandOwn()
		}
	}
}

// combineHook, when set (tests), runs after each Ready handled in a
// combined round, loopMu held.
var combineHook func(n *Node)

func done(p *proposal) bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}
