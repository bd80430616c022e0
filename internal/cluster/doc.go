// Package cluster owns replication: the hashicorp/raft node, its log store
// (raft-wal) and snapshots (streamed Pebble checkpoints), the finite state
// machine adapter over internal/state, group commit of concurrent commands into
// one log entry, leadership, linearizable reads, forwarding, and membership.
//
// A single node is a cluster of one voter; there is no separate code path.
//
// Files:
//   - node.go: Config, Node, Open (wiring the store, the raft log, the
//     transport and raft) and Close (which hands leadership over).
//   - submit.go: the write path: Submit (local group commit, or forwarding
//     to the leader, retried across leader changes), the propose loop that
//     groups concurrent commands into one entry, and handing out results.
//   - read.go: the read path: ReadBarrier (read index), the applied-index
//     floor and waiting for an index to be applied.
//   - leadership.go: IsLeader, CanServe, the leader's barrier on taking
//     office, WaitLeader.
//   - backoff.go: the pacing of retries.
//   - mux.go: one TCP port for raft and the node RPC, told apart by the
//     first byte of each connection.
//   - rpc.go: the node RPC (gob): forwarded commands and their results,
//     read index, status, join and remove.
//   - dedup.go: request ids in every log entry, so that a command retried
//     after an unknown outcome is applied once.
//   - membership.go: join (also QUEEN_JOIN's loop), remove, cluster status.
//   - fsm.go: the raft FSM over the state store; snapshots and restore.
//   - snapstore.go: raft's snapshot store: a snapshot is a Pebble checkpoint
//     directory (hard links, nothing copied), sent to followers as a stream
//     of its files.
//   - install.go: the crash-safe swap of a restored state directory, and
//     the checks at open that finish or roll back an interrupted install
//     and bring a store that is behind its newest snapshot up to it.
//   - halt.go: the node stops when its store cannot apply the log.
//   - disk.go: writes are refused (insufficient_storage) while the data
//     directory's disk is below its reserve of free space.
//
// docs/design/durability.md has the rules of the last three.
package cluster
