package cluster

// The sync round of the leader's own appends, run by the append thread.
//
// Under FsyncAlways the leader's own appends are written without their
// fsync (ownAppend), and their durable replies wait for a round of the
// syncer (replies.go). Asked of a worker, that round first waits for the
// worker to be woken and scheduled. So when no lane is fsyncing, the
// append thread that wrote the appends runs their round itself, once it
// has handed on the appends' answers and released the log (appendTurn).
//
// The append thread must not wait for the disk meanwhile: followers'
// appends, the leader's next writes and leases that need no fsync go on
// during the fsync. So before the round it hands the thread on to a new
// goroutine (a new turn), which takes the next appends at once, and ends
// with the round. A write during that round finds a lane fsyncing and asks
// a worker, whose round starts beside it (syncrounds.go), as before.
//
// The ready loop, which writes the leader's own appends itself on a
// single member (appendHere), keeps asking a worker at once: it steps the
// answers and applies, and a round it ran itself, even on a goroutine it
// handed the loop off to, measured no better (docs/benchmarks.md).

// syncOwn runs the round on the lane takeIdle took. A failed fsync stops
// the node (onFail) and fails the parked replies.
func (n *Node) syncOwn() {
	n.fsync.roundTaken()
}

// demandOwn asks a worker for the round of the leader's own appends that
// no round begun since covers.
func (s *logSyncer) demandOwn() {
	if s.uncovered() {
		select {
		case s.kickOwn <- struct{}{}:
		default:
		}
	}
}
