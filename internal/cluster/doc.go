// Package cluster owns replication: the hashicorp/raft node, its log store
// (raft-wal) and snapshots (streamed Pebble checkpoints), the finite state
// machine adapter over internal/state, group commit of concurrent commands into
// one log entry, leadership, linearizable reads, and membership.
//
// A single node is a cluster of one voter; there is no separate code path.
package cluster
