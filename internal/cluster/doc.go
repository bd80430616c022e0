// Package cluster owns replication: an etcd raft node (go.etcd.io/raft/v3)
// driven by this package's own loop, its log (raft-wal behind raft's
// Storage interface) and snapshots (streamed Pebble checkpoints), the state
// machine over internal/state, group commit of concurrent commands into one
// log entry, leadership, linearizable reads, forwarding, and membership.
// Nothing outside this package sees raft's types.
//
// A single node is a cluster of one voter; there is no separate code path.
//
// Files:
//   - node.go: Config, Node, Open (wiring the store, the raft log, the
//     transport and raft) and Close (which hands leadership over).
//   - loop.go: the ready loop, the append thread (log writes and their
//     fsyncs, then raft's answers) and the apply thread (committed entries
//     to the state, answers to the proposers by request id).
//   - raftstore.go: raft's Storage over raft-wal, the persisted term and
//     vote, the membership; a data directory of hashicorp/raft is refused.
//   - walrecord.go: raft-wal's record type.
//   - mailbox.go: the unbounded queues between the three goroutines.
//   - transport.go: raft messages between nodes over the node port, and
//     snapshots sent as their files after a MsgSnap.
//   - conf.go: membership changes (ProposeConfChange; non-voters are
//     learners) and the table of members' ids and addresses.
//   - snapshot.go: when a node snapshots its state and compacts its log.
//   - submit.go: the write path: Submit (local group commit, or forwarding
//     to the leader, retried across leader changes), the ready loop's
//     proposing of every command queued since its last round as one entry,
//     the early wake of long-polls, and handing out results.
//   - read.go: the read path: ReadBarrier (raft's read index) and waiting
//     for an index to be applied.
//   - leadership.go: IsLeader (once an entry of the leader's term is
//     applied), CanServe, LeaderAddr, WaitLeader.
//   - backoff.go: the pacing of retries.
//   - mux.go: one TCP port for raft and the node RPC, told apart by the
//     first byte of each connection.
//   - rpc.go: the node RPC (gob): forwarded commands and their results,
//     read index, status, join and remove.
//   - dedup.go: request ids in every log entry, so that a command retried
//     after an unknown outcome is applied once.
//   - membership.go: join (also QUEEN_JOIN's loop), remove, cluster status.
//   - fsm.go: applying entries to the state store; checkpoints and restore.
//   - snapstore.go: the snapshot store: a snapshot is a Pebble checkpoint
//     directory (hard links, nothing copied), sent to followers as a stream
//     of its files.
//   - install.go: the crash-safe swap of a restored state directory, and
//     the checks at open that finish or roll back an interrupted install
//     and bring a store that is behind its newest snapshot up to it.
//   - fsyncpolicy.go, synced.go: QUEEN_FSYNC (always, interval, the
//     lease-only rule, the leader's own appends) on the raft-wal log;
//     WaitSynced.
//   - syncrounds.go, syncturn.go: the syncer's rounds, two at once, and
//     who runs them.
//   - spareseg.go: under always, new log segments from spares written with
//     zeros ahead.
//   - replies.go: under always, replies that need durability wait for the
//     leader's fsync of their entry, parked beside the apply thread.
//   - halt.go: the node stops when its store cannot apply the log, or its
//     log cannot be written.
//   - disk.go: writes are refused (insufficient_storage) while the data
//     directory's disk is below its reserve of free space.
//
// docs/design/durability.md has the rules of the last five.
package cluster
