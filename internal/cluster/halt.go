package cluster

import (
	"errors"
	"fmt"
)

// ErrStopped is returned by a node that stopped applying the log: its
// store met a storage error or an entry it cannot read (state.ApplyError
// says which, and what to do). It serves nothing more; the process should
// exit (cmd/queen does), and a restart applies the entry again.
var ErrStopped = errors.New("this node stopped applying the log")

// halt stops the node after its state machine failed, or when the log
// would cut entries the state already applied (syncedLog.checkCut). It is
// called from the state machine's goroutine or raft's; it acts once, and
// everything waiting on the node is woken.
func (n *Node) halt(err error) {
	n.haltOnce.Do(func() {
		e := fmt.Errorf("%w: %w", ErrStopped, err)
		n.haltErr.Store(&e)
		n.log.Error("this node stopped: it cannot apply the replicated log; it refuses reads and writes, and the process should be restarted once the cause is fixed", "err", err)
		close(n.halted)
		n.ready.Store(false)
	})
}

// Halted is closed once the node stopped applying the log.
func (n *Node) Halted() <-chan struct{} { return n.halted }

// HaltError is why the node stopped, or nil while it runs.
func (n *Node) HaltError() error {
	if e := n.haltErr.Load(); e != nil {
		return *e
	}
	return nil
}
